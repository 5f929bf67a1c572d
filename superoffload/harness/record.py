"""Result files: one JSON file per run or microbenchmark, schema-validated, written atomically; and the
run record's one home: building it (ok and error), its throughput block, loading a folder of records and
the accessors every reader uses (``bench run``, ``finetune``, ``bench compare`` and the report).

Each kind of result file has a JSON schema beside this module, which is its whole contract: the
writer validates before writing and every reader validates after reading, so a report reads exactly
the fields a schema defines and a file that does not follow it is reported as such, never guessed at.

| kind | written by | schema |
|---|---|---|
| ``run`` | ``superoffload bench run`` (the runner) | ``record.schema.json`` |
| ``adam_bench`` | ``superoffload bench adam`` | ``adam_bench.schema.json`` |
| ``cast_bench`` | ``superoffload bench cast`` | ``cast_bench.schema.json`` |
| ``memory_bench`` | ``superoffload bench memory`` | ``memory_bench.schema.json`` |
| ``convergence`` | ``python -m superoffload.finetune.convergence`` | ``convergence.schema.json`` |
| ``plan_optimality`` | ``python benchmarks/plan_optimality.py`` | ``plan_optimality.schema.json`` |

Reports and regression checks read only these files (docs/measurement.md).

A run record keeps the key names it was born with: ``run.dtype`` is the run's precision
(``RunConfig.precision`` in code; read it with ``precision_of``), ``world_size`` the number of ranks
(``world`` in code; ``world_of``). This module stays torch-free: the report imports it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import re
import resource
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema

from superoffload.harness import flops, provenance
from superoffload.harness.stats import summarize
from superoffload.shapes import ModelShape, get_shape

if TYPE_CHECKING:
    from superoffload.harness.system import RunConfig

SCHEMA_FILES = {"run": "record.schema.json", "adam_bench": "adam_bench.schema.json",
                "cast_bench": "cast_bench.schema.json", "memory_bench": "memory_bench.schema.json",
                "convergence": "convergence.schema.json", "plan_optimality": "plan_optimality.schema.json"}


# a run whose optimizer skipped more than this share of its steps (non-finite gradients) did not train
MAX_SKIPPED_SHARE = 0.5
MIN_STEPS_FOR_SHARE = 4


def nonfinite_verdict(skipped: list[bool] | None) -> str | None:
    """Why a run whose steps were mostly skipped is not ok (None when it is): the record's status turns
    to error with this message, so a run that never trained is never reported as one that did."""
    if not skipped or len(skipped) < MIN_STEPS_FOR_SHARE:
        return None
    n = sum(bool(x) for x in skipped)
    if n <= MAX_SKIPPED_SHARE * len(skipped):
        return None
    return (f"non-finite: {n} of {len(skipped)} optimizer steps were skipped (NaN/Inf gradients): the weights "
            f"hardly changed; the data or the weights hold NaN/Inf, or the learning rate is too high")


def schema_path(kind: str = "run") -> Path:
    if kind not in SCHEMA_FILES:
        raise ValueError(f"unknown result kind {kind!r}; known: {', '.join(SCHEMA_FILES)}")
    return Path(__file__).with_name(SCHEMA_FILES[kind])


@functools.cache
def schema(kind: str = "run") -> dict[str, Any]:
    return json.loads(schema_path(kind).read_text())


def validate(record: dict[str, Any], kind: str = "run") -> None:
    """Raise ``jsonschema.ValidationError`` naming the offending field."""
    jsonschema.validate(record, schema(kind))


class ResultFileError(ValueError):
    """A result file that cannot be read as its kind: unreadable, not JSON, or not following its schema."""


def _where(err: jsonschema.ValidationError) -> str:
    return "/".join(str(p) for p in err.absolute_path) or "(top level)"


def _upgrade(obj: Any, kind: str) -> Any:
    """Files written before their kind had a schema, under the names they used then."""
    if kind == "adam_bench" and isinstance(obj, dict) and obj.get("benchmark") == "adam" and "kind" not in obj:
        date = obj.get("date", "")
        obj = {k: v for k, v in obj.items() if k not in ("benchmark", "date")}
        obj.update(kind="adam_bench", schema_version=1, created_utc=date)
    return obj


def parse_result(obj: Any, kind: str, name: str = "result") -> dict[str, Any]:
    """``obj`` (parsed JSON of a file called ``name``) as a valid result of ``kind``, or ResultFileError."""
    obj = _upgrade(obj, kind)
    try:
        validate(obj, kind)
    except jsonschema.ValidationError as e:
        raise ResultFileError(f"{name} does not follow superoffload/harness/{SCHEMA_FILES[kind]}: "
                              f"at {_where(e)}: {e.message}") from None
    return obj


def read_result(path: str | os.PathLike, kind: str) -> dict[str, Any]:
    """Read and validate a result file of ``kind``; raise ResultFileError saying what is wrong where.
    ``FileNotFoundError`` passes through unchanged (a missing file is not a broken one)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise ResultFileError(f"{path.name}: unreadable: {type(e).__name__}: {e}") from None
    return parse_result(obj, kind, path.name)


def write_result(path: str | os.PathLike, obj: dict[str, Any], kind: str) -> None:
    """Validate ``obj`` as ``kind``, then write it atomically (a writer never leaves an invalid file)."""
    validate(obj, kind)
    write_json_atomic(path, obj)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync, then rename: readers never see half a file."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a result is as readable as any file written here
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    validate(record)
    write_json_atomic(path, record)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")



# --- building a run record ------------------------------------------------------------------------------
def model_block(shape: ModelShape, params: int) -> dict[str, Any]:
    """``params``: the built model's unique parameters; ``shape_params``: the shape's own count (they differ
    where a GPT's position table was sized to the run, or a Hugging Face model has parts the shape omits)."""
    return {"name": shape.name, "params": params, "matmul_params": shape.matmul_params(),
            "shape_params": shape.total_params(), "layers": shape.layers, "hidden": shape.hidden,
            "heads": shape.heads, "vocab": shape.vocab, "ffn_hidden": shape.ffn_hidden,
            "kv_heads": shape.n_kv_heads, "family": shape.family}


def run_block(run: RunConfig, rank: int) -> dict[str, Any]:
    """The record's ``run``: the RunConfig under the record's key names plus what follows from it. ``seq`` is
    the global sequence length (``global_seq``, the same number, says so explicitly); ``local_seq`` is what
    one rank holds."""
    return {**run.record_dict(), "global_batch": run.global_batch, "tokens_per_step": run.tokens_per_step,
            "global_seq": run.seq, "local_seq": run.local_seq, "dp": run.dp, "rank": rank}


def new_record(run: RunConfig, shape: ModelShape, *, params: int, rank: int, device_name: str,
               status: str = "ok", error: str | None = None) -> dict[str, Any]:
    """A run record before its steps: every field the schema requires, the measured ones empty."""
    return {
        "schema_version": 1, "status": status, "error": error, "system": run.system,
        "model": model_block(shape, params), "run": run_block(run, rank),
        "timing": None, "losses": [], "throughput": None, "memory": {}, "telemetry": None,
        "system_stats": None, "rollbacks": None, "plan": None, "world_size": run.world, "ranks": None,
        "provenance": provenance.collect(device_name),
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def error_record(run: RunConfig, message: str) -> dict[str, Any]:
    """A schema-valid error record for a run that produced none (e.g. its ranks died under --nproc)."""
    shape = get_shape(run.model)
    rec = new_record(run, shape, params=shape.total_params(), rank=0, device_name="unknown", status="error",
                     error=message)
    validate(rec)
    return rec


def record_steps(rec: dict[str, Any], losses: list[float | None], skipped: list[bool] | None) -> None:
    """Per-step losses (None: no loss to report, e.g. no learned token; NaN/Inf: kept as null and marked in
    ``loss_nonfinite``) and skipped steps (None: the system cannot say). A run whose optimizer skipped most
    steps is an error (``nonfinite_verdict``)."""
    finite = [v is not None and v == v and abs(v) != float("inf") for v in losses]
    rec["losses"] = [v if ok else None for v, ok in zip(losses, finite, strict=True)]
    rec["loss_nonfinite"] = [v is not None and not ok for v, ok in zip(losses, finite, strict=True)]
    rec["step_skipped"] = skipped
    verdict = nonfinite_verdict(skipped)
    if verdict and rec["status"] == "ok":
        rec["status"], rec["error"] = "error", verdict


def host_peak_rss() -> int:
    """This process's lifetime peak resident memory, bytes (``ru_maxrss`` is in KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def memory_block(peak_device_bytes: int | None) -> dict[str, Any]:
    return {"peak_device_bytes": peak_device_bytes, "peak_host_rss_bytes": host_peak_rss()}


def timing_block(times: list[float], warmup: int) -> dict[str, Any]:
    """The steps after the first ``warmup`` are timed; the warm-up times are kept beside them."""
    timed = times[warmup:]
    return {"step_times_s": timed, "warmup_times_s": times[:warmup], **summarize(timed)}


def throughput_block(run: RunConfig, shape: ModelShape, step_s: float, peak_flops: float,
                     peak_source: str) -> dict[str, Any]:
    """Tokens/s, TFLOPS, MFU and HFU of one device from its step time, and the aggregate over the ranks.

    A device processes ``run.tokens_per_rank`` tokens a step (under --sp: seq / sp of each sequence); model
    FLOPs per token count attention over the global sequence, so under --sp each device does 1/sp of its
    group's attention."""
    checkpointing = bool(run.checkpointing_mode)
    tp = flops.throughput(shape, run.seq, run.tokens_per_rank, step_s, peak_flops, checkpointing)
    world = max(1, run.world)
    return {
        "tokens_per_s": tp.tokens_per_s, "model_tflops": tp.model_tflops,
        "hardware_tflops": tp.hardware_tflops, "mfu": tp.mfu, "hfu": tp.hfu,
        "aggregate_tokens_per_s": tp.tokens_per_s * world, "aggregate_model_tflops": tp.model_tflops * world,
        "peak_flops": peak_flops, "peak_flops_source": peak_source,
        "model_flops_per_token": flops.model_flops_per_token(shape, run.seq),
        "hardware_flops_per_token": flops.hardware_flops_per_token(shape, run.seq, checkpointing),
    }


# --- reading run records ---------------------------------------------------------------------------------
def is_record(obj: Any) -> bool:
    """Looks like a run record (the cheap test a folder scan uses; ``validate`` is the full one)."""
    return isinstance(obj, dict) and obj.get("schema_version") == 1 and "system" in obj and "status" in obj


RECORD_NAME = re.compile(r"^(?P<model>.+?)_s(?P<seq>\d+)_b(?P<batch>\d+)(?:_sp(?P<sp>\d+))?$")
MULTI_RANK_FOLDER = re.compile(r"^runs_w(?P<world>\d+)$")  # the workflow's runs_w<N>/<system>/<name>.json


def broken_record(path: Path, problem: str) -> dict[str, Any]:
    """A stand-in for a file that is not a readable run record, so a report shows it as an error row: the
    model, sequence, batch and SP degree its name says (``<model>_s<seq>_b<batch>[_sp<K>].json``), the system
    its folder says, and the number of ranks of a ``runs_w<N>`` folder above that."""
    m = RECORD_NAME.match(path.stem)
    run = {"seq": int(m["seq"]), "batch": int(m["batch"]), "sp": int(m["sp"] or 1)} if m else {}
    rec: dict[str, Any] = {
        "schema_version": 1, "status": "error", "system": path.parent.name,
        "model": {"name": m["model"] if m else path.stem.split("_s")[0], "params": 0},
        "run": run, "error": f"{path.name}: {problem}", "_path": str(path),
    }
    folder = MULTI_RANK_FOLDER.match(path.parent.parent.name)
    if folder and int(folder["world"]) >= 1:
        rec["world_size"] = int(folder["world"])
    return rec


def load_records(folder: str | os.PathLike, *, keep_broken: bool = False) -> list[dict[str, Any]]:
    """Every run record under ``folder`` (recursively, in path order), each with its ``_path``. A file that is
    not a readable run record is passed over, or with ``keep_broken`` stood in for by ``broken_record``.
    Hidden files (a writer's temporary file) are never read. Records are not validated here: a record from
    an older version of the schema still loads."""
    recs = []
    for path in sorted(Path(folder).rglob("*.json")) if Path(folder).is_dir() else []:
        if path.name.startswith("."):
            continue
        try:
            obj, problem = json.loads(path.read_text()), None
        except (OSError, ValueError) as e:
            obj, problem = None, f"unreadable: {type(e).__name__}: {e}"
        if problem is None and not is_record(obj):
            problem = "not a run record (schema_version 1)"
        if problem is not None and not keep_broken:
            continue
        rec = obj if problem is None else broken_record(path, problem)
        rec["_path"] = str(path)
        recs.append(rec)
    return recs


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def world_of(rec: dict[str, Any]) -> int:
    """Ranks that trained together: ``world_size`` (a record without it ran on one rank)."""
    return _count(rec.get("world_size"))


def sp_of(rec: dict[str, Any]) -> int:
    """Ulysses degree: ``run.sp`` (a record written before ``run.sp`` existed ran with 1)."""
    return _count((rec.get("run") or {}).get("sp"))


def precision_of(rec: dict[str, Any]) -> str | None:
    """The run's precision (fp32, bf16, fp16): the record's ``run.dtype``, its name since the first record."""
    return (rec.get("run") or {}).get("dtype")
