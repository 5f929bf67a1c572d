"""Result files: one JSON file per run or microbenchmark, schema-validated, written atomically.

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
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_FILES = {"run": "record.schema.json", "adam_bench": "adam_bench.schema.json",
                "cast_bench": "cast_bench.schema.json", "memory_bench": "memory_bench.schema.json",
                "convergence": "convergence.schema.json", "plan_optimality": "plan_optimality.schema.json"}
SCHEMA_PATH = Path(__file__).with_name(SCHEMA_FILES["run"])


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


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


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

