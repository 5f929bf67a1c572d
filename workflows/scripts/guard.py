"""Run one command and always leave a result file behind, so the DAG continues.

    guard.py record --out REC.json --log LOG [--system S --model M ...] -- superoffload bench run ...
    guard.py json   --out OUT.json --log LOG --what NAME -- superoffload bench adam ... --out OUT.json
    guard.py stdout-json --out OUT.json --log LOG --what NAME -- superoffload explain ... --json

`record`: the command writes a run record itself (exit 0 = ok, 1 = an oom/error record was written).
If it wrote none (crash, bad input, timeout, missing command), a schema-valid error record is written
here with the tail of stderr. `json`: any JSON result; if missing, {"status": "error"|"unavailable"}.
`stdout-json`: the command prints JSON on stdout; it is parsed and written to --out.
The guard exits 0 whenever it could leave a file (the failure is in the file), else 3.

The guard owns the command's whole process tree (superoffload/harness/processes.py): the command starts
in a session of its own, every descendant carries a marker in its environment, and on a timeout or when
the guard itself gets SIGTERM / SIGINT the session is stopped (SIGTERM, then SIGKILL) and any marked
process left (torchrun's ranks run in sessions of their own) is killed. The record file is claimed for
the command: it may write it only while the claim holds, and the guard revokes the claim before it writes
a timed-out run's error record, so a run it gave up on can never replace that record later.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's superoffload, installed or not
from superoffload.harness import processes  # noqa: E402  (torch-free)
from superoffload.harness.provenance import cpu_model as _cpu  # noqa: E402  (torch-free)
from superoffload.harness.provenance import dist_version, git_commit  # noqa: E402

TAIL = 4000


def _write_json(path: str, obj) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, p)


def _read_json(path: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _unavailable(stderr: str, rc: int | None) -> bool:
    """The sub-command or module does not exist in this install (argparse usage error or import)."""
    s = stderr.lower()
    return (rc == 2 and "invalid choice" in s) or "no module named" in s or rc == 127


def _version(dist: str) -> str:
    return dist_version(dist) or "unknown"


def _git_commit() -> str | None:
    return git_commit(ROOT)[0]


def _model_block(name: str) -> dict:
    block = {"name": name, "params": 0, "layers": 0, "hidden": 0, "heads": 0, "vocab": 0}
    try:
        from superoffload.shapes import get_shape

        s = get_shape(name)
        block.update(
            params=int(s.total_params()),
            matmul_params=int(s.matmul_params()),
            layers=s.layers,
            hidden=s.hidden,
            heads=s.heads,
            vocab=s.vocab,
        )
    except Exception:  # noqa: BLE001 - an unknown model still gets a record
        pass
    return block


def error_record(a: argparse.Namespace, message: str) -> dict:
    rec = {
        "schema_version": 1,
        "status": "error",
        "error": message,
        "system": a.system or "unknown",
        "model": _model_block(a.model or "unknown"),
        "world_size": a.world_size or 1,
        "run": {
            "seq": a.seq or 1,
            "batch": a.batch or 1,
            "global_batch": (a.batch or 1) * max(1, (a.world_size or 1) // (a.sp or 1)),
            "world_size": a.world_size or 1,
            "sp": a.sp or 1,
            "dtype": a.dtype or "fp32",
            "steps": a.steps or 1,
            "warmup": a.warmup or 0,
            "seed": 1234,
            "system_options": {},
        },
        "timing": None,
        "losses": [],
        "throughput": None,
        "memory": {},
        "telemetry": None,
        "system_stats": None,
        "rollbacks": None,
        "plan": None,
        "provenance": {
            "device": "unknown",
            "cpu": _cpu(),
            "torch": _version("torch"),
            "git_commit": _git_commit(),
            "hostname_hash": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
        },
        "created_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "written_by": "workflows/scripts/guard.py (the command left no record)",
    }
    try:  # validate when the package is importable; the record is built to pass
        from superoffload.harness.record import validate

        validate(rec)
    except ImportError:
        pass
    return rec


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("guard.py: expected `--` before the command", file=sys.stderr)
        return 3
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="guard.py")
    p.add_argument("mode", choices=["record", "json", "stdout-json"])
    p.add_argument("--out", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--what", default="result")
    for k in ("system", "model", "dtype"):
        p.add_argument(f"--{k}")
    for k in ("seq", "batch", "steps", "warmup", "world-size", "sp"):
        p.add_argument(f"--{k}", type=int)
    a = p.parse_args(argv[:i])
    cmd = argv[i + 1 :]
    Path(a.log).parent.mkdir(parents=True, exist_ok=True)
    out = Path(a.out)
    if out.exists():
        out.unlink()  # a stale file must not pass for this run's result
    t0 = time.monotonic()
    rc, stdout, stderr = _run_owned(cmd, a.timeout, out)
    wall = time.monotonic() - t0
    with open(a.log, "w") as log:
        log.write(
            f"$ {' '.join(cmd)}\n# exit {rc}, {wall:.1f} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n"
        )
    sys.stderr.write(stderr[-TAIL:])
    tail = stderr.strip()[-TAIL:] or stdout.strip()[-TAIL:] or "(no output)"

    if a.mode == "record":
        rec = _read_json(a.out)
        if isinstance(rec, dict) and rec.get("status") in ("ok", "oom", "error"):
            return 0
        why = "timed out or was stopped" if rc is None else f"exited with {rc}"
        last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "")
        msg = f"command {why} without writing a record: {last}\n\nstderr tail:\n{tail}"
        _write_json(a.out, error_record(a, msg))
        return 0

    if a.mode == "stdout-json" and rc == 0:
        try:
            _write_json(a.out, json.loads(stdout))
            return 0
        except ValueError as e:
            tail = f"stdout is not JSON ({e}): {stdout.strip()[-TAIL:]}"
    elif a.mode == "json" and _read_json(a.out) is not None:
        return 0
    status = "unavailable" if _unavailable(stderr, rc) else "error"
    _write_json(
        a.out,
        {
            "status": status,
            "what": a.what,
            "command": cmd,
            "returncode": rc,
            "error": tail,
            "written_by": "workflows/scripts/guard.py",
        },
    )
    return 0


def _run_owned(cmd: list[str], timeout: float, out: Path) -> tuple[int | None, str, str]:
    """(exit code or None when stopped, stdout, stderr) of `cmd`, run as a tree this guard owns."""
    tree, token = uuid.uuid4().hex, uuid.uuid4().hex
    claim = out.with_name(out.name + ".claim")
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text(token)
    env = {**os.environ, processes.TREE_ENV: tree, processes.CLAIM_ENV: token,
           processes.CLAIM_FILE_ENV: str(claim)}
    stopped = []

    def give_up(why: str) -> None:
        stopped.append(why)
        claim.unlink(missing_ok=True)  # from now on the run may not write its record
        processes.stop_group(proc.pid, leader=proc)
        processes.kill_marked(processes.TREE_ENV, tree)

    def on_signal(signum, frame) -> None:
        give_up(f"stopped: the guard got {signal.Signals(signum).name}")

    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    except OSError as e:
        claim.unlink(missing_ok=True)
        return 127, "", f"could not start {cmd[0]!r}: {e}"
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            give_up(f"timed out after {timeout:.0f} s")
            stdout, stderr = proc.communicate()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        claim.unlink(missing_ok=True)
    if stopped:
        return None, stdout or "", (stderr or "") + f"\n{stopped[0]}"
    return proc.returncode, stdout, stderr


if __name__ == "__main__":
    sys.exit(main())
