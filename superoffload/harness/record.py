"""Result records: one JSON file per run, schema-validated, written atomically.

Reports and regression checks read only these files (DESIGN.md, "Measurement contract").
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

SCHEMA_PATH = Path(__file__).with_name("record.schema.json")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate(record: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` naming the offending field."""
    jsonschema.validate(record, schema())


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write to a temp file in the same folder, fsync, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=_json_default)
            f.write("\n")
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

