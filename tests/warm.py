"""Start the tests' Python subprocesses from an interpreter that has already imported torch.

Most of a test's subprocess is start-up: on a 2-core CI machine ``import torch`` takes ~3 s and the first
torch optimizer imports ``torch._dynamo`` (``torch._disable_dynamo`` wraps ``Optimizer.add_param_group``),
another ~1.7-3.7 s; a fine-tune also imports transformers (~3 s); the exit's garbage collection over all of
it ~1-2 s more. A multi-rank test starts two such processes per run, a fault test a few per case: start and
exit were about two fifths of the suite's CPU time (docs/results.md, eighteenth session).

So a *zygote* (the pattern of Android's app start and of Python's multiprocessing forkserver) imports them
once and forks a child per command; the child becomes ``python SCRIPT ARGS`` or ``python -m MODULE ARGS``:
its own stdin/stdout/stderr (the caller's files, passed over a Unix socket), working directory, environment,
``sys.argv`` and ``sys.path[0]``; it runs the target with ``runpy`` as ``__main__`` and ends as an
interpreter does (an uncaught exception prints its traceback and exits 1, ``atexit`` runs, finalization
runs). What stays the zygote's: modules already imported, and what the interpreter reads at its own start.
Hence a zygote per *start-up key*: the environment variables read at interpreter start or at those imports
(``PYTHON*``, OpenMP/MKL, ``TORCH*``, ``HF_*`` ...), and a *slot* per concurrent rank, each its own hash
seed, so two ranks of a job iterate sets of strings in different orders as two fresh processes would.

The zygote forks only while it is single-threaded (checked: forking a threaded process can copy a held
lock), so only commands with ``OMP_NUM_THREADS=1`` (the tests' ranks and fine-tunes) start warm: torch starts
an OpenMP pool at import otherwise. Anything else (another interpreter, flags, ``-c``, pipes) and
``SUPEROFFLOAD_TESTS_COLD=1`` start cold with ``subprocess.Popen``, as do tests of process start-up itself
(tests/test_cli_start.py), which call subprocess directly. What a warm child cannot change: its
``/proc/PID/cmdline`` and ``/proc/PID/environ`` are the zygote's (a test that finds a process by them starts
it cold).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import random
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

# imported once by every zygote: what the tests' subprocesses import that costs seconds
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.utils.checkpoint", "transformers",
           "transformers.modeling_utils")
# variables read at interpreter start or by the preloaded imports: a child whose values differ needs its own
# zygote (the rest of the environment is the child's own, set after the fork)
# (and the zygote's whole environment: a variable of one test's command, a rank's RANK, never leaks into it)
START_UP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "LD_",
                     "MALLOC", "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "TZ", "LANG", "LC_", "HOME",
                     "PATH", "TMPDIR", "USER", "XDG_")
COLD_ENV = "SUPEROFFLOAD_TESTS_COLD"
# zygotes a test process keeps (each ~370 MB resident): the least recently used one with no child running
# makes room for a new key; when every one has a child running, the command starts cold
MAX_ZYGOTES = 4
READY_S = 300.0  # a zygote's imports on a loaded machine; a zygote that never gets ready falls back to cold


# ... but not these, read when used: torch sets TORCHINDUCTOR_CACHE_DIR in a test process at its first compile,
# and keying on it started a second set of zygotes for every later command of that test worker
NOT_START_UP = ("TORCHINDUCTOR_CACHE_DIR",)


def start_up_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(START_UP_PREFIXES) and k not in NOT_START_UP))


# ---------------------------------------------------------------------------------------------------------
# the zygote (runs as `python tests/warm.py SOCKET`)

def _send_msg(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _recv_msg(sock: socket.socket) -> Any:
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, n))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _serve(path: str) -> tuple[dict, list[int]] | None:
    """Accept requests until the parent ends; returns only in a forked child, with its request and files."""
    parent = os.getppid()
    if _threads() != 1:  # an OpenMP pool started at import (OMP_NUM_THREADS unset): never fork it
        print(f"threaded: {_threads()} threads after the imports", flush=True)
        return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while os.getppid() == parent:
        for _key, _ in sel.select(timeout=0.05):
            conn, _ = listener.accept()
            try:
                _, fds, _, _ = socket.recv_fds(conn, 1, 3)
                req = _recv_msg(conn)
            except (OSError, EOFError, ValueError):  # a caller gone mid-request: the others go on
                conn.close()
                continue
            if _threads() != 1:  # never fork a threaded process: the caller starts it cold
                _send_msg(conn, {"refused": f"the zygote has {_threads()} threads"})
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                for c in (conn, *children.values()):
                    c.close()
                return req, fds
            for fd in fds:
                os.close(fd)
            _send_msg(conn, {"pid": pid})
            children[pid] = conn
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    _send_msg(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                conn.close()
    return None


def _become(req: dict, fds: list[int]) -> None:
    """Make this forked zygote the process `python ARGV` started in req's cwd and environment would be."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[0] = req["path0"]


def _zygote_main(path: str) -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # the gc module's advice for a process that forks without exec: the imported objects go to the permanent
    # generation, so no child's collections (its exit's included, ~1.3 s of torch and dynamo) traverse them
    gc.collect()
    gc.freeze()
    served = _serve(path)
    if served is None:
        return
    req, fds = served
    _become(req, fds)
    import runpy

    argv = req["argv"]
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        runpy._run_module_as_main(argv[1], alter_argv=True)  # what `python -m` runs
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


# ---------------------------------------------------------------------------------------------------------
# the caller's side

class _Zygote:
    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="so-zygote-")
        self.sock = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "log"), "w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, __file__, self.sock], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, text=True)
        self.ready: bool | None = None
        self.running = 0  # children whose exit status has not come back yet

    def wait_ready(self) -> bool:
        if self.ready is None:
            line = ""
            t0 = time.monotonic()
            with selectors.DefaultSelector() as sel:
                sel.register(self.proc.stdout, selectors.EVENT_READ)
                while time.monotonic() - t0 < READY_S and self.proc.poll() is None:
                    if sel.select(timeout=1.0):
                        line = self.proc.stdout.readline()
                        break
            self.ready = line.strip() == "ready"
            if not self.ready:
                self.close()
        return self.ready

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.sock)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.dir, "log"))
            os.rmdir(self.dir)


_zygotes: OrderedDict[tuple, _Zygote] = OrderedDict()  # least recently used first
_cold: set[tuple] = set()  # keys whose zygote could not fork (threads after its imports) or never got ready
_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    for z in _zygotes.values():
        z.close()
    _zygotes.clear()


def _start(key: tuple) -> _Zygote | None:
    """A new zygote for ``key`` (its imports under way), evicting the least recently used idle one when the
    limit is reached; None when every zygote has a child running. Called with _lock held."""
    if len(_zygotes) >= MAX_ZYGOTES:
        idle = next((k for k, old in _zygotes.items() if old.running == 0), None)
        if idle is None:
            return None
        _zygotes.pop(idle).close()
    zenv = dict(key[0])
    # each slot its own hash seed, as each fresh process has (unless the caller fixes it)
    zenv.setdefault("PYTHONHASHSEED", str(random.randrange(1, 2**32 - 1)))
    z = _zygotes[key] = _Zygote(zenv)
    return z


def _forkable(env: dict[str, str]) -> bool:
    # torch starts an OpenMP pool at import unless it is told to use one thread, and a threaded zygote cannot
    # fork (it would refuse each request after an import of ~8 s): only the one-thread commands start warm
    return env.get("OMP_NUM_THREADS") == "1" and os.environ.get(COLD_ENV) != "1"


def prestart(envs: Sequence[dict[str, str]]) -> None:
    """Start the zygotes that the ranks of one job (``envs[rank]``, slot = rank) will ask for and that do not
    exist yet, without waiting: their imports run side by side instead of one rank's after the other's."""
    with _lock:
        for slot, env in enumerate(envs):
            key = (start_up_key(env), slot)
            if _forkable(env) and key not in _cold and key not in _zygotes and _start(key) is None:
                return


def _zygote(env: dict[str, str], slot: int) -> _Zygote | None:
    key = (start_up_key(env), slot)
    with _lock:
        if key in _cold:
            return None
        z = _zygotes.get(key)
        if z is not None:
            _zygotes.move_to_end(key)
        else:
            z = _start(key)
            if z is None:
                return None
        if not z.wait_ready():
            _zygotes.pop(key)
            _cold.add(key)
            return None
        z.running += 1  # reserved for the caller's child: not evicted until its status comes back
        return z


class WarmProcess:
    """The part of subprocess.Popen the tests use, for a child of a zygote (not of this process: the zygote
    reaps it and sends its exit status, with Popen's convention: -N when a signal N ended it)."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket, zygote: _Zygote) -> None:
        self.args, self.pid, self._conn, self._zygote = args, pid, conn, zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(TimeoutError):
                self._wait(0.0)
        return self.returncode

    def _wait(self, timeout: float | None) -> None:
        with selectors.DefaultSelector() as sel:  # closed at once: a launcher polls every 50 ms
            sel.register(self._conn, selectors.EVENT_READ)
            if not sel.select(timeout=timeout):
                raise TimeoutError
        try:
            self.returncode = int(_recv_msg(self._conn)["returncode"])
        except (EOFError, OSError, KeyError) as e:  # the zygote died: the child's status is lost
            self.returncode = -signal.SIGKILL
            raise RuntimeError(f"the zygote of pid {self.pid} ended without its exit status") from e
        finally:
            self._conn.close()
            with _lock:
                self._zygote.running -= 1

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._wait(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _target(cmd: Sequence[str]) -> list[str] | None:
    """argv after the interpreter when it is `SCRIPT ...` or `-m MODULE ...`, else None (start cold)."""
    if not cmd or cmd[0] != sys.executable or len(cmd) < 2:
        return None
    if cmd[1] == "-m" and len(cmd) >= 3:
        return list(cmd[1:])
    if cmd[1].startswith("-"):
        return None
    return list(cmd[1:])


def _fd(f: IO | int | None, default: int) -> tuple[int, bool]:
    """A file descriptor for a child's stream and whether it is ours to close."""
    if f is None:
        return os.dup(default), True
    if f == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), True
    if isinstance(f, int):
        return f, False
    return f.fileno(), False


def popen(cmd: Sequence[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
          stdin: IO | int | None = subprocess.DEVNULL, stdout: IO | int | None = None,
          stderr: IO | int | None = None, slot: int = 0) -> WarmProcess | subprocess.Popen:
    """subprocess.Popen(cmd, ...) started from a zygote when it can be (module docstring). stdout and stderr:
    None (this process's), DEVNULL, a file or a descriptor; STDOUT as stderr; no pipes (a test reads a file).
    ``slot``: ranks started together take different slots."""
    cwd = str(cwd if cwd is not None else os.getcwd())
    env = dict(env if env is not None else os.environ)
    argv = _target(cmd)
    pipes = subprocess.PIPE in (stdin, stdout, stderr)
    z = _zygote(env, slot) if argv is not None and not pipes and _forkable(env) else None
    if z is None:
        return subprocess.Popen(list(cmd), cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)
    script = argv[0] != "-m"
    path0 = os.path.dirname(os.path.realpath(os.path.join(cwd, argv[0]))) if script else cwd
    owned = []
    fds = []
    for f, default in ((stdin, 0), (stdout, 1)):
        fd, own = _fd(f, default)
        fds.append(fd)
        if own:
            owned.append(fd)
    if stderr == subprocess.STDOUT:
        fds.append(fds[1])
    else:
        fd, own = _fd(stderr, 2)
        fds.append(fd)
        if own:
            owned.append(fd)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(z.sock)
        socket.send_fds(conn, [b"r"], fds)
        _send_msg(conn, {"argv": argv, "cwd": cwd, "env": env, "path0": path0})
        reply = _recv_msg(conn)
    except (OSError, EOFError):  # the zygote is gone: its key starts cold from now on
        reply = {}
        with _lock:
            _cold.add(next((k for k, v in _zygotes.items() if v is z), ()))
    finally:
        for fd in owned:
            os.close(fd)
    if "pid" not in reply:
        conn.close()
        with _lock:
            z.running -= 1
        return subprocess.Popen(list(cmd), cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)
    return WarmProcess(list(cmd), int(reply["pid"]), conn, z)


def run(cmd: Sequence[str], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
        capture_output: bool = False, text: bool = False, timeout: float | None = None,
        check: bool = False) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, ...) started from a zygote when it can be; output captured through files."""
    with tempfile.TemporaryDirectory(prefix="warm-run-") as d:
        out = open(Path(d, "stdout"), "w+b") if capture_output else None  # noqa: SIM115
        err = open(Path(d, "stderr"), "w+b") if capture_output else None  # noqa: SIM115
        try:
            proc = popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
            try:
                rc = proc.wait(timeout=timeout)
            except BaseException:  # a timeout, pytest-timeout, Ctrl-C: subprocess.run leaves no child behind
                proc.kill()
                proc.wait()
                raise
            got: list[Any] = [None, None]
            if capture_output:
                for i, f in enumerate((out, err)):
                    f.seek(0)
                    data = f.read()
                    got[i] = data.decode(errors="replace") if text else data
        finally:
            for f in (out, err):
                if f is not None:
                    f.close()
    done = subprocess.CompletedProcess(list(cmd), rc, got[0], got[1])
    if check:
        done.check_returncode()
    return done


if __name__ == "__main__":
    _zygote_main(sys.argv[1])
