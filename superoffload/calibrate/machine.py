"""`superoffload calibrate`: measure this machine into a HardwareProfile.

With CUDA: H2D/D2H bandwidth vs size (pinned and pageable), bf16 matmul, causal SDPA, casts on both
sides, event-sync latency and host Adam. Without CUDA the "device" is the CPU itself: matmul runs on
the CPU, a memcpy stands for the link, the device memory budget is the host's RAM.

Every number is a best-of-N wall-clock measurement (best, because interference only ever slows a
run down). ``quick`` uses fewer sizes and smaller problems so it finishes in seconds.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from superoffload.calibrate import compute
from superoffload.calibrate.threads import set_threads
from superoffload.harness.noise import OTHERS_BOUND, NoiseSampler
from superoffload.harness.peak import gpu_peak_flops, store_cpu_peak
from superoffload.planner.hardware import (
    ADAM_BYTES_PER_PARAM,
    CAST_BYTES_PER_ELEM,
    GB,
    MB,
    Curve,
    HardwareProfile,
)
from superoffload.planner.overhead import CLIP_BYTES_PER_PARAM
from superoffload.planner.presets import ADAM_8B_SECONDS, ATTENTION_FACTOR, MATMUL_EFFICIENCY, physical_memory_bytes

# Ratios between host Adam kernels come from the authors' GraceAdam table (ADAM_8B_SECONDS, the 8B row the
# presets use), only for a kernel this machine cannot run; the profile's notes say which ones were derived.


def _best(fn: Callable[[], None], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()  # warm-up: allocator, kernels, page faults
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _matmul_flops(device: str, dtype: torch.dtype, n: int, repeats: int, sync: Callable[[], None]) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2.0 * n**3 / _best(lambda: torch.matmul(a, b), repeats, sync)


def _cold_matmul_flops(device: str, dtype: torch.dtype, n: int, repeats: int, sync: Callable[[], None],
                       pool_bytes: int) -> float:
    """FLOP/s of one n x n GEMM whose operands are not in cache: each call takes the next of a pool of
    operand pairs at least ``pool_bytes`` large. In training a GEMM's weights and activations were last
    touched a layer ago; a repeated call on the same operands (hot caches) flatters small GEMMs."""
    pairs = max(2, pool_bytes // (2 * n * n * torch.empty((), dtype=dtype).element_size()))
    a = [torch.randn(n, n, device=device, dtype=dtype) for _ in range(pairs)]
    b = [torch.randn(n, n, device=device, dtype=dtype) for _ in range(pairs)]
    torch.matmul(a[0], b[0])  # warm-up: kernels, thread pool
    sync()
    best = float("inf")
    for i in range(1, 1 + max(repeats, min(pairs - 1, 20))):
        j = i % pairs
        t0 = time.perf_counter()
        torch.matmul(a[j], b[j])
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / max(best, 1e-9)


def _matmul_curve(device: str, dtype: torch.dtype, quick: bool, sync: Callable[[], None],
                  pool_bytes: int = 64 * MB) -> Curve:
    """Achieved GFLOP/s of one square GEMM call vs its FLOPs, cold operands: small GEMMs run far below
    peak (and below their hot-cache rate)."""
    sizes = (64, 256, 1024) if quick else (32, 64, 128, 256, 512, 1024, 2048)
    flops, rates = [], []
    for n in sizes:
        f = 2.0 * n**3
        flops.append(int(f))
        rates.append(_cold_matmul_flops(device, dtype, n, 5 if n <= 256 else 3, sync, pool_bytes) / 1e9)
    return Curve(flops, rates)


def _elementwise_gbps(device: str, sync: Callable[[], None]) -> float:
    """Streaming rate of a binary elementwise op (read 2, write 1) on activation-sized tensors."""
    a, b = (torch.randn(1 << 22, device=device) for _ in range(2))
    out = torch.empty_like(a)
    return 3 * a.numel() * 4 / _best(lambda: torch.add(a, b, out=out), 5, sync) / GB


def _op_overhead(device: str, sync: Callable[[], None]) -> float:
    """Forward + backward dispatch cost of one tiny autograd op (what small models pay per layer op
    regardless of size): a chain of 100 adds on an 8-element tensor that requires grad."""
    x = torch.ones(8, device=device, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(100):
            y = y + 1.0
        y.sum().backward()

    return _best(chain, 5, sync) / 100


def launch_op_seconds(device: str, sync: Callable[[], None], ops: int = 200) -> float:
    """The training thread's time per device op that launches a kernel, outside autograd (what the
    SuperOffload engine's launch is made of; planner/overhead.py counts them): in-place adds on an
    8-element tensor, synchronized once per `ops`, so the device's queue absorbs them."""
    x = torch.zeros(8, device=device)

    def burst() -> None:
        for _ in range(ops):
            x.add_(1.0)

    return _best(burst, 5, sync) / ops


def device_call_seconds(sync: Callable[[], None], calls: int = 100) -> float:
    """A light CUDA call's training-thread time: an event record, a stream's wait on it and a switch to
    that stream and back, per call of the three (the engine's launch issues all three kinds)."""
    side = torch.cuda.Stream()
    events = [torch.cuda.Event() for _ in range(calls)]

    def burst() -> None:
        for ev in events:
            ev.record()
            side.wait_event(ev)
            with torch.cuda.stream(side):
                pass

    return _best(burst, 5, sync) / (3 * calls)


def _gelu_rate(device: str, sync: Callable[[], None], n: int = 1 << 20) -> float:
    """Elements/s of the MLP activation (tanh-GELU) forward + backward: on CPUs it is compute-bound
    (a tanh per element), far slower than the elementwise streaming rate."""
    x = torch.randn(n, device=device, requires_grad=True)
    g = torch.ones(n, device=device)

    def both() -> None:
        torch.nn.functional.gelu(x, approximate="tanh").backward(g)

    return n / _best(both, 5, sync)


def _module_call_s(device: str, sync: Callable[[], None], n: int = 200) -> float:
    """Python cost of one nn.Module call: a stack of nn.Identity (no op, no autograd node)."""
    x = torch.ones(8, device=device)
    mods = [torch.nn.Identity() for _ in range(n)]

    def stack() -> None:
        y = x
        for m in mods:
            y = m(y)

    return _best(stack, 5, sync) / n


def _optimizer_step_s(params: list[torch.nn.Parameter], grads: list[torch.Tensor],
                      sync: Callable[[], None]) -> float:
    """One torch training-loop optimizer step as the harness runs it: clip, fused AdamW, zero_grad."""
    try:
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(params, lr=1e-3)

    def step() -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g  # what backward's AccumulateGrad does after zero_grad(set_to_none=True)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _best(step, 7, sync)


def _optimizer_tensor_s(device: str, sync: Callable[[], None], tensors: int = 64, elems: int = 256) -> float:
    """Per-tensor cost of the optimizer step: ``tensors`` small tensors vs one tensor holding the same
    elements, so the byte work cancels and only the per-tensor loop (foreach lists, Python) is left."""
    def make(count: int, size: int) -> tuple[list[torch.nn.Parameter], list[torch.Tensor]]:
        ps = [torch.nn.Parameter(torch.randn(size, device=device)) for _ in range(count)]
        return ps, [torch.randn(size, device=device) * 1e-3 for _ in range(count)]

    many = _optimizer_step_s(*make(tensors, elems), sync)
    one = _optimizer_step_s(*make(1, tensors * elems), sync)
    return max(0.0, (many - one) / (tensors - 1))


def _clip_gbps(device: str, sync: Callable[[], None], n: int) -> float:
    """torch.nn.utils.clip_grad_norm_ on one large fp32 gradient, counted at 12 B/param."""
    p = torch.nn.Parameter(torch.zeros(n, device=device))
    p.grad = torch.randn(n, device=device)
    t = _best(lambda: torch.nn.utils.clip_grad_norm_([p], 1.0), 10, sync)
    return n * CLIP_BYTES_PER_PARAM / t / GB


def _overhead_fields(device: str, quick: bool, systems: bool, sync: Callable[[], None],
                     notes: list[str]) -> dict[str, Any]:
    """The framework-overhead fields (planner/overhead.py). The per-system step machinery takes tens
    of seconds (a subprocess per system), so ``quick`` leaves it out."""
    fields: dict[str, Any] = {
        "gelu_elems_per_s": _gelu_rate(device, sync), "module_call_s": _module_call_s(device, sync),
        "optimizer_tensor_s": _optimizer_tensor_s(device, sync),
        "clip_gbps": _clip_gbps(device, sync, 2**20 if quick else 2**23)}
    if systems and not quick:
        from superoffload.calibrate import systems as calibrate_systems

        fields["system_step_s"], sys_notes = calibrate_systems.measure(
            optimizer_tensor_s=fields["optimizer_tensor_s"])
        notes.extend(sys_notes)
    else:
        notes.append("system step machinery not measured (" + ("--quick" if quick else "--no-systems") + ")")
    return fields


def _attention_bwd_ratio(device: str, dtype: torch.dtype, sync: Callable[[], None]) -> float:
    """Backward / forward time of causal SDPA at a small-model shape (CPU kernels are far from 2x)."""
    shape = (2, 4, 512, 32) if device == "cpu" else (2, 16, 2048, 128)
    q, k, v = (torch.randn(*shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))

    def fwd() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    t_fwd = _best(lambda: fwd(), 3, sync)
    t_both = _best(lambda: fwd().sum().backward(), 3, sync)
    return max(0.5, (t_both - t_fwd) / t_fwd)


def _attention_curve(device: str, dtype: torch.dtype, quick: bool, sync: Callable[[], None]) -> Curve:
    """Achieved GFLOP/s of one causal SDPA forward vs its FLOPs (2·b·heads·s²·head_dim, the cost model's
    count): like GEMMs, short sequences run far below the large-kernel rate."""
    if device == "cpu":
        b, h, d, seqs = 1, 4, 64, ((64, 256, 1024) if quick else (64, 128, 256, 512, 1024))
    else:
        b, h, d, seqs = 2, 16, 128, ((256, 1024, 4096) if quick else (128, 256, 512, 1024, 2048, 4096))
    flops, rates = [], []
    for s in seqs:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype) for _ in range(3))
        f = 2.0 * b * h * s * s * d
        t = _best(lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                  5 if s <= 256 else 3, sync)
        flops.append(int(f))
        rates.append(f / t / 1e9)
    return Curve(flops, rates)


def _attention_factor(device: str, dtype: torch.dtype, quick: bool, matmul: float,
                      sync: Callable[[], None]) -> float:
    b, h, s, d = (1, 4, 512, 64) if device == "cpu" else ((2, 16, 2048, 128) if quick else (4, 32, 4096, 128))
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype) for _ in range(3))
    t = _best(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), 3, sync)
    flops = 4.0 * b * h * s * s * d / 2  # QKᵀ and AV, halved by the causal mask
    return min(1.0, flops / t / matmul)


def _adam_thread_rates(n: int, threads: int) -> dict[str, dict[str, float]]:
    """GraceAdam's and torch's fused AdamW's rates at 1, 2, 4, ... threads up to this process's usable CPUs
    (and that count itself), other than ``threads`` (the profile's own rate): a rank's host worker runs at the
    threads its share of the host gives it (costmodel.host_share). DeepSpeed's kernel takes its OpenMP threads
    from the environment when it loads, so it is measured at ``threads`` only. The thread counts are restored."""
    from superoffload.planner.presets import usable_cpus

    cpus = usable_cpus()
    counts = sorted({t for t in [2**i for i in range(8) if 2**i <= cpus] + [cpus] if t != threads})
    if not counts:
        return {}
    table: dict[str, dict[str, float]] = {}
    before = torch.get_num_threads()
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    try:
        opt = torch.optim.AdamW([p], lr=1e-3, fused=True)
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW([p], lr=1e-3)
    try:
        for t in counts:
            set_threads(t)
            rates = {"torch": n * ADAM_BYTES_PER_PARAM / _best(opt.step, 3) / GB}
            rates.update(_grace_adam_rate(n))
            table[str(t)] = rates
    finally:
        set_threads(threads if threads else before)
    return table


def _host_interference(threads: int, quick: bool) -> float | None:
    """Seconds of compute lost per second a host Adam runs beside it on a core of its own: a small MLP's forward
    and backward (a training step's kind of compute) at ``threads`` threads, alone and while a second thread
    streams GraceAdam (torch's fused AdamW without the kernel) over 16M parameters (4M quick) at one thread, as the
    engine's host worker does. k = 1 - t_alone / t_beside, the median over alternated pairs: 0 when the cores do not
    interfere; memory bandwidth, shared caches, SMT siblings and other processes' load make it larger (the
    profile notes the load it was measured under). None where no core is left beside the compute threads."""
    from superoffload.planner.presets import usable_cpus

    if usable_cpus() < threads + 1:
        return None
    from superoffload.calibrate.compute import mlp_step_timer

    compute = mlp_step_timer(512, 10)
    n = 1 << (22 if quick else 24)
    p, g, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    try:
        import grace_adam

        grace_adam.set_num_threads(1)

        def adam() -> None:
            grace_adam.adam_step(p, g, m, v, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
    except ImportError:
        q = torch.nn.Parameter(p)
        q.grad = g
        opt = torch.optim.AdamW([q], lr=1e-3)

        def adam() -> None:
            opt.step()

    stop = threading.Event()

    def host() -> None:
        while not stop.is_set():
            adam()

    compute()  # warm-up
    shares = []
    for _ in range(2 if quick else 5):  # alternated, paired: the median of 1 - alone / beside
        alone = compute()
        stop.clear()
        th = threading.Thread(target=host, daemon=True)
        th.start()
        time.sleep(0.02)  # the host thread is streaming before the compute is timed
        beside = compute()
        stop.set()
        th.join()
        shares.append(1.0 - alone / beside)
    try:
        import grace_adam

        grace_adam.set_num_threads(threads)
    except ImportError:
        pass
    return max(0.0, sorted(shares)[len(shares) // 2])


def _adam_rates(quick: bool) -> tuple[dict[str, float], list[str]]:
    n = 2**21 if quick else 2**24
    p = torch.randn(n)
    params = [torch.nn.Parameter(p.clone())]
    params[0].grad = torch.randn(n)
    notes: list[str] = []
    try:
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
        label = "torch fused AdamW"
    except (RuntimeError, TypeError):
        opt = torch.optim.AdamW(params, lr=1e-3)
        label = "torch AdamW"
    t = _best(opt.step, 3)
    rates = {"torch": n * ADAM_BYTES_PER_PARAM / t / GB}
    notes.append(f"host Adam 'torch' measured with {label} on {n} params")
    grace = _grace_adam_rate(n)
    if grace:
        notes.append(f"host Adam 'grace' measured with grace_adam.adam_step on {n} params")
    rates.update(grace)
    if not quick:  # importing DeepSpeed's op may JIT-build it (~1 min the first time on a machine)
        ds = _cpuadam_rate(n)
        if ds:
            notes.append(f"host Adam 'cpuadam' measured with DeepSpeedCPUAdam on {n} params")
        rates.update(ds)
    # a kernel this machine cannot run gets the table's ratio to the measured GraceAdam (to torch without it):
    # the table's own fastest kernel is GraceAdam, so a derived rate never outranks a measured GraceAdam (from
    # torch, whose CPU Adam on Grace is multi-pass, it made a --quick profile's DeepSpeedCPUAdam 2.4x torch and
    # the planner's choice)
    base = "grace" if "grace" in rates else "torch"
    for kind, seconds in ADAM_8B_SECONDS.items():
        if kind not in rates:
            ratio = ADAM_8B_SECONDS[base] / seconds
            rates[kind] = rates[base] * ratio
            notes.append(f"host Adam '{kind}' not measured here: {base} rate x {ratio:.2f} (GraceAdam table)")
    return rates, notes


def _cpuadam_rate(n: int) -> dict[str, float]:
    """DeepSpeedCPUAdam's rate when DeepSpeed and its CPU op are available (else the table ratio)."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        q = torch.nn.Parameter(torch.randn(n))
        q.grad = torch.randn(n)
        opt = DeepSpeedCPUAdam([q], lr=1e-3, adamw_mode=True)
        t = _best(opt.step, 3)
    except Exception:  # noqa: BLE001 - not installed, or its op cannot build here: fall back to the ratio
        return {}
    return {"cpuadam": n * ADAM_BYTES_PER_PARAM / t / GB}


def _grace_adam_rate(n: int) -> dict[str, float]:
    """GraceAdam's rate, when the kernel is installed (else the table ratio stands in)."""
    try:
        import grace_adam
    except ImportError:
        return {}
    p, g, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    t = _best(lambda: grace_adam.adam_step(p, g, m, v, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                                           weight_decay=0.0), 3)
    return {"grace": n * ADAM_BYTES_PER_PARAM / t / GB}


def _cast_gbps(device: str, elems: int, sync: Callable[[], None]) -> float:
    """bf16 <-> fp32 cast traffic, both directions, into buffers that already exist, as the engine casts (into
    its landing, staging and upload buffers). Not ``x.float()``: on the CPU each call would map and first-touch
    a fresh output above the allocator's cache, and the page faults dominated (benchmarks/host_cast_costs.py:
    2.9x the copy into an existing buffer on the 2-core Xeon the project is tested on)."""
    wide = torch.randn(elems, device=device)
    narrow = wide.to(torch.bfloat16)
    out_wide, out_narrow = torch.empty_like(wide), torch.empty_like(narrow)
    widen = _best(lambda: out_wide.copy_(narrow), 3, sync)
    narrow_t = _best(lambda: out_narrow.copy_(wide), 3, sync)
    return 2 * elems * CAST_BYTES_PER_ELEM / (widen + narrow_t) / GB


def _thread_sync_latency() -> float:
    """Round trip of a signal to a waiting thread: the CPU-only stand-in for an event wait."""
    ping, pong = threading.Event(), threading.Event()

    def worker() -> None:
        for _ in range(50):
            ping.wait()
            ping.clear()
            pong.set()

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    best = float("inf")
    for _ in range(50):
        t0 = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
        best = min(best, time.perf_counter() - t0)
    th.join(timeout=1.0)
    return best


def _sizes(quick: bool, top: int) -> list[int]:
    sizes = [MB * 4**i for i in range(6)]  # 1 MiB .. 1 GiB
    sizes = [s for s in sizes if s <= top]
    if not quick:
        return sizes
    return sizes[::2] + ([sizes[-1]] if len(sizes) % 2 == 0 else [])


def _cpu_profile(quick: bool, systems: bool = True) -> HardwareProfile:
    threads = torch.get_num_threads()
    n = 512 if quick else 2048
    sampler = NoiseSampler().start()
    fp32 = _matmul_flops("cpu", torch.float32, n, 3, lambda: None)
    bf16 = _matmul_flops("cpu", torch.bfloat16, n, 3, lambda: None)
    matmul = max(fp32, bf16)
    others = sampler.others_share()
    if not quick:  # the machine's MFU denominator for later runs at this thread count (harness/peak.py)
        for dtype, flops in ((torch.float32, fp32), (torch.bfloat16, bf16)):
            store_cpu_peak(dtype, threads, flops, "calibrate", others)
    mem = physical_memory_bytes()
    sizes = _sizes(quick, min(256 * MB, mem // 16))
    gbps = []
    for s in sizes:
        src = torch.empty(s, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        reps = 10 if s <= 16 * MB else (2 if quick else 5)  # small copies are cheap but noisy
        gbps.append(s / _best(functools.partial(dst.copy_, src), reps) / GB)
    memcpy = Curve(sizes, gbps)
    cast = _cast_gbps("cpu", 2**22 if quick else 2**25, lambda: None)
    adam, notes = _adam_rates(quick)
    by_threads = _adam_thread_rates(2**21 if quick else 2**24, threads)
    if by_threads:
        notes.append("host Adam also measured at " + ", ".join(sorted(by_threads, key=int)) + " thread(s)")
    interference = _host_interference(threads, quick)
    if interference is not None:
        notes.append(f"host interference {interference:.2f}: compute seconds lost per second of host Adam beside it "
                     f"on a core of its own ({threads} compute thread(s))")
    notes.append(f"matmul fp32 {fp32 / 1e9:.1f} GFLOP/s, bf16 {bf16 / 1e9:.1f} GFLOP/s at n={n}, "
                 f"{threads} torch threads")
    notes.append("CPU-only profile: device = host, link = memcpy; peak FLOPS = the measured matmul rate")
    return HardwareProfile(
        name="cpu-calibrated",
        source=f"calibrated on {socket.gethostname()} ({platform.machine()}) at "
               f"{time.strftime('%Y-%m-%dT%H:%M:%S')}" + (" quick" if quick else ""),
        h2d_pinned=memcpy, d2h_pinned=memcpy, h2d_pageable=memcpy, d2h_pageable=memcpy,
        device_matmul_flops=matmul, device_peak_flops=matmul,
        # relative to the rate stored as device_matmul_flops (max of fp32 and bf16), which the cost model
        # divides by; relative to the fp32 rate, attention came out up to bf16/fp32 (~2x) too fast
        attention_factor=_attention_factor("cpu", torch.float32, quick, matmul, lambda: None),
        device_hbm_bytes=mem, device_hbm_gbps=2 * max(gbps), device_cast_gbps=cast,
        host_adam_gbps=adam, host_cores=os.cpu_count() or 1, host_memory_bytes=mem,
        # the compute and host Adam rates above were measured at this many threads
        compute_threads=threads, host_adam_threads=threads, host_adam_by_threads=by_threads or None,
        host_interference=interference,
        host_cast_gbps=cast, sync_latency_s=_thread_sync_latency(),
        device_reserve_bytes=min(2**30, mem // 16), host_reserve_bytes=min(4 * 2**30, mem // 8),
        device_is_host=True, notes=notes,
        matmul_curve=_matmul_curve("cpu", torch.float32, quick, lambda: None),
        elementwise_gbps=_elementwise_gbps("cpu", lambda: None), op_overhead_s=_op_overhead("cpu", lambda: None),
        attention_bwd_ratio=_attention_bwd_ratio("cpu", torch.float32, lambda: None),
        attention_curve=_attention_curve("cpu", torch.float32, quick, lambda: None),
        **_overhead_fields("cpu", quick, systems, lambda: None, notes))


def _cuda_link(direction: str, pinned: bool, sizes: list[int], repeats: int) -> Curve:
    sync = torch.cuda.synchronize
    gbps = []
    for s in sizes:
        host = torch.empty(s, dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty(s, dtype=torch.uint8, device="cuda")
        dst, src = (dev, host) if direction == "h2d" else (host, dev)
        gbps.append(s / _best(functools.partial(dst.copy_, src, non_blocking=pinned), repeats, sync) / GB)
    return Curve(sizes, gbps)


def _cuda_profile(quick: bool, systems: bool = True) -> HardwareProfile:
    sync = torch.cuda.synchronize
    props = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    sizes = _sizes(quick, 2**30)
    repeats = 3 if quick else 10
    links = {f"{d}_{'pinned' if p else 'pageable'}": _cuda_link(d, p, sizes, repeats)
             for d in ("h2d", "d2h") for p in (True, False)}
    matmul = _matmul_flops("cuda", torch.bfloat16, 4096 if quick else 8192, repeats, sync)
    # the MFU table the harness measures with (one table: a copy here once matched "B200" before "GB200")
    table_peak = gpu_peak_flops(name)
    peak = table_peak if table_peak is not None else matmul / MATMUL_EFFICIENCY
    try:
        attention = _attention_factor("cuda", torch.bfloat16, quick, matmul, sync)
    except RuntimeError:
        attention = ATTENTION_FACTOR
    d2d_n = 2**28 if not quick else 2**26
    a = torch.empty(d2d_n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    hbm_gbps = 2 * d2d_n / _best(functools.partial(b.copy_, a), repeats, sync) / GB  # reads + writes
    del a, b
    ev = torch.cuda.Event()

    def event_roundtrip() -> None:
        ev.record()
        ev.synchronize()

    adam, notes = _adam_rates(quick)
    threads = torch.get_num_threads()
    by_threads = _adam_thread_rates(2**21 if quick else 2**24, threads)
    notes.append(f"device {name}; peak {'from table' if table_peak is not None else 'estimated'}")
    return HardwareProfile(
        name=f"{name.lower().replace(' ', '-')}-calibrated",
        source=f"calibrated on {socket.gethostname()} at {time.strftime('%Y-%m-%dT%H:%M:%S')}"
               + (" quick" if quick else ""),
        **links, device_matmul_flops=matmul, device_peak_flops=peak, attention_factor=attention,
        device_hbm_bytes=props.total_memory, device_hbm_gbps=hbm_gbps,
        device_cast_gbps=_cast_gbps("cuda", 2**26 if quick else 2**28, sync),
        host_adam_gbps=adam, host_cores=os.cpu_count() or 1, host_memory_bytes=physical_memory_bytes(),
        host_adam_threads=threads, host_adam_by_threads=by_threads or None,
        host_cast_gbps=_cast_gbps("cpu", 2**22 if quick else 2**26, lambda: None),
        sync_latency_s=_best(event_roundtrip, 20), notes=notes,
        matmul_curve=_matmul_curve("cuda", torch.bfloat16, quick, sync, pool_bytes=256 * MB),
        elementwise_gbps=_elementwise_gbps("cuda", sync), op_overhead_s=_op_overhead("cuda", sync),
        launch_op_s=launch_op_seconds("cuda", sync), device_call_s=device_call_seconds(sync),
        attention_bwd_ratio=_attention_bwd_ratio("cuda", torch.bfloat16, sync),
        attention_curve=_attention_curve("cuda", torch.bfloat16, quick, sync),
        **_overhead_fields("cuda", quick, systems, sync, notes))


def default_collective_ranks() -> int:
    """Ranks to measure collectives on: 2 where this host can run two (two GPUs, or two cores), else 0."""
    if torch.cuda.is_available():
        return 2 if torch.cuda.device_count() >= 2 else 0
    return 2 if (os.cpu_count() or 1) >= 2 else 0


def calibrate(out_path: str | os.PathLike[str] | None = None, quick: bool = False,
              systems: bool = True, workloads: list[tuple[str, int, int]] | None = None,
              dtype: str = "fp32", threads: int | None = None, collectives: int | None = None) -> HardwareProfile:
    """Measure this machine; write the profile JSON atomically to ``out_path`` if given. ``systems``:
    also time each training system's step machinery on a degenerate model (not with ``quick``).
    ``workloads``: (model, seq, micro-batch) whose compute is also profiled (calibrate/compute.py), in
    each precision of ``dtype`` (``fp32`` or comma-separated ``fp32,bf16``; autocast; the CPU sweep runs fp32).
    ``threads``: compute threads to measure at (default: torch's current count); pass the sweep's
    ``--threads``. ``collectives``: ranks to measure reduce-scatter / all-gather / all-reduce on
    (calibrate/collectives.py; None: 2 where this host can, 0: not measured)."""
    if threads is not None:
        set_threads(threads)

    cuda = torch.cuda.is_available()
    mem = torch.cuda.get_device_properties(0).total_memory if cuda else physical_memory_bytes()
    compute.parse_dtypes(dtype)  # a bad --dtype fails here, with or without --workloads
    if workloads:  # bad names and models too large to profile fail here, before minutes of measuring
        compute.check_workloads(workloads, dtype, mem)
    sampler = NoiseSampler(children=True).start()  # its subprocesses (systems, collectives) are its own work
    prof = _cuda_profile(quick, systems) if cuda else _cpu_profile(quick, systems)
    if prof.system_step_s:
        from superoffload.calibrate.systems import net_of_model

        prof.system_step_s = net_of_model(prof)  # the per-parameter slope net of the modelled copies/Adam
    if workloads:
        device = "cuda" if cuda else "cpu"
        prof.compute_profiles = compute.profile_workloads(workloads, device, dtype, mem)
        prof.notes.append(f"compute profiled for {len(workloads)} workload(s) in {dtype} on {device}")
    ranks = default_collective_ranks() if collectives is None else collectives
    if ranks:
        from superoffload.calibrate import collectives as coll

        measured = coll.measure(ranks, quick=quick)
        prof.collectives = {"intra": measured}
        # one node holds every rank the measurement can reach: the ranks of this host
        prof.chips_per_node = max(prof.chips_per_node, torch.cuda.device_count() if cuda else (os.cpu_count() or 1))
        lat, gbps = measured["latency_s"], measured["gbps"]
        prof.notes.append(f"collectives on {ranks} {measured['backend']} ranks: reduce-scatter "
                          f"{lat['reduce_scatter'] * 1e6:.0f} us/step + {gbps['reduce_scatter']:.2f} GB/s, all-gather "
                          f"{lat['all_gather'] * 1e6:.0f} us + {gbps['all_gather']:.2f} GB/s, all-reduce "
                          f"{lat['all_reduce'] * 1e6:.0f} us + {gbps['all_reduce']:.2f} GB/s; issuing from the "
                          f"host worker thread {measured['worker_issue_s'] * 1e6:.0f} us"
                          + (f"; an all-reduce in flight costs the compute beside it {measured['compute_share']:.2f} "
                             f"of its time" if measured.get("compute_share") is not None else "")
                          + (f"; one more call beside the compute {measured['call_overhead']['per_call_s'] * 1e3:.2f}"
                             " ms" if measured.get("call_overhead") else "")
                          + (f"; each rank bound to {measured['cores_per_rank']} core(s)"
                             if measured.get("cores_per_rank") else "; the ranks unbound"))
    # every number above is a rate of this machine as it was: other processes' CPU time slows them all (a
    # calibration on a loaded 2-core machine measured gpt-tiny's compute 2.6x slower), so the profile says so
    others = sampler.others_share()
    if others is not None:
        prof.notes.append(f"other processes used {others:.0%} of the CPUs while calibrating")
        if others > OTHERS_BOUND:
            prof.notes.append(f"calibrated on a loaded machine (others' CPU share > {OTHERS_BOUND:.0%}): its rates "
                              "are low; calibrate again on a quiet machine")
            print(f"superoffload calibrate: warning: other processes used {others:.0%} of the CPUs while calibrating "
                  "(the rates are this loaded machine's); calibrate again when it is quiet", file=sys.stderr)
    if out_path is not None:
        prof.save(out_path)
    return prof


def _run(args: argparse.Namespace) -> int:
    try:
        workloads = compute.parse_workloads(args.workloads) if args.workloads else None
        prof = calibrate(args.out, quick=args.quick, systems=not args.no_systems, workloads=workloads,
                         dtype=args.dtype, threads=args.threads, collectives=args.collectives)
    except ValueError as e:
        print(f"superoffload calibrate: error: {e}", file=sys.stderr)
        return 2
    d2h = prof.d2h_pinned
    print(f"{prof.name}: matmul {prof.device_matmul_flops / 1e12:.2f} TFLOP/s, D2H pinned peak "
          f"{d2h.peak():.1f} GB/s, host Adam {max(prof.host_adam_gbps.values()):.1f} GB/s"
          + (f" -> {args.out}" if args.out else ""))
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` to an argparse sub-command set; the handler is ``args.func(args) -> int``."""
    p = subparsers.add_parser("calibrate", help="measure this machine into a hardware profile JSON")
    p.add_argument("--out", default=None, help="write the profile here (atomically)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and smaller problems (seconds)")
    p.add_argument("--no-systems", action="store_true",
                   help="skip timing each training system's step machinery (subprocesses, ~1 min)")
    p.add_argument("--workloads", default=None, metavar="MODEL:SEQ:BATCH[,...]",
                   help="also profile the compute (forward/backward per block and of the rest) of the "
                        "harness's model at these points; the cost model then uses it for them")
    p.add_argument("--threads", type=int, default=None,
                   help="compute threads to measure at (torch and GraceAdam pools; default: torch's count); "
                        "use the --threads of the runs the profile will be compared with. Host Adam is also "
                        "measured at the other thread counts up to the usable CPUs, and the compute's slowdown "
                        "beside a host Adam on a core of its own (host_interference)")
    p.add_argument("--dtype", default="fp32", metavar="DTYPE[,DTYPE]",
                   help="compute dtype(s) of --workloads, comma-separated, each profiled: fp32, bf16 or fp16 "
                        "(default fp32, what the CPU sweep runs; fp32,bf16 for plans in both)")
    p.add_argument("--collectives", type=int, default=None, metavar="W",
                   help="measure reduce-scatter, all-gather and all-reduce on W ranks of this host (gloo, or NCCL "
                        "with W GPUs), each rank on its slice of the cores as `bench run --bind-cores` places it, at "
                        "the sizes the engine issues, in fp32 and bf16, and on CPUs what one more call costs beside "
                        "compute; the cost model uses them for several-rank plans (default: 2 where the host can run "
                        "two, 0: skip)")
    p.set_defaults(func=_run)
