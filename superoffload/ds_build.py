"""DeepSpeed's JIT-built C++ ops: say so before a build starts, and never wait forever on a dead build.

DeepSpeed compiles its CPU ops (``cpu_adam``; ``deepspeed_shm_comm`` for the CPU accelerator's
communication) the first time a process needs them, through ``torch.utils.cpp_extension.load``, into
``<TORCH_EXTENSIONS_DIR>/<op name>/`` (torch's default: ``~/.cache/torch_extensions/py<ver>_<accelerator>/``;
ours, where the variable is unset: :func:`default_extensions_dir`, in the venv). That takes a minute or two with
no output, and is cached afterwards.

torch serialises builds with an empty file ``lock`` in that folder (``torch.utils.file_baton``): the
builder creates it, keeps it open while it builds and removes it at the end; every other process polls
until it is gone, with no time limit. A build killed hard (SIGKILL, OOM killer, a scheduler's time
limit) leaves the file behind and every later process waits forever, silently. So, before DeepSpeed
loads an op, :func:`prepare_op`:

- prints one line if the op will be built (no cached library yet);
- if a ``lock`` is there and a process on this machine holds it open, says which process is building
  and waits for it, with a line every ``heartbeat_s`` seconds (a build under load can take minutes; a
  silent wait looks like a hang to a person, and to a watchdog that judges progress by output); if that
  process dies before it finishes, its lock is dealt with as below;
- if no process on this machine holds it, the build died, or it runs on another machine that shares
  the folder: the lock is removed, with a one-line warning, once it is older than
  ``SUPEROFFLOAD_DS_LOCK_STALE_S`` seconds (default 300: far longer than a build, so a build on
  another machine is not broken). Until then it says so in one line, naming the file to delete to go
  on at once.

One ninja for every build (:func:`pin_ninja`): torch runs the ``ninja`` first on ``PATH``, and a machine often
has two (the one pip installed beside this Python as DeepSpeed's requirement, and the system's). Their
versions hash a command line differently in ``.ninja_log`` (ninja 1.13 against 1.11, seen here), so a process
whose venv is activated and one started as ``.venv/bin/python`` each find the other's objects built by a
"changed" command and rebuild the op: minutes every time the two alternate, as a test suite's processes do.

Nothing heavy is imported with this module (the workflow reads :func:`default_extensions_dir` without torch):
torch inside :func:`build_directory`, DeepSpeed inside :func:`prepare_deepspeed_ops`.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"
STALE_ENV = "SUPEROFFLOAD_DS_LOCK_STALE_S"
DEFAULT_STALE_S = 300.0
# While another process builds: one line this often, so the wait is visibly alive
HEARTBEAT_S = 30.0
# The op builders the DeepSpeed baselines and `bench adam` load (class names of deepspeed.ops.op_builder).
CPU_OFFLOAD_BUILDERS = ("CPUAdamBuilder", "ShareMemCommBuilder")


def _say(msg: str) -> None:
    print(f"superoffload: {msg}", file=sys.stderr, flush=True)


def default_extensions_dir() -> Path:
    """Where this project keeps DeepSpeed's JIT builds when ``TORCH_EXTENSIONS_DIR`` is not set (the Makefile,
    the workflow and the tests use it): inside the virtual environment this Python runs in, else
    ``~/.cache/superoffload/torch_extensions``. Per environment, because a build records the paths of the
    DeepSpeed and torch it was made against: two checkouts with their own venvs sharing one folder rewrite each
    other's build files and rebuild every op (minutes) each time the other one ran."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "torch_extensions"
    return Path.home() / ".cache" / "superoffload" / "torch_extensions"


def build_directory(name: str) -> Path:
    """Where torch's JIT builds op ``name`` (torch's own rule, so the lock we look at is the one it uses)."""
    root = os.environ.get(EXTENSIONS_ENV)
    if root:
        return Path(root) / name
    import torch.utils.cpp_extension

    try:  # private in torch, but it is the rule itself (python/accelerator-specific default folder)
        return Path(torch.utils.cpp_extension._get_build_directory(name, verbose=False))
    except (AttributeError, TypeError):
        return Path(torch.utils.cpp_extension.get_default_build_root()) / name


def lock_holders(lock: Path) -> list[int] | None:
    """PIDs of processes on this machine that have ``lock`` open (the builder keeps it open for the whole
    build); None where this cannot be known (no /proc)."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(lock)
    pids = []
    for pdir in proc.iterdir():
        if not pdir.name.isdigit():
            continue
        try:
            fds = list((pdir / "fd").iterdir())
        except OSError:  # gone, or another user's process
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    pids.append(int(pdir.name))
                    break
            except OSError:
                continue
    return pids


def stale_after_s() -> float:
    raw = os.environ.get(STALE_ENV, "")
    try:
        return float(raw) if raw.strip() else DEFAULT_STALE_S
    except ValueError:
        raise ValueError(f"{STALE_ENV}={raw!r} is not a number of seconds") from None


def clear_stale_lock(build_dir: Path, stale_s: float | None = None, poll_s: float = 1.0,
                     say: Callable[[str], None] = _say, heartbeat_s: float = HEARTBEAT_S) -> str:
    """Deal with ``build_dir/lock`` before a build; returns what was found.

    "free": no lock, or it went away while we waited (a live build on this machine finished: its library is
    cached); "removed": nobody here holds it and it was older than ``stale_s``, so it was deleted (also
    where the process that held it died while we waited).
    """
    lock = Path(build_dir) / "lock"
    stale_s = stale_after_s() if stale_s is None else stale_s
    told = False
    waiting_since: float | None = None
    said_at = 0.0
    while True:
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return "free"
        holders = lock_holders(lock)
        if holders:
            now = time.monotonic()
            who = f"process {', '.join(map(str, holders))}"
            if waiting_since is None:
                waiting_since = said_at = now
                say(f"waiting for {who}, which is building {lock.parent.name} (lock {lock})")
            elif now - said_at >= heartbeat_s:
                said_at = now
                say(f"still waiting for {who} to build {lock.parent.name} ({now - waiting_since:.0f} s so far)")
            time.sleep(poll_s)
            continue
        if age >= stale_s:
            # A builder closes the file just before it deletes it: look again after that window.
            time.sleep(min(poll_s, 0.5))
            if not lock.exists():
                return "free"
            if lock_holders(lock):
                continue
            try:
                lock.unlink()
            except FileNotFoundError:
                return "free"
            say(f"warning: removed the stale build lock {lock} ({age:.0f} s old, no process here holds it: an "
                "interrupted build)")
            return "removed"
        if not told:
            say(f"{lock} is held by no process on this machine (an interrupted build, or a build on another "
                f"machine); removing it once it is {stale_s:.0f} s old. Delete it to go on now.")
            told = True
        time.sleep(min(poll_s, stale_s - age))


def prepare_op(name: str, stale_s: float | None = None, say: Callable[[str], None] = _say) -> bool:
    """Call just before DeepSpeed JIT-loads op ``name``: clears a stale lock, and says so if a build follows.
    Returns True when the op will be built (no cached library in its build folder)."""
    build_dir = build_directory(name)
    clear_stale_lock(build_dir, stale_s, say=say)
    if (build_dir / f"{name}.so").exists():
        return False
    say(f"building DeepSpeed's CPU op {name} in {build_dir} (first use takes ~1-2 min; later runs load it "
        "in seconds)")
    return True


def pin_ninja(bin_dir: str | Path | None = None) -> str | None:
    """Put ``bin_dir`` first on this process's ``PATH`` when it holds a ``ninja``, so that torch's JIT builds,
    here and in the processes this one starts, use that ninja whatever ``PATH`` the process was given (module
    docstring). Default: the ``bin`` folder of the virtual environment this Python runs in (what activating it
    would put first); outside one, ``PATH`` is left as it is (a system ``bin`` moved first would change which
    other tools are found). Returns the ninja that builds will use (None: none on ``PATH``)."""
    if bin_dir is None and sys.prefix == sys.base_prefix:
        return shutil.which("ninja")
    here = str(Path(sys.executable).parent if bin_dir is None else bin_dir)
    if os.path.isfile(os.path.join(here, "ninja")):
        rest = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != here]
        os.environ["PATH"] = os.pathsep.join([here, *rest])
    return shutil.which("ninja")


def prepare_deepspeed_ops(builders: Iterable[str] = CPU_OFFLOAD_BUILDERS, stale_s: float | None = None,
                          say: Callable[[str], None] = _say, load: Iterable[str] = ()) -> list[str]:
    """:func:`prepare_op` for every op of ``builders`` that this DeepSpeed install builds just in time on
    this accelerator (ops that came prebuilt, or that the accelerator does not have, are left alone), after
    :func:`pin_ninja` and, where ``TORCH_EXTENSIONS_DIR`` is unset, setting it to :func:`default_extensions_dir`
    (for this process and those it starts). Returns the names of the ops that will be built. Imports DeepSpeed.

    ``load``: builder classes among ``builders`` to build (or wait for another process's build of) and load
    now, in this process, for a caller whose op is first loaded where a build cannot be waited for: DeepSpeed's
    SuperOffload loads ``cpu_adam`` in its CPU optimizer worker, whose caller gives up after 60 s, so a build
    there (or another test process's build it waits on) fails the run."""
    pin_ninja()
    os.environ.setdefault(EXTENSIONS_ENV, str(default_extensions_dir()))
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    accelerator = get_accelerator()
    compatible = getattr(deepspeed.ops, "__compatible_ops__", {})
    building = []
    for cls in builders:
        try:
            builder = accelerator.create_op_builder(cls)
        except (AttributeError, ImportError, ValueError):
            builder = None
        if builder is None or installed_ops.get(builder.NAME, False) or not compatible.get(builder.NAME, True):
            continue  # not on this accelerator, prebuilt, or never built here
        if prepare_op(builder.NAME, stale_s, say):
            building.append(builder.NAME)
        if cls in load:
            builder.load()  # torch waits on a live build's lock itself; the library is cached after
    return building
