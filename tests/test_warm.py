"""tests/warm.py: a command started from a zygote is the command a fresh interpreter would run: the same
output, exit status, working directory, environment, argv and sys.path[0]; ranks in different slots hash
strings differently; what cannot be forked safely starts cold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import warm

SCRIPT = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "x": os.environ.get("WARM_X"), "path0": sys.path[0],
                  "name": __name__, "ppid": os.getppid(), "hash": hash("a string")}))
print("to stderr", file=sys.stderr)
what = sys.argv[1]
if what == "raise":
    raise ValueError("boom")
if what == "exit":
    sys.exit(7)
if what == "kill":
    os.kill(os.getpid(), 9)
if what == "wait":
    import time
    time.sleep(60)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "child" / "probe.py"
    p.parent.mkdir()
    p.write_text(SCRIPT)
    return p


def env(**extra: str) -> dict[str, str]:
    # one OpenMP thread, as the tests' ranks run: the zygote then stays single-threaded and forks
    return {**os.environ, "OMP_NUM_THREADS": "1", "WARM_X": "x1", **extra}


def both(cmd: list[str], cwd: Path, e: dict[str, str]) -> tuple[subprocess.CompletedProcess, ...]:
    cold = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=120)
    hot = warm.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=120)
    return cold, hot


@pytest.mark.parametrize("what,code", [("ok", 0), ("raise", 1), ("exit", 7), ("kill", -signal.SIGKILL)])
def test_a_warm_child_is_the_command(script, tmp_path, what, code):
    cold, hot = both([sys.executable, str(script), what], tmp_path, env())
    assert cold.returncode == hot.returncode == code, hot.stderr
    c, h = json.loads(cold.stdout), json.loads(hot.stdout)
    assert h["ppid"] != os.getpid(), "not started from a zygote"
    for k in ("argv", "cwd", "x", "path0", "name"):
        assert c[k] == h[k], k
    assert h["path0"] == str(script.parent) and h["cwd"] == str(tmp_path)
    assert hot.stderr.startswith("to stderr")
    if what == "raise":
        assert hot.stderr.rstrip().endswith("ValueError: boom")


def test_a_module_runs_as_with_dash_m(tmp_path):
    cold, hot = both([sys.executable, "-m", "platform"], tmp_path, env())
    assert cold.returncode == hot.returncode == 0 and cold.stdout == hot.stdout != ""


def test_slots_hash_differently_and_a_signal_reaches_the_child(script, tmp_path):
    a = warm.run([sys.executable, str(script), "ok"], cwd=tmp_path, env=env(), capture_output=True, text=True)
    out = tmp_path / "out"
    with open(out, "w") as f:
        p = warm.popen([sys.executable, str(script), "wait"], cwd=tmp_path, env=env(), stdout=f,
                       stderr=subprocess.STDOUT, slot=1)
        assert isinstance(p, warm.WarmProcess)
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.2)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == -signal.SIGTERM
    h0 = json.loads(a.stdout)["hash"]
    h1 = json.loads(out.read_text().splitlines()[0])["hash"]
    assert h0 != h1  # two ranks, two hash seeds, as two fresh processes


@pytest.mark.parametrize("e", [pytest.param({"OMP_NUM_THREADS": ""}, id="threaded-imports"),
                               pytest.param({warm.COLD_ENV: "1"}, id="asked-cold")])
def test_what_cannot_fork_safely_starts_cold(script, tmp_path, e, monkeypatch):
    if warm.COLD_ENV in e:
        monkeypatch.setenv(warm.COLD_ENV, "1")
    full = {k: v for k, v in env(**e).items() if v != ""}
    p = warm.popen([sys.executable, str(script), "ok"], cwd=tmp_path, env=full, stdout=subprocess.DEVNULL)
    assert isinstance(p, subprocess.Popen) and p.wait(timeout=120) == 0


def test_a_jobs_zygotes_start_side_by_side_and_a_compile_changes_no_key(tmp_path):
    """launch() asks for every rank's zygote before waiting for any, so their imports run side by side; the
    variable torch sets in a test process at its first compile leaves the key as it was."""
    e = env(PYTHONWARMTEST=str(tmp_path))  # a key of its own: new zygotes, closed below before their imports end
    keys = [(warm.start_up_key(e), slot) for slot in (0, 1)]
    warm.prestart([e, {**e, "RANK": "1"}])
    try:
        zygotes = [warm._zygotes[k] for k in keys]
        assert all(z.ready is None and z.proc.poll() is None for z in zygotes)  # both importing, none awaited
    finally:
        with warm._lock:
            for k in keys:
                if k in warm._zygotes:
                    warm._zygotes.pop(k).close()
    assert warm.start_up_key({**e, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}) == warm.start_up_key(e)
