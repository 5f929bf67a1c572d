"""Checkpoint files that can be trusted: hashed as they are written, listed in a manifest written last and
checked first, and failures that say which file and why in one line.

`torch.load` does not check its zip archive's CRCs, so a flipped byte in a checkpoint's tensor data loads
without error and trains from garbage; files from another run or another step load too. A checkpoint
directory therefore ends with `manifest.json`: every file's size and sha256 (computed while it was
written, no second pass), the step, the world size, a run id. A directory whose manifest is missing,
unreadable or disagrees with its files is not a checkpoint (`verify` says why, naming the file).
Used by the fine-tuning checkpoints (superoffload/finetune/checkpoint.py) and the engine's DeepSpeed-named
`save_checkpoint` (superoffload/engine/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 1 << 24


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or one on disk is not what its manifest says."""


class _HashingWriter:
    """A file object that hashes and counts what torch.save writes through it."""

    def __init__(self, f: Any) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, b: bytes | memoryview) -> int:
        self.h.update(b)
        self.n += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def save_hashed(obj: Any, path: Path) -> dict[str, Any]:
    """`torch.save(obj)` into `path`, fsynced; returns {"bytes", "sha256"} of what was written."""
    with open(path, "wb") as f:
        w = _HashingWriter(f)
        torch.save(obj, w)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": w.n, "sha256": w.h.hexdigest()}


def file_digest(path: Path) -> dict[str, Any]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_manifest(folder: Path, files: dict[str, dict[str, Any]], **info: Any) -> None:
    """`folder/manifest.json` (atomically): the files' sizes and digests plus `info` (step, world size,
    run id, ...). Written after every file it lists."""
    body = {"version": MANIFEST_VERSION, **info, "files": files}
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest, or None when the folder has none; CheckpointError when it is not readable."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not readable ({e})") from None
    if not isinstance(m, dict) or not isinstance(m.get("files"), dict):
        raise CheckpointError(f"{path}: not a checkpoint manifest")
    return m


def verify(folder: Path, deep: bool = True) -> str | None:
    """Why `folder` is not the checkpoint its manifest describes (a missing, resized or changed file, no
    or a bad manifest), or None when it is. `deep`: compare the sha256 digests too, not only sizes."""
    try:
        m = read_manifest(folder)
    except CheckpointError as e:
        return str(e)
    if m is None:
        return f"{folder / MANIFEST} is missing (the save did not finish)"
    for name, want in sorted(m["files"].items()):
        f = folder / name
        if not f.is_file():
            return f"{f} is missing"
        size = f.stat().st_size
        if size != want.get("bytes"):
            return f"{f} has {size} bytes, the manifest says {want.get('bytes')} (truncated or replaced)"
        if deep and file_digest(f)["sha256"] != want.get("sha256"):
            return f"{f}: its sha256 differs from the manifest's (damaged, or a file of another checkpoint)"
    return None


def load_file(path: Path) -> Any:
    """torch.load(weights_only=True) of a checkpoint file, a failure naming the file."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - corrupt archives raise anything from EOFError to RuntimeError
        raise CheckpointError(f"{path}: not readable as a checkpoint file ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]})") from None


def why_write_failed(e: BaseException, where: Path) -> str:
    """A write failure in words: a full disk, a read-only or forbidden directory, or the error itself.
    torch's zip writer reports a full disk as "unexpected pos ..."; the free space tells it apart."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device"
    if isinstance(e, OSError) and e.errno == errno.EROFS:
        return "the file system is read-only"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if isinstance(e, OSError) and e.errno == errno.EFBIG:
        return "the file is larger than the process may write (RLIMIT_FSIZE)"
    with contextlib.suppress(OSError):
        probe = where if where.exists() else where.parent
        free = shutil.disk_usage(probe).free
        if free < (64 << 20):
            return f"no space left on the device ({free} bytes free)"
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def check_writable(folder: Path) -> None:
    """That files can be created in `folder`, or in its nearest existing ancestor when it does not exist yet
    (nothing is left behind): CheckpointError naming the folder and the reason otherwise."""
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".write-check-"):
            pass
    except OSError as e:
        raise CheckpointError(f"{folder} is not writable: {why_write_failed(e, probe)}") from None
