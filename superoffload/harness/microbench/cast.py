"""`superoffload bench cast`: where to cast, and what the host-device link delivers.

Measured on this machine, same process, for transfer sizes from 1 MB to 1 GB:
- link bandwidth: H2D and D2H, pinned and pageable host memory (the curve the planner's bucket size
  comes from);
- gradient path (device -> host), per bucket of low-precision gradients, as the engine moves them:
  `device_cast`: cast bf16 -> fp32 on the device into its staging buffer, fp32 D2H (4 B/elem on the link),
  vs `host_cast`: bf16 D2H (2 B/elem) into the landing buffer, which the host kernel reads as it is (no
  cast pass: GraceAdam widens it in registers);
- parameter path (host -> device), per bucket of new weights:
  `host_cast`: bf16 H2D of the copy GraceAdam wrote in its step pass (no cast pass), vs
  `device_cast`: fp32 H2D (4 B/elem) into a device staging buffer, cast on the device.
The casts the `host_cast` policy folds into the host kernel cost its pass 2 B/elem less to read (gradients)
and 2 more to write (weights); `bench adam` measures the kernel. Until 2026-12-05 both `host_cast` rows
timed a separate host cast the engine does not run.
Without CUDA the "device" is the CPU: transfers are memcpys between host buffers and pinned memory
does not exist (recorded as such); the numbers then describe the host, not a link.
The output is one JSON file following superoffload/harness/cast_bench.schema.json, validated before it
is written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from superoffload.device import Device, get_device
from superoffload.harness import provenance
from superoffload.harness.record import write_result
from superoffload.harness.stats import summarize

DEFAULT_SIZES = "1M,4M,16M,64M,256M,1G"


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}; use e.g. 1M, 64M, 1G") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is below 4 bytes")
    return value


def _timed(dev: Device, fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    fn()  # warm-up: first-touch, allocator, kernel selection
    dev.synchronize()
    times = []
    for _ in range(repeats):
        dev.synchronize()
        t0 = time.perf_counter()
        fn()
        dev.synchronize()
        times.append(time.perf_counter() - t0)
    return summarize(times)


def _measure_size(dev: Device, n: int, repeats: int, lowp: torch.dtype) -> tuple[list, list, list]:
    """Link rows, gradient-path rows and parameter-path rows for an n-element fp32 bucket."""
    d = dev.torch_device
    dev_f32 = torch.randn(n, device=d)
    dev_lp = dev_f32.to(lowp)
    link = []
    for memory in (["pinned", "pageable"] if dev.is_cuda else ["pageable"]):
        host = torch.empty(n, pin_memory=memory == "pinned")
        for direction, fn in (("h2d", lambda h=host: dev_f32.copy_(h, non_blocking=True)),
                              ("d2h", lambda h=host: h.copy_(dev_f32, non_blocking=True))):
            s = _timed(dev, fn, repeats)
            link.append({"size_bytes": n * 4, "direction": direction, "memory": memory,
                         "median_s": s["median_s"], "iqr_s": s["iqr_s"], "gbps": n * 4 / s["median_s"] / 1e9})
    host_f32 = dev.empty_host(n, torch.float32)
    host_lp = dev.empty_host(n, lowp)
    dev_stage = torch.empty(n, device=d)  # the engine's fp32 staging buffer on the device

    def grad_device_cast() -> None:
        dev_stage.copy_(dev_lp)  # the cast, on the device
        host_f32.copy_(dev_stage, non_blocking=True)

    def grad_host_cast() -> None:
        host_lp.copy_(dev_lp, non_blocking=True)  # the host kernel reads these bf16 bytes as they land

    def param_host_cast() -> None:
        dev_lp.copy_(host_lp, non_blocking=True)  # GraceAdam wrote host_lp in its step pass

    def param_device_cast() -> None:
        dev_stage.copy_(host_f32, non_blocking=True)  # fp32 over the link
        dev_lp.copy_(dev_stage)  # the cast, on the device

    paths = []
    for path, variants in (("grad", {"device_cast": grad_device_cast, "host_cast": grad_host_cast}),
                           ("param", {"host_cast": param_host_cast, "device_cast": param_device_cast})):
        timings = {k: _timed(dev, fn, repeats) for k, fn in variants.items()}
        rows = [{"size_bytes": n * 4, "path": path, "policy": policy, "median_s": s["median_s"],
                 "iqr_s": s["iqr_s"], "elems_per_s": n / s["median_s"]} for policy, s in timings.items()]
        for r in rows:
            r["device_cast_speedup"] = timings["host_cast"]["median_s"] / timings["device_cast"]["median_s"]
        paths.append(rows)
    return link, paths[0], paths[1]


def measure(sizes: list[int], repeats: int = 5, device: str = "auto", lowp: torch.dtype = torch.bfloat16
            ) -> dict[str, Any]:
    dev = get_device(device)
    link, grad_path, param_path = [], [], []
    for size in sizes:
        rows = _measure_size(dev, size // 4, repeats, lowp)  # size bytes of fp32 = size // 4 elements
        link += rows[0]
        grad_path += rows[1]
        param_path += rows[2]
    return {
        "kind": "cast_bench", "schema_version": 1, "device": dev.name(), "pinned_available": dev.is_cuda,
        "lowp": str(lowp).removeprefix("torch."), "repeats": repeats, "threads": torch.get_num_threads(),
        "link": link, "grad_path": grad_path, "param_path": param_path,
        "provenance": provenance.collect(dev.name()),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def format_table(rec: dict[str, Any]) -> str:
    pinned = "available" if rec["pinned_available"] else "n/a: no CUDA"
    lines = [f"link on {rec['device']} (pinned memory {pinned})",
             f"{'size':>8}  {'dir':4} {'memory':9} {'GB/s':>8}"]
    for r in rec["link"]:
        lines.append(f"{r['size_bytes'] / 2**20:>7.0f}M  {r['direction']:4} {r['memory']:9} {r['gbps']:>8.2f}")
    lines.append(f"\ncasting ({rec['lowp']}); time per bucket, ratio host_cast / device_cast")
    lines.append(f"{'size':>8}  {'path':5} {'device_cast ms':>15} {'host_cast ms':>13} {'ratio':>6}")
    for rows in (rec["grad_path"], rec["param_path"]):
        for i in range(0, len(rows), 2):
            a, b = rows[i], rows[i + 1]
            by = {a["policy"]: a, b["policy"]: b}
            lines.append(f"{a['size_bytes'] / 2**20:>7.0f}M  {a['path']:5} "
                         f"{1e3 * by['device_cast']['median_s']:>15.3f} {1e3 * by['host_cast']['median_s']:>13.3f} "
                         f"{by['host_cast']['median_s'] / by['device_cast']['median_s']:>6.2f}")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cast", help="casting policies and host-device link bandwidth vs transfer size",
                       description=__doc__.strip().splitlines()[0] + " Writes one JSON record.")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated fp32 bucket sizes in bytes, K/M/G suffixes (default {DEFAULT_SIZES})")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per point (median reported; default 5)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="default auto")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16", help="low precision (default bf16)")
    p.add_argument("--out", required=True, help="JSON record to write")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        print(f"superoffload bench cast: error: {e}", file=sys.stderr)
        return 2
    if args.repeats < 1 or not sizes:
        print("superoffload bench cast: error: need --repeats >= 1 and at least one size", file=sys.stderr)
        return 2
    rec = measure(sizes, args.repeats, args.device, torch.bfloat16 if args.dtype == "bf16" else torch.float16)
    write_result(args.out, rec, "cast_bench")
    print(format_table(rec))
    return 0
