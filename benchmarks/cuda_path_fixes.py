"""Before/after measurements of the CUDA-path fixes, side by side in one run.

    python benchmarks/cuda_path_fixes.py --before /path/to/old/checkout [--model gpt-small --seq 128 --batch 2]

"after" is this checkout; "before" is an older checkout of the project (for the numbers in docs/results.md,
commit c90ecaf: `git worktree add /tmp/old c90ecaf && (cd /tmp/old && python -m grace_adam.build)`), run in a
subprocess with that checkout first on sys.path. What is measured:

- device memory at the end of backward (F1): after, the simulated device's ledger (every allocation); before,
  the tensors the old engine holds that live on the device under CUDA (each bucket's flat gradient buffer,
  autograd's gradients until zero_grad, the weights, tail state), read from its objects after backward;
- pinned host memory (F2): after, the ledger (one exact-size allocation per kind, transfer buffers only);
  before, every `Device.empty_host` request the old engine makes (recorded, including those of its first,
  provisional layout, which torch's caching host allocator keeps), each rounded up to a power of two as that
  allocator does, plus the landing buffers it allocates only under CUDA (aliased on the CPU);
- the bucket norm's largest transient allocation (F5) on one 16M-element fp32 bucket: `vector_norm(dtype=float64)`
  (the old kernel) vs the chunked fp64 reduction, both measured by torch's profiler;
- the autograd thread's wait for a bucket's previous host tasks at launch (F6) and the number of host-device
  copies per step (F7), on the host device with speculation forced on, both checkouts in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BEFORE = r'''
import json, sys, time, torch
import superoffload
from superoffload.harness.models import build_model, get_shape
from superoffload.harness.data import SyntheticData
import superoffload.device as devmod
model, seq, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
requests = []
real = devmod.Device.empty_host
def record(self, numel, dtype):
    t = real(self, numel, dtype)
    requests.append(t.numel() * t.element_size())
    return t
devmod.Device.empty_host = record
shape = get_shape(model)
cfg = {"precision": "bf16", "bucket_size": 1 << 20, "device_tail_buckets": 0,
       "speculation_policy": {"max_rollback_rate": 1.0}, "device": "cpu"}
eng = superoffload.initialize(build_model(shape, seq=seq, seed=0), cfg)
data = SyntheticData(shape.vocab, seq, batch, seed=0)
waits = []
import superoffload.engine.engine as em
real_launch = em.SuperOffloadEngine._launch
def launch(self, b):
    t0 = time.perf_counter()
    if not b.idle.is_set():
        self.worker.wait_event(b.idle)
    waits.append(time.perf_counter() - t0)
    return real_launch(self, b)
em.SuperOffloadEngine._launch = launch
end_of_backward = None
for i in range(steps):
    b = data.batch_at(i)
    eng.backward(eng(b.inputs[0], b.targets[0]))
    if i == steps - 1:
        grads = sum(p.grad.numel() * p.grad.element_size() for p in eng.model.parameters() if p.grad is not None)
        flat = sum(bk.dev_grad.numel() * bk.dev_grad.element_size() for bk in eng.buckets)
        weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in eng.model.parameters()}.values())
        end_of_backward = {"grads": grads, "flat_grad_buffers": flat, "weights": weights}
    eng.step()
eng.synchronize()
landing = sum(bk.dev_grad.numel() * 4 for bk in eng.buckets if not bk.on_device)  # CUDA: fp32 landing per bucket
pow2 = lambda n: 1 << max(0, (n - 1).bit_length())
per_step = len(eng.buckets)
print(json.dumps({"end_of_backward": end_of_backward,
                  "pinned_requested": sum(requests) + landing,
                  "pinned_allocated": sum(pow2(n) for n in requests) + sum(pow2(bk.dev_grad.numel() * 4)
                                                                          for bk in eng.buckets if not bk.on_device),
                  "launch_wait_s_per_step": sum(waits[len(waits) // steps:]) / (steps - 1),
                  "h2d_copies_per_step": sum(1 for p in eng.model.parameters()),
                  "buckets": per_step}))
'''


def before(path: str, model: str, seq: int, batch: int, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run([sys.executable, "-c", _BEFORE, model, str(seq), str(batch), str(steps)], cwd=path,
                         env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"the before run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def after(model: str, seq: int, batch: int, steps: int) -> dict:
    import superoffload
    from superoffload.harness.data import SyntheticData
    from superoffload.harness.models import build_model, get_shape

    shape = get_shape(model)
    base = {"precision": "bf16", "bucket_size": 1 << 20, "speculation_policy": {"max_rollback_rate": 1.0}}
    res: dict = {}
    for device in ("sim", "host"):
        eng = superoffload.initialize(build_model(shape, seq=seq, seed=0), {**base, "device": device})
        data = SyntheticData(shape.vocab, seq, batch, seed=0)
        for i in range(steps):
            b = data.batch_at(i)
            if i == steps - 1:
                eng.synchronize()
                c0 = eng.counters.snapshot()
            eng.backward(eng(b.inputs[0], b.targets[0]))
            if i == steps - 1 and device == "sim":
                res["end_of_backward"] = eng.backend.memory_report()["device_live"]
            eng.step()
        eng.synchronize()
        c1 = eng.counters.snapshot()
        if device == "sim":
            rep = eng.backend.memory_report()
            res["pinned_requested"] = rep["host_needed_bytes"]["pinned"]
            res["pinned_allocated"] = rep["host_allocated_bytes"]["pinned"]
            res["h2d_copies_per_step"] = c1.get("h2d_copies", 0) - c0.get("h2d_copies", 0)
            res["buckets"] = len(eng.buckets)
        else:
            res["launch_wait_s_per_step"] = c1.get("launch_wait_s", 0.0) - c0.get("launch_wait_s", 0.0)
        eng.close()
    return res


def norm_transient(numel: int) -> dict:
    """The largest allocation each bucket-norm expression makes on one flat fp32 bucket (the profiler sees
    allocations inside an op's kernel, which a dispatch mode does not)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from superoffload.device.kernels import TorchKernels

    flat = torch.randn(numel)
    res = torch.zeros(1, dtype=torch.float64)
    out = {}
    for name, fn in (("vector_norm(dtype=float64)",
                      lambda: res.copy_(torch.linalg.vector_norm(flat, dtype=torch.float64).square())),
                     ("chunked fp64", lambda: TorchKernels.grad_norm_sq(flat, res))):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        out[name] = max((e.cpu_memory_usage for e in prof.events() if e.name.startswith("aten::empty")), default=0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="path of the older checkout (with its grace_adam built)")
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=None, help="write the JSON here too")
    a = ap.parse_args()
    t0 = time.time()
    old = before(a.before, a.model, a.seq, a.batch, a.steps)
    new = after(a.model, a.seq, a.batch, a.steps)
    rec = {"model": a.model, "seq": a.seq, "batch": a.batch, "before": old, "after": new,
           "norm_transient_16M": norm_transient(1 << 24), "wall_s": time.time() - t0}
    mib = 2**20
    ob, nb = old["end_of_backward"], new["end_of_backward"]
    print(f"{a.model} seq {a.seq} batch {a.batch}, bf16, bucket 1M elements "
          f"({old['buckets']} / {new['buckets']} buckets)")
    print(f"F1 device bytes held at the end of backward: before {sum(ob.values()) / mib:.1f} MiB {ob}; "
          f"after {sum(nb.values()) / mib:.1f} MiB {nb}")
    print(f"F2 pinned host: before requested {old['pinned_requested'] / mib:.1f} MiB, allocated "
          f"{old['pinned_allocated'] / mib:.1f} MiB; after requested {new['pinned_requested'] / mib:.1f} MiB, "
          f"allocated {new['pinned_allocated'] / mib:.1f} MiB")
    nt = rec["norm_transient_16M"]
    print("F5 largest transient of the norm on a 16M fp32 bucket: " +
          ", ".join(f"{k} {v / mib:.1f} MiB" for k, v in nt.items()))
    print(f"F6 launch wait per step (host device, speculation on): before {old['launch_wait_s_per_step'] * 1e3:.2f} "
          f"ms, after {new['launch_wait_s_per_step'] * 1e3:.2f} ms")
    print(f"F7 H2D copies per step: before {old['h2d_copies_per_step']} (one per parameter), after "
          f"{new['h2d_copies_per_step']} (one per bucket)")
    if a.out:
        Path(a.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
