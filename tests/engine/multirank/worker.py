"""One rank of a multi-rank engine test (launched by launch.py): gloo on 127.0.0.1, a short timeout.

Scenarios (each writes `rank{r}.pt` with what the test compares):
- exact: speculation on and off at the same world size, under clipping on chosen steps, a NaN injected on
  one rank only, optional gradient accumulation and two param groups: the per-step parameter digests, the
  state_dicts, the losses, the collective log of each run;
- replicate: the `exact` run sharded and with `replicate`, and the replicated state_dict loaded alone into a
  fresh sharded engine;
- torch_ref: fp32 training of a shard of a global batch, the losses (the test compares their mean with
  single-process torch AdamW + clip_grad_norm_ on the whole batch);
- save / resume: train, save a checkpoint; resume (possibly at another world size) and continue;
- raise: one rank raises in backward; the others must fail on their next collective's timeout.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import math
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

import superoffload
from superoffload.engine.comm import Comm
from superoffload.models import build_model, get_shape

SEQ, GLOBAL_ROWS = 16, 4  # every world size trains the same global batch; rank r takes its rows
OPT = {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
CLIP_STEPS = {2: 1e-3, 5: 1e-3}


def global_batch(step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole global batch of a step (the same on every rank and at every world size)."""
    g = torch.Generator().manual_seed(10_000 + 97 * step + micro)
    x = torch.randint(0, get_shape("gpt-tiny").vocab, (GLOBAL_ROWS, SEQ + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = GLOBAL_ROWS // world
    return t[rank * n:(rank + 1) * n].contiguous()


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def make_engine(cfg: dict, rank: int, nan_step: int | None, groups: bool) -> tuple:
    model = build_model(get_shape("gpt-tiny"), seq=SEQ, seed=0)
    state = {"step": -1, "boundary": False}
    if nan_step is not None and rank == 1:  # a NaN on one rank only: every rank must skip that step
        def inject(p):
            if state["step"] == nan_step and state["boundary"]:
                p.grad.view(-1)[0] = math.nan
        model.blocks[1].mlp.fc.weight.register_post_accumulate_grad_hook(inject)
    param_groups = None
    if groups:
        named = dict(model.named_parameters())
        first = [p for n, p in named.items() if n.startswith("blocks.0")]
        rest = [p for n, p in named.items() if not n.startswith("blocks.0")]
        param_groups = [{"params": rest}, {"params": first, "lr": OPT["lr"] / 2, "weight_decay": 0.0}]
    engine = superoffload.initialize(model, cfg, param_groups=param_groups)
    return engine, state


def train(engine, state, rank: int, world: int, steps: int, start: int = 0, clip=None) -> dict:
    """`clip(step)`: that step's grad_clip (default: CLIP_STEPS fire, others 1e3, which never clips)."""
    clip = clip or (lambda i: CLIP_STEPS.get(i, 1e3))
    accum = engine.config.grad_accum
    losses, digests, logs, norms = [], [], [], []
    for i in range(start, steps):
        state["step"] = i
        engine.config.grad_clip = clip(i)
        n0 = {k: len(v) for k, v in engine.comm.log.items()}
        for m in range(accum):
            x, y = global_batch(i, m)
            state["boundary"] = m == accum - 1
            loss = engine(shard(x, rank, world), shard(y, rank, world))
            engine.backward(loss)
            losses.append(loss.item())
        engine.step()
        engine.synchronize()
        digests.append(digest(engine.model))
        norms.append(engine.last_grad_norm)
        logs.append({k: v[n0[k]:] for k, v in engine.comm.log.items()})
    return {"losses": losses, "digests": digests, "logs": logs, "norms": norms}


def scenario_exact(a, rank: int, world: int) -> dict:
    base = {"optimizer": OPT, "precision": a.precision, "bucket_size": 40_000, "device_tail_buckets": a.tail,
            "grad_accum": a.accum, "device": a.device, "rollback_mode": a.mode, "grad_cast": a.grad_cast,
            "flow_layers": [int(x) for x in a.flow.split(",")] if a.flow else []}
    out = {}
    for name, extra in (("spec", {"speculation_policy": {"max_rollback_rate": 1.0}}), ("ref", {"speculation": False})):
        engine, state = make_engine({**base, **extra}, rank, nan_step=4, groups=a.groups)
        res = train(engine, state, rank, world, a.steps)
        res["state_dict"] = engine.state_dict()
        res["stats"] = {k: v for k, v in engine.stats["speculation"].items() if k != "rollback_time_s"}
        res["world"] = engine.comm.world
        out[name] = res
        engine.close()
    return out


def scenario_replicate(a, rank: int, world: int) -> dict:
    """The `exact` run (speculating, clipping on chosen steps, a NaN on one rank) sharded and replicated;
    then the replicated run's own state_dict loaded alone into a fresh sharded engine."""
    base = {"optimizer": OPT, "precision": a.precision, "bucket_size": 40_000, "device_tail_buckets": a.tail,
            "device": a.device, "grad_cast": a.grad_cast, "speculation_policy": {"max_rollback_rate": 1.0},
            "flow_layers": [int(x) for x in a.flow.split(",")] if a.flow else []}
    out = {}
    for name, replicate in (("sharded", False), ("replicated", True)):
        engine, state = make_engine({**base, "replicate": replicate}, rank, nan_step=4, groups=False)
        res = train(engine, state, rank, world, a.steps)
        res["state_dict"] = engine.state_dict()
        res["stats"] = {k: v for k, v in engine.stats["speculation"].items() if k != "rollback_time_s"}
        out[name] = res
        engine.close()
    fresh, _ = make_engine(base, rank, nan_step=None, groups=False)
    fresh.load_state_dict(out["replicated"]["state_dict"])
    out["loaded"] = fresh.state_dict()
    fresh.close()
    # weight flow's buckets are built at initialize, sharded: replicate cannot change after that
    flowed, _ = make_engine({**base, "flow_layers": [1], "device_tail_buckets": 0}, rank, nan_step=None, groups=False)
    try:
        flowed.reconfigure({"replicate": True})
        out["reconfigure_error"] = None
    except superoffload.ConfigError as e:
        out["reconfigure_error"] = str(e)
    flowed.close()
    return out


class _LateWork:
    """A reduce-scatter that reads its input only when waited for: the latest a backend may read it."""

    def __init__(self, issue) -> None:
        self.issue, self.done = issue, False

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> None:
        if not self.done:
            Comm.wait(self.issue())
            self.done = True


def scenario_in_flight(a, rank: int, world: int) -> dict:
    """The same speculating run four ways on the CPU-only backend: each reduce-scatter waited for at its
    launch (as on a device with streams); left in flight while backward goes on, with 1 and 3 staging
    slots (a slot's reuse waits for the reduction reading it); and left in flight with reductions that
    read their input only when waited for (a staging slot overwritten early would change the result)."""
    from superoffload.device.base import HostDevice
    base = {"optimizer": OPT, "precision": a.precision, "bucket_size": 40_000, "device_tail_buckets": a.tail,
            "speculation_policy": {"max_rollback_rate": 1.0}}
    issue = Comm.reduce_scatter
    out = {}
    for name, in_flight, slots, late in (("waited", False, 2, False), ("one-slot", True, 1, False),
                                         ("three-slots", True, 3, False), ("late-one-slot", True, 1, True)):
        HostDevice.host_waits_for_collectives = in_flight
        if late:
            Comm.reduce_scatter = lambda self, o, i: _LateWork(lambda: issue(self, o, i))
        try:
            engine, state = make_engine({**base, "staging_buffers": slots}, rank, nan_step=4, groups=False)
            res = train(engine, state, rank, world, a.steps)
        finally:
            HostDevice.host_waits_for_collectives = True
            Comm.reduce_scatter = issue
        res["state_dict"] = engine.state_dict()
        res["counters"] = engine.counters.snapshot()
        out[name] = res
        engine.close()
    return out


def scenario_comm(a, rank: int, world: int) -> dict:
    """Comm.reduce_scatter on host tensors (an all-reduce and this rank's slice) against torch's
    reduce_scatter_tensor, on fp32 and bf16 buffers, waited for at once and after other work."""
    comm = Comm.create()
    gen = torch.Generator().manual_seed(rank)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        inp = torch.randn(6 * world + world, generator=gen).to(dtype)  # not a multiple of anything but world
        ref = torch.empty(inp.numel() // world, dtype=dtype)
        dist.reduce_scatter_tensor(ref, inp.clone())
        got = torch.empty_like(ref)
        work = comm.reduce_scatter(got, inp)
        _ = torch.randn(1000, generator=gen).sum()  # something else meanwhile
        comm.wait(work)
        comm.wait(work)  # a second wait copies nothing again
        out[str(dtype)] = {"ref": ref, "got": got, "log": list(comm.log["main"]),
                           "all_reduced": type(work).__name__ == "_SliceOnWait"}
    return out


def scenario_torch_ref(a, rank: int, world: int) -> dict:
    cfg = {"optimizer": OPT, "precision": "fp32", "bucket_size": 40_000, "device_tail_buckets": 1, "grad_clip": 1.0,
           "speculation_policy": {"max_rollback_rate": 1.0}, "device": a.device}
    engine, state = make_engine(cfg, rank, nan_step=None, groups=False)
    res = train(engine, state, rank, world, a.steps, clip=lambda i: 1.0)
    res["clipped"] = engine.stats["speculation"].get("clipped", 0)
    res["grad_norms"] = engine.last_grad_norm
    return res


def scenario_save(a, rank: int, world: int) -> dict:
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "device_tail_buckets": 1,
           "speculation_policy": {"max_rollback_rate": 1.0}, "device": a.device}
    engine, state = make_engine(cfg, rank, nan_step=None, groups=False)
    train(engine, state, rank, world, a.split)
    engine.save_checkpoint(a.ckpt, tag="step")
    saved = engine.state_dict()
    rest = train(engine, state, rank, world, a.steps, start=a.split)
    return {"saved": saved, "final": engine.state_dict(), "losses": rest["losses"], "digests": rest["digests"],
            "split": sorted(s.name for s in engine.slots if len(s.pieces) > 1)}


def scenario_resume(a, rank: int, world: int) -> dict:
    """`--resume-bucket`: another bucket_size than the save's (another layout: every rank's file is read)."""
    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": a.resume_bucket or 40_000, "device_tail_buckets": 1,
           "speculation_policy": {"max_rollback_rate": 1.0}, "device": a.device}
    model = build_model(get_shape("gpt-tiny"), seq=SEQ, seed=123)  # every weight must come from the checkpoint
    engine = superoffload.initialize(model, cfg)
    engine.load_checkpoint(a.ckpt, tag="step")
    loaded = engine.state_dict()
    rest = train(engine, {"step": -1, "boundary": False}, rank, world, a.steps, start=a.split)
    return {"loaded": loaded, "final": engine.state_dict(), "losses": rest["losses"], "digests": rest["digests"],
            "split": sorted(s.name for s in engine.slots if len(s.pieces) > 1)}


def scenario_mixed(a, rank: int, world: int) -> dict:
    """Save tag "t" at step `split` and again at `steps` (the second save replaces the first whole), then
    build what a crash during a re-save by file would leave (rank 0's shard of the later step beside rank
    1's of the earlier one) and load it: every rank must refuse it, naming what is wrong."""
    import shutil

    from superoffload.engine.files import CheckpointError

    cfg = {"optimizer": OPT, "precision": "bf16", "bucket_size": 40_000, "device": a.device,
           "speculation_policy": {"max_rollback_rate": 1.0}}
    engine, state = make_engine(cfg, rank, nan_step=None, groups=False)
    root = Path(a.ckpt)
    train(engine, state, rank, world, a.split)
    engine.save_checkpoint(str(root / "early"), tag="t")
    train(engine, state, rank, world, a.steps, start=a.split)
    engine.save_checkpoint(str(root / "late"), tag="t")
    engine.save_checkpoint(str(root / "late"), tag="t")  # the same tag again: replaced whole
    dist.barrier()
    if rank == 0:
        shutil.copytree(root / "early", root / "mixed")
        shutil.copy(root / "late" / "t" / "rank0.pt", root / "mixed" / "t" / "rank0.pt")
    dist.barrier()
    fresh = superoffload.initialize(build_model(get_shape("gpt-tiny"), seq=SEQ, seed=5), cfg)
    try:
        fresh.load_checkpoint(str(root / "mixed"), tag="t")
        error = None
    except CheckpointError as e:
        error = str(e)
    again = superoffload.initialize(build_model(get_shape("gpt-tiny"), seq=SEQ, seed=5), cfg)
    again.load_checkpoint(str(root / "late"))  # the intact one loads (latest names "t")
    return {"error": error, "late_step": again.global_step, "left": sorted(p.name for p in (root / "late").iterdir())}


def scenario_raise(a, rank: int, world: int) -> dict:
    """Rank 1 raises in backward at step 2 and dies (--hang: and stays alive without taking part)."""
    cfg = {"optimizer": OPT, "bucket_size": 40_000, "device": a.device}
    engine, state = make_engine(cfg, rank, nan_step=None, groups=False)
    if rank == 1:
        def boom(p):
            if state["step"] == 2:
                raise RuntimeError("injected failure on rank 1")
        engine.model.blocks[2].mlp.fc2.weight.register_post_accumulate_grad_hook(boom)
    try:
        train(engine, state, rank, world, 6)
    except RuntimeError as e:
        if rank == 1 and a.hang:
            import time

            print(f"{e}: staying alive without taking part", flush=True)  # the test reads it in this rank's log
            time.sleep(600)  # alive, silent: the other ranks' collectives must time out
        raise
    return {}


def scenario_sp(a, rank: int, world: int) -> dict:
    """Ulysses sequence parallelism composed with the engine: `a.sp` ranks split each sequence, the rest of
    the world splits the batch; the optimizer is sharded over the whole world; the loss is each rank's
    token-loss sum over the global token count and gradients are summed (gradient_reduction "sum")."""
    from superoffload.sequence import enable_sequence_parallel

    sp, dp = a.sp, world // a.sp
    groups = [dist.new_group(list(range(d * sp, (d + 1) * sp))) for d in range(dp)]  # every rank creates all
    sp_group, d = groups[rank // sp], rank // sp
    model = build_model(get_shape("gpt-tiny"), seq=SEQ, seed=0)
    seq = enable_sequence_parallel(model, sp_group, loss_group=None, global_tokens=GLOBAL_ROWS * SEQ)
    engine = superoffload.initialize(model, {
        "optimizer": OPT, "precision": "fp32", "bucket_size": 40_000, "device_tail_buckets": 1, "grad_clip": 0.5,
        "gradient_reduction": "sum", "speculation_policy": {"max_rollback_rate": 1.0}, "device": a.device})
    rows = GLOBAL_ROWS // dp
    losses = []
    for i in range(a.steps):
        x, y = global_batch(i)
        xs, ys = x[d * rows:(d + 1) * rows], y[d * rows:(d + 1) * rows]
        loss = engine(seq.shard(xs), seq.shard(ys))
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)  # the global mean loss: every rank's share of it summed
        losses.append(total.item())
    engine.synchronize()
    return {"losses": losses, "stats": {k: v for k, v in engine.stats["speculation"].items()
                                        if k != "rollback_time_s"}, "digest": digest(engine.model)}


SCENARIOS = {"exact": scenario_exact, "replicate": scenario_replicate,
             "in_flight": scenario_in_flight, "comm": scenario_comm, "sp": scenario_sp,
             "torch_ref": scenario_torch_ref, "save": scenario_save, "resume": scenario_resume,
             "raise": scenario_raise, "mixed": scenario_mixed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scenario", required=True, choices=list(SCENARIOS))
    ap.add_argument("--pg-timeout", type=int, default=60)
    ap.add_argument("--device", default="host")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--mode", default="deferred")
    ap.add_argument("--grad-cast", default="device")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--split", type=int, default=4)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--tail", type=int, default=1)
    ap.add_argument("--flow", default="")
    ap.add_argument("--groups", action="store_true")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--resume-bucket", type=int, default=0)
    ap.add_argument("--hang", action="store_true")
    ap.add_argument("--sp", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.pg_timeout))
    try:
        res = SCENARIOS[a.scenario](a, a.rank, a.world)
        torch.save(res, Path(a.out) / f"rank{a.rank}.pt")
    except BaseException:
        # printed here, before the group is destroyed: a rank whose exception reached torch's excepthook after
        # that once died there of SIGSEGV (under two test workers), and its log said nothing of what it raised
        traceback.print_exc()
        sys.stderr.flush()
        raise
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
