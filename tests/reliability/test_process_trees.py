"""A multi-rank run never outlives what started it: a guard timeout or a kill -9 of `bench run --nproc 2`
leaves no process behind, and a run that was given up never writes its record later."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

from superoffload.harness import processes
from tests import _watchdog as watchdog
from tests.ranks import REPO, rank_env

GUARD = REPO / "workflows" / "scripts" / "guard.py"
MARK = "SUPEROFFLOAD_TEST_TREE"


def bench(out, steps: int = 100_000) -> list[str]:
    return [sys.executable, "-m", "superoffload", "bench", "run", "--system", "superoffload", "--model", "gpt-tiny",
            "--seq", "32", "--steps", str(steps), "--warmup", "1", "--threads", "1", "--nproc", "2",
            "--out", str(out), "--no-progress"]


def _gone(mark: str, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = processes.marked(MARK, mark)
        if not left:
            return []
        time.sleep(0.2)
    return processes.marked(MARK, mark)


def _environ(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _wait_running(mark: str, n: int, timeout: float = 120) -> None:
    """Until `n` marked processes run a training step (torchrun's ranks have started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = [p for p in processes.marked(MARK, mark) if "SUPEROFFLOAD_BENCH_RANK" in _environ(p)]
        if len(ranks) >= n:
            return
        time.sleep(0.2)
    raise AssertionError("the ranks did not start")


def test_a_guard_timeout_stops_every_rank_and_its_error_record_stays(tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "rec.json"
    guard = [sys.executable, str(GUARD), "record", "--out", str(out), "--log", str(tmp_path / "log.txt"),
             "--timeout", "20", "--system", "superoffload", "--model", "gpt-tiny", "--seq", "32", "--batch", "2",
             "--world-size", "2", "--", *bench(out)]
    # the guard's own 20 s limit is what is tested; this run's is progress-based (a loaded machine starts the
    # ranks late, a hang makes no progress)
    res = watchdog.run(guard, cwd=REPO, env=rank_env({MARK: mark}), warm_start=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _gone(mark) == [], "processes of the timed-out run survived"
    rec = json.loads(out.read_text())
    assert rec["status"] == "error" and "timed out" in rec["error"]
    time.sleep(3)
    assert json.loads(out.read_text()) == rec  # nobody came back to overwrite it
    assert not out.with_name(out.name + ".claim").exists()


def test_a_killed_launcher_takes_torchrun_and_the_ranks_with_it(tmp_path):
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(bench(tmp_path / "rec.json"), cwd=REPO, env=rank_env({MARK: mark}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_running(mark, 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(mark) == [], "torchrun or a rank outlived its launcher"


def test_a_run_whose_claim_was_revoked_does_not_write_its_record(tmp_path, monkeypatch):
    claim = tmp_path / "r.json.claim"
    claim.write_text("mine")
    monkeypatch.setenv(processes.CLAIM_ENV, "mine")
    monkeypatch.setenv(processes.CLAIM_FILE_ENV, str(claim))
    assert processes.claim_holds()
    claim.unlink()
    assert not processes.claim_holds()
    monkeypatch.delenv(processes.CLAIM_ENV)
    assert processes.claim_holds()  # not under a guard: always


def test_die_with_parent_kills_a_child_when_its_parent_exits():
    """A parent starts a child that asks for SIGKILL on its parent's death, then exits: the child goes."""
    child = ("import sys, time; from superoffload.harness.processes import die_with_parent; die_with_parent();"
             " print('ready', flush=True); time.sleep(60)")
    parent = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {child!r}], "
              "stdout=subprocess.PIPE, text=True); assert p.stdout.readline().strip() == 'ready'; "
              "print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", parent], cwd=REPO, env=rank_env(), capture_output=True, text=True,
                         timeout=60)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the child outlived its parent")
