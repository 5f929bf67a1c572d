"""The engine's checkpoint format: per-parameter optimizer state, as each rank owns it.

A rank owns element ranges of each parameter: where its shard of each bucket meets the parameter's
pieces (one range for a parameter in one bucket, possibly empty; one per bucket for a parameter split
across buckets). `state_dict()` holds, per parameter name, those `ranges` and the fp32 master, moments
and step count over them (concatenated in range order). So the format does not depend on how
parameters are packed into buckets, and:
- resuming with the same layout and world size loads each rank's own dict (bit-exact: the saved arrival
  order rebuilds the same buckets, so even the norm's summation order is the same);
- resuming at another world size or with another bucket layout (another `bucket_size`) loads the list
  of every rank's dicts (or the one dict of a single-rank run) and each rank takes its new ranges from
  the assembled tensors (`load_checkpoint` chooses);
- a replicated run's dict (engine config `replicate`: every rank holds the whole state) covers every
  range, so it loads alone into an engine of any world size or layout;
- `param_state(...)` assembles full per-parameter tensors from one or all ranks' dicts (tests, export).

Version-2 dicts (one `range` per parameter) and version-1 dicts (whole parameters, written before
sharding existed) load too.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from superoffload.engine.engine import SuperOffloadEngine

log = logging.getLogger(__name__)

VERSION = 3
STATE_KEYS = ("master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")

Owned = list[tuple[int, int, dict[str, torch.Tensor]]]  # (start, end, {state key: this rank's view}) per range


def _owned(eng: SuperOffloadEngine) -> dict[int, Owned]:
    """slot index -> the element ranges of the parameter this rank holds state for, in element order,
    with views of that state; for the parameters in buckets (none before the layout is built)."""
    out: dict[int, Owned] = {}
    for b in eng.all_buckets():
        state = b.state()
        for pc in b.slots:
            o = pc.overlap(b.lo, b.hi)
            if o is None:
                continue
            a, e, start = o
            out.setdefault(pc.index, []).append(
                (start, start + e - a, {k: t[a - b.lo: e - b.lo] for k, t in state.items() if k in STATE_KEYS}))
    for s in eng.slots:
        if s.pieces and s.index not in out:
            out[s.index] = []  # laid out, and none of it is this rank's
        out.get(s.index, []).sort(key=lambda r: r[0])
    return out


def _ranges(owned: Owned) -> list[tuple[int, int]]:
    return [(a, e) for a, e, _ in owned]


def engine_state_dict(eng: SuperOffloadEngine) -> dict[str, Any]:
    if eng.step_state.backward_done:
        raise RuntimeError("state_dict() was called between backward() and step(): this step's gradients are "
                           "already in the engine's buffers; call engine.step() first, then save")
    eng.synchronize()
    owned = _owned(eng)
    params = {}
    for s in eng.slots:
        if s.index in owned:
            parts = owned[s.index]
            keys = STATE_KEYS if eng.config.optimizer.amsgrad else STATE_KEYS[:3]
            entry: dict[str, Any] = {k: torch.cat([ts[k].detach().to("cpu") for _, _, ts in parts])
                                     if parts else torch.zeros(0) for k in keys}
            ranges = _ranges(parts)
        else:  # before the layout is measured: the full master, moments not started
            ranges = [(0, s.numel)]
            entry = {"master": eng.pending_master(s).clone(),
                     "exp_avg": torch.zeros(s.numel), "exp_avg_sq": torch.zeros(s.numel)}
        entry.update(ranges=ranges, numel=s.numel, shape=tuple(s.shape), step=eng.steps[s.index])
        params[s.name] = entry
    sd: dict[str, Any] = {  # "world_size": the key every saved checkpoint holds
        "version": VERSION, "world_size": eng.comm.world, "rank": eng.comm.rank, "params": params,
        # replicate: this rank's dict holds the whole state, so it loads alone at any world size or layout
        "replicated": eng.comm.replicate and eng.comm.active,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in eng.optimizer.param_groups],
        "loss_scale": eng.loss_scale.state_dict(), "global_step": eng.global_step, "micro": eng.micro,
        "window_micros": eng.window_micros,
        # the measured gradient-arrival order, so a resumed run builds the same buckets
        "arrival_order": [eng.slots[i].name for i in eng.order], "layout_measured": eng.layout_measured,
    }
    if eng.window_micros:
        # mid-accumulation: the gradients of this rank's micro-batches so far (a resume continues the window)
        sd["partial_grads"] = {s.name: s.param.grad.detach().to("cpu").clone()
                               for s in eng.slots if s.param.grad is not None}
    return sd


def _as_list(sd: dict[str, Any] | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    sds = [sd] if isinstance(sd, dict) else list(sd)
    if not sds:
        raise ValueError("no state_dict given")
    out = []
    for d in sds:
        v = d.get("version")
        if v == 1:  # whole parameters, one rank
            params = {n: {**e, "ranges": [(0, e["master"].numel())], "numel": e["master"].numel(),
                          "shape": tuple(e["master"].shape)} for n, e in d["params"].items()}
            d = {**d, "version": VERSION, "world_size": 1, "rank": 0, "params": params}
        elif v == 2:  # one range per parameter
            params = {n: {**{k: x for k, x in e.items() if k != "range"},
                          "ranges": [tuple(e["range"])] if e["range"][0] < e["range"][1] else []}
                      for n, e in d["params"].items()}
            d = {**d, "version": VERSION, "params": params}
        elif v != VERSION:
            raise ValueError(f"unsupported engine state_dict version {v!r} (this engine reads 1 to {VERSION})")
        out.append(d)
    return out


def param_state(sd: dict[str, Any] | Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Full per-parameter state {name: {master, exp_avg, exp_avg_sq[, max_exp_avg_sq], step}} assembled
    from one rank's dict (world size 1) or every rank's; raises if some elements are missing."""
    sds = _as_list(sd)
    out: dict[str, dict[str, Any]] = {}
    for name in sds[0]["params"]:
        first = sds[0]["params"][name]
        numel, shape = first["numel"], tuple(first["shape"])
        keys = [k for k in STATE_KEYS if k in first]
        full = {k: torch.empty(numel) for k in keys}
        covered = torch.zeros(numel, dtype=torch.bool)
        for d in sds:
            e = d["params"][name]
            at = 0
            for a, b in e["ranges"]:
                for k in keys:
                    full[k][a:b] = e[k].reshape(-1)[at: at + b - a]
                covered[a:b] = True
                at += b - a
        if not bool(covered.all()):
            raise ValueError(f"the state_dicts given do not cover all of {name}; pass every rank's state_dict")
        out[name] = {**{k: v.view(shape) for k, v in full.items()}, "step": int(first["step"])}
    return out


def check_state_values(sds: Sequence[dict[str, Any]]) -> None:
    """Masters and moments finite, second moments >= 0: a damaged or poisoned state is an error before it
    is loaded (it would skip every step, or train from garbage)."""
    for d in sds:
        for name, e in d["params"].items():
            for k in STATE_KEYS:
                t = e.get(k)
                if t is None:
                    continue
                bad = int((~torch.isfinite(t)).sum())
                if k in ("exp_avg_sq", "max_exp_avg_sq"):
                    bad += int((t < 0).sum())
                if bad:
                    raise ValueError(f"the optimizer state of {name} (rank {d.get('rank', 0)}) holds {bad} "
                                     f"{'non-finite' if k in ('master', 'exp_avg') else 'non-finite or negative'} "
                                     f"{k} value(s): the checkpoint is damaged")


def load_engine_state_dict(eng: SuperOffloadEngine, sd: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
    sds = _as_list(sd)
    check_state_values(sds)
    names = {s.name for s in eng.slots}
    saved = set(sds[0]["params"])
    missing, unexpected = names - saved, saved - names
    if missing or unexpected:
        raise ValueError(f"state_dict does not match the model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    if len(sds[0]["param_groups"]) != len(eng.optimizer.param_groups):
        raise ValueError(f"state_dict has {len(sds[0]['param_groups'])} param groups, the engine has "
                         f"{len(eng.optimizer.param_groups)}")
    for s in eng.slots:
        saved_shape = tuple(sds[0]["params"][s.name]["shape"])
        if saved_shape != tuple(s.shape):
            raise ValueError(f"{s.name}: shape {saved_shape} in state_dict, {tuple(s.shape)} in the model")
    same_rank = len(sds) == 1 and sds[0]["world_size"] == eng.comm.world and sds[0]["rank"] == eng.comm.rank
    whole = len(sds) == 1 and (sds[0]["world_size"] == 1 or bool(sds[0].get("replicated")))
    if not same_rank and not whole and len(sds) == 1:
        raise ValueError(f"this state_dict is rank {sds[0]['rank']} of {sds[0]['world_size']}; the engine is rank "
                         f"{eng.comm.rank} of {eng.comm.world}: pass the list of every rank's state_dicts to "
                         f"re-shard")
    if "partial_grads" in sds[0] and not same_rank:
        raise ValueError("this checkpoint was saved mid-accumulation (it holds partial gradients, which are per "
                         "rank): resume it at the same world size, or save after step()")
    eng.synchronize()
    by_name = {s.name: s.index for s in eng.slots}
    prepare_layout(eng, sds[0])
    own = sds[0] if same_rank and own_ranges_match(eng, sds[0]) else None
    if same_rank and own is None and not whole:
        raise ValueError("this rank's state_dict holds other element ranges than this engine's bucket layout "
                         "(another bucket_size or device_tail_buckets?): pass the list of every rank's "
                         "state_dicts to re-shard")
    _write_state(eng, own, param_state(sds) if own is None else None)
    for s in eng.slots:
        eng.steps[s.index] = int(sds[0]["params"][s.name]["step"])
    for g, saved_g in zip(eng.optimizer.param_groups, sds[0]["param_groups"], strict=True):
        g.update(saved_g)
    eng.loss_scale.load_state_dict(sds[0]["loss_scale"])
    micro = int(sds[0]["micro"])
    eng.restore_progress(sds[0]["global_step"], micro, sds[0].get("window_micros", micro % eng.config.grad_accum))
    with torch.no_grad():
        for s in eng.slots:
            s.param.grad = None
        for name, g in sds[0].get("partial_grads", {}).items():
            p = eng.slots[by_name[name]].param
            p.grad = g.to(device=p.device, dtype=p.dtype)
    eng.weights_written()


def prepare_layout(eng: SuperOffloadEngine, sd: dict[str, Any]) -> None:
    """Build the bucket layout from the checkpoint's measured arrival order, if not built yet."""
    by_name = {s.name: s.index for s in eng.slots}
    order = [by_name[n] for n in sd.get("arrival_order", []) if n in by_name]
    measured = bool(sd.get("layout_measured", False)) and sorted(order) == list(range(len(eng.slots)))
    if measured and not eng.layout_measured:
        eng.build_layout(order)
    elif measured and order != eng.order:
        log.warning("resuming into a different bucket layout than the checkpoint's: the state is exact, but the "
                    "gradient norm is summed in another order, so clipping may differ in the last bits")


def own_ranges_match(eng: SuperOffloadEngine, sd: dict[str, Any]) -> bool:
    """This rank's dict holds exactly the element ranges this engine's layout gives the rank (so it loads
    alone); False when the layout differs (another bucket_size, tail, world size or arrival order)."""
    (d,) = _as_list(sd)
    if d["world_size"] != eng.comm.world or d["rank"] != eng.comm.rank:
        return False
    owned = _owned(eng)
    return all([tuple(r) for r in d["params"][s.name]["ranges"]] == _ranges(owned[s.index])
               for s in eng.slots if s.index in owned)


def _write_state(eng: SuperOffloadEngine, own: dict[str, Any] | None, full: dict[str, dict] | None) -> None:
    """Optimizer state into this rank's ranges (from its own dict, or from assembled full tensors), and
    the weights from the masters: each rank casts its shard, then the bucket is all-gathered."""
    owned = _owned(eng)
    with torch.no_grad():
        for s in eng.slots:
            if s.index not in owned:  # before the layout: the pending master is the whole parameter
                src = own["params"][s.name] if own is not None else full[s.name]
                eng.write_master(s, src["master"])
                continue
            at = 0  # own: where the range starts in the dict's concatenated tensors
            for a, e, ts in owned[s.index]:
                for k, t in ts.items():
                    src_t = (own["params"][s.name] if own is not None else full[s.name]).get(k)
                    if src_t is None:
                        raise ValueError(f"{s.name}: the checkpoint has no {k} (was it saved with amsgrad off?)")
                    t.copy_(src_t.reshape(-1)[at: at + e - a] if own is not None else src_t.reshape(-1)[a:e])
                at += e - a
    publish_masters(eng)


def publish_masters(eng: SuperOffloadEngine) -> None:
    """The weights from the masters, after the masters were set outside a step: each rank casts its
    shard into home, then every bucket is all-gathered (a collective: every rank calls it)."""
    with torch.no_grad():
        for b in eng.all_buckets():
            master = b.master
            b.home_shard().copy_(master)
            if b.host is not None and b.host.upload is not None:
                b.host.upload.copy_(master)  # the upload copy mirrors the weights (see Bucket._run_kernel)
            if not b.flowed:
                b.gather = eng.comm.all_gather(b.home, b.home_shard(), worker=False)
                eng.comm.wait(b.gather)
                b.gather = None
    if eng.flow is not None:
        for blk in eng.flow.blocks.values():
            blk.stale = True
        eng.flow.reload_resident()
    eng.backend.synchronize()


def _untrained_state(eng: SuperOffloadEngine) -> dict[str, torch.Tensor]:
    """The model's state the engine does not train: buffers and frozen parameters (what a DeepSpeed
    checkpoint's module state adds to the optimizer's)."""
    trained = {id(s.param) for s in eng.slots}
    return {k: v.detach().to("cpu").clone() for k, v in eng.model.state_dict(keep_vars=True).items()
            if id(v) not in trained}


def save_checkpoint(eng: SuperOffloadEngine, save_dir: str, tag: str | None, client_state: dict | None,
                    save_latest: bool = True) -> str:
    """Every rank writes its file into a temporary `.tag.tmp`, the ranks synchronize, rank 0 writes the
    manifest (every rank's file size and sha256) and renames the folder to `tag` (a tag saved again is
    replaced whole, never file by file), and `latest` is written after a second barrier: a crash at any
    point leaves the previous checkpoint of the tag, or none, never shards of two steps."""
    from pathlib import Path

    from superoffload.engine import files

    comm = eng.comm
    tag = tag or f"global_step{eng.global_step}"
    root = Path(save_dir)
    final, tmp = root / tag, root / f".{tag}.tmp"
    blob = {"engine": eng.state_dict(), "client_state": client_state or {}, "module": _untrained_state(eng)}
    try:
        if comm.rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        comm.barrier()
        name = f"rank{comm.rank}.pt"
        written = comm.all_gather_object({name: files.save_hashed(blob, tmp / name)})
        if comm.rank == 0:
            files.write_manifest(tmp, {k: v for part in written for k, v in part.items()}, step=eng.global_step,
                                 world_size=comm.world, tag=tag)  # the manifest's key
            files.fsync_dir(tmp)
            old = root / f".{tag}.old"
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            files.fsync_dir(root)
            shutil.rmtree(old, ignore_errors=True)
        comm.barrier()
        if comm.rank == 0 and save_latest:
            _atomic_text(os.path.join(save_dir, "latest"), tag)
        comm.barrier()
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise files.CheckpointError(f"checkpoint {tag} not written to {tmp}: {files.why_write_failed(e, root)}") \
            from None
    return str(final / f"rank{comm.rank}.pt")


def load_checkpoint(eng: SuperOffloadEngine, load_dir: str, tag: str | None, weights_only: bool = False,
                    strict: bool = True) -> tuple[str, dict]:
    """The checkpoint of `tag` (default: the one `latest` names), verified against its manifest first (a
    damaged, truncated or swapped file is a CheckpointError naming it), every rank's file at the same step."""
    import glob
    from pathlib import Path

    from superoffload.engine import files

    if tag is None:
        latest = os.path.join(load_dir, "latest")
        if not os.path.exists(latest):
            raise FileNotFoundError(f"no checkpoint in {load_dir}: it has no 'latest' file (pass tag=)")
        with open(latest) as f:
            tag = f.read().strip()
    folder = os.path.join(load_dir, tag)
    own = os.path.join(folder, f"rank{eng.comm.rank}.pt")
    paths = sorted(glob.glob(os.path.join(folder, "rank*.pt")))
    if not paths:
        raise FileNotFoundError(f"no checkpoint files in {folder}")
    manifest = files.read_manifest(Path(folder))
    if manifest is not None:
        problem = files.verify(Path(folder))
        if problem:
            raise files.CheckpointError(f"checkpoint {folder}: {problem}")
        if len(paths) != int(manifest["world_size"]):
            raise files.CheckpointError(f"checkpoint {folder} holds {len(paths)} rank file(s), its manifest lists "
                                        f"{manifest['world_size']}")
    blobs = {p: _load_blob(p) for p in paths}
    steps = {os.path.basename(p): b["engine"].get("global_step") for p, b in blobs.items()}
    if len(set(steps.values())) > 1 or (manifest is not None and set(steps.values()) != {manifest["step"]}):
        raise files.CheckpointError(f"checkpoint {folder} mixes steps: {steps}"
                                    + (f" (the manifest says {manifest['step']})" if manifest else ""))
    first = blobs[paths[0]]
    if weights_only:
        masters = {n: e["master"] for n, e in param_state([b["engine"] for b in blobs.values()]).items()}
        name_of = {id(s.param): s.name for s in eng.slots}  # a tied weight's other names load its master too
        sd = {k: masters[name_of[id(v)]] for k, v in eng.model.state_dict(keep_vars=True).items() if id(v) in name_of}
        eng.load_model_state_dict({**first.get("module", {}), **sd}, strict=strict)
        return folder, first["client_state"]
    if own in blobs and _loads_alone(eng, blobs[own]["engine"]):
        blob = blobs[own]
        eng.load_state_dict(blob["engine"])
        path = own
    else:
        blob = first
        eng.load_state_dict([b["engine"] for b in blobs.values()])
        path = folder
    if blob.get("module"):
        eng.model.load_state_dict(blob["module"], strict=False)
    return path, blob["client_state"]


def _loads_alone(eng: SuperOffloadEngine, sd: dict[str, Any]) -> bool:
    """This rank's file is enough: saved at this world size with this engine's layout (else every rank's
    files are read and re-sharded)."""
    (d,) = _as_list(sd)
    if d.get("replicated"):
        return True  # the whole state
    if d.get("world_size") != eng.comm.world:
        return False
    eng.synchronize()
    prepare_layout(eng, d)
    return own_ranges_match(eng, d)


def _load_blob(path: str) -> dict[str, Any]:
    from superoffload.engine import files

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - a corrupt archive raises anything: name the file
        raise files.CheckpointError(f"{path}: not readable as a checkpoint file ({type(e).__name__}: "
                                    f"{' '.join(str(e).split())[:200]})") from None


def _atomic_text(path: str, text: str) -> None:
    import os

    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
