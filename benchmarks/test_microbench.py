"""Nightly microbenchmarks (pytest-benchmark). Not part of `make test` (testpaths = tests).

Run by the `snakemake nightly` target (rule nightly_microbench): pytest-benchmark writes a JSON file,
`superoffload nightly record --pytest-benchmark` appends it to the history as the `microbench` suite and
`superoffload nightly check --suite microbench` judges it, gated apart from the training cases
(docs/nightly.md).
"""

from __future__ import annotations

import pytest
import torch

NUMEL = 1 << 20  # 1M fp32 parameters: ~28 MB of Adam traffic per step


def _params():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(NUMEL))
    p.grad = torch.randn(NUMEL) * 1e-2
    return p


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_torch_adamw_step(benchmark):
    p = _params()
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, foreach=False)
    benchmark(opt.step)


def test_grace_adam_step(benchmark):
    grace_adam = pytest.importorskip("grace_adam")
    p = _params()
    try:
        opt = grace_adam.GraceAdam([p], lr=1e-3, weight_decay=0.1)
    except Exception as e:  # noqa: BLE001 - the kernel is optional here
        pytest.skip(f"GraceAdam unavailable: {e}")
    benchmark(opt.step)


def test_cast_fp32_to_bf16(benchmark):
    x = torch.randn(4 * NUMEL)
    benchmark(lambda: x.to(torch.bfloat16))


def test_cast_bf16_to_fp32(benchmark):
    x = torch.randn(4 * NUMEL).to(torch.bfloat16)
    benchmark(lambda: x.to(torch.float32))
