"""Progress reporting: log lines every K steps without a terminal, a tqdm bar with one, warm-up steps
excluded from tokens/s and MFU; the LR schedule."""

from __future__ import annotations

import io

import torch

from superoffload.finetune.progress import Progress
from superoffload.finetune.schedule import WarmupCosine, make_scheduler, warmup_steps


def test_log_lines_every_k_steps_and_warmup_is_excluded():
    out = io.StringIO()
    p = Progress(total=6, start=0, tokens_per_step=1000, flops_per_token=1e6, peak_flops=1e10, warmup=2,
                 log_every=2, stream=out)
    for step, t in enumerate([5.0, 5.0, 0.5, 0.5, 0.25, 0.25], 1):
        p.update(step, loss=3.0 - step / 10, lr=1e-3, step_s=t)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("step 2/6: loss 2.8000")
    assert "(warm-up)" in lines[0]  # the two warm-up steps (5 s each) are not timed
    assert "tokens/s 2000, TFLOPS 0.002, MFU 20.0%" in lines[1]  # 1000 tokens / 0.5 s, 2e9 / 1e10
    assert "tokens/s 4000" in lines[2]


def test_tqdm_bar_on_a_terminal():
    out = io.StringIO()
    p = Progress(total=3, start=1, tokens_per_step=10, flops_per_token=1.0, peak_flops=1.0, warmup=0, stream=out,
                 bar=True)
    p.update(2, 1.0, 1e-3, 0.1)
    p.update(3, 0.9, 1e-3, 0.1)
    p.close()
    text = out.getvalue()
    assert "3/3" in text and "MFU" in text and "loss=0.9000" in text


def test_warmup_then_cosine():
    s = WarmupCosine(total=10, warmup=2, floor=0.1)
    assert [round(s(i), 4) for i in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert s(9) > 0.1 and abs(s(10) - 0.1) < 1e-12
    assert warmup_steps(100, 0.05) == 5 and warmup_steps(100, 0.05, 0) == 0
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = make_scheduler(opt, s)
    assert opt.param_groups[0]["lr"] == 1.0  # step 0: half of the base LR
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 2.0
