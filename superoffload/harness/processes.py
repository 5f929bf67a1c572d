"""Process trees that end together: no rank outlives the run that started it.

A multi-rank `bench run --nproc N` is a tree: the launcher, torchrun, and N ranks that torchrun starts in
sessions of their own. Killing the launcher alone (a workflow timeout, a `kill -9`) used to leave torchrun
and the ranks running as orphans, holding the GPU and later writing a record for a run that had been given
up. Three pieces close that (Linux; elsewhere they do nothing):

- `die_with_parent(sig)`: the kernel sends `sig` to this process when its parent exits
  (prctl PR_SET_PDEATHSIG): torchrun gets SIGTERM when the launcher dies (and stops its ranks), each rank
  SIGKILL when torchrun dies;
- a marker in the environment, inherited by every descendant whatever its session:
  `kill_marked(name, value)` finds and kills them all (the guard's last sweep after a timeout);
- a claim on the record file (`claim_holds`): a run writes its record only while the file the guard
  made still holds the run's token, so a run the guard gave up on can never overwrite its error record.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
CLAIM_ENV, CLAIM_FILE_ENV = "SUPEROFFLOAD_RECORD_CLAIM", "SUPEROFFLOAD_RECORD_CLAIM_FILE"
TREE_ENV = "SUPEROFFLOAD_RUN_TREE"  # a token every process of one guarded run carries


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits; exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent == 1 or os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + int(sig))


def marked(name: str, value: str) -> list[int]:
    """PIDs of this machine's processes whose environment holds `name=value` (other users' are unreadable)."""
    want = f"{name}={value}".encode()
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if want in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
    return found


def kill_marked(name: str, value: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every marked process, SIGKILL those still there after `grace_s`; returns who was signalled."""
    pids = marked(name, value)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and marked(name, value):
        time.sleep(0.1)
    for pid in marked(name, value):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids


def stop_group(pgid: int, grace_s: float = 10.0, leader: subprocess.Popen | None = None) -> None:
    """SIGTERM a process group (its leader started with start_new_session), SIGKILL it after `grace_s`.
    `leader`: the group leader's Popen, reaped while waiting: an exited but unreaped leader is a zombie
    that still counts as a group member, so without it every stop would wait the whole grace period."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if leader is not None:
            leader.poll()
        try:
            os.killpg(pgid, 0)
        except OSError:
            return
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def claim_holds() -> bool:
    """Whether this run may still write its record: no claim was made (not under the guard), or the claim
    file still holds this run's token (the guard removes it when it gives up on the run)."""
    token = os.environ.get(CLAIM_ENV)
    if not token:
        return True
    try:
        return Path(os.environ.get(CLAIM_FILE_ENV, "")).read_text().strip() == token
    except OSError:
        return False


def main(argv: list[str]) -> None:
    """`python -m superoffload.harness.processes SIGNAL -- COMMAND...`: exec COMMAND so that it gets SIGNAL
    when this process's parent exits (the setting survives exec), without a preexec_fn in the parent."""
    i = argv.index("--")
    die_with_parent(signal.Signals[argv[0]] if argv[0].startswith("SIG") else int(argv[0]))
    os.execvp(argv[i + 1], argv[i + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
