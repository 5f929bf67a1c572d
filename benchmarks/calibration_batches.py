"""Why `superoffload calibrate` trains its degenerate model on changing batches: per-step times of the same
system on one fixed batch and on the calibration's cycle of batches, side by side in one run.

    python benchmarks/calibration_batches.py [--system superoffload --width 2048 --steps 30 --threads 1]

On one fixed batch the degenerate LM (superoffload.calibrate.systems.DegenerateLM) memorizes it within a
few steps; its gradients shrink towards zero and Adam's moments sink into fp32 subnormals, which x86 cores
process many times slower, so the step time grows from step to step and the per-parameter slope the
calibration fits comes out too high. On the cycle of batches (`_batches`) the step stays flat. Prints each
step's time for both and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch


def step_times(system: str, width: int, steps: int, fixed: bool) -> list[float]:
    from superoffload.calibrate import systems as cal
    from superoffload.harness.system import Batch, RunConfig
    from superoffload.harness.systems import create_system
    from superoffload.shapes import ModelShape

    blocks, per_block, bucket = cal.WIDE
    torch.manual_seed(0)
    model = cal.DegenerateLM(blocks, per_block, width)
    shape = ModelShape(name="degenerate", layers=blocks, hidden=width, heads=1, vocab=cal.VOCAB,
                       ffn_hidden=width, max_seq=cal.SEQ)
    opts = {"plan": False, "bucket_size": bucket, "speculation": False} if system == "superoffload" else {}
    run = RunConfig(system=system, model="gpt-tiny", seq=cal.SEQ, batch=1, grad_clip=1.0, device="cpu",
                    threads=torch.get_num_threads(), system_options=opts)
    sysobj = create_system(system)
    sysobj.setup(model, shape, run)
    batches = [Batch([x], [y]) for x, y in cal._batches()]
    source = itertools.repeat(batches[0]) if fixed else itertools.cycle(batches)
    times = []
    try:
        for _ in range(steps + 3):  # 3 warm-up steps, as the calibration takes
            t0 = time.perf_counter()
            sysobj.step(next(source))
            times.append(time.perf_counter() - t0)
    finally:
        sysobj.teardown()
    return times[3:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--system", default="superoffload")
    ap.add_argument("--width", type=int, default=2048, help="the calibration's WIDE_B")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (the calibration's median takes 30)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    from superoffload.calibrate.threads import set_threads

    set_threads(a.threads)
    res = {name: step_times(a.system, a.width, a.steps, fixed) for name, fixed in (("fixed batch", True),
                                                                                    ("changing batches", False))}
    for name, ts in res.items():
        print(f"{name:17} ms/step: " + " ".join(f"{t * 1e3:.0f}" for t in ts))
        print(f"{'':17} first {ts[0] * 1e3:.0f}, last {ts[-1] * 1e3:.0f}, median {statistics.median(ts) * 1e3:.1f}")
    ratio = statistics.median(res["fixed batch"]) / statistics.median(res["changing batches"])
    print(f"median fixed / changing: {ratio:.2f}x")


if __name__ == "__main__":
    main()
