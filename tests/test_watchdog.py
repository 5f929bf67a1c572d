"""tests/_watchdog.py: a run is stopped when it makes no progress, never because it is slow."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import _watchdog as W

# The limit these tests give: short, so the suite pays seconds for them. Each working run below lasts
# RUN_S > STALL_S and shows progress every TICK_S, a sixth of the limit: a loaded machine that delays a tick
# by a second still does not look stalled.
STALL_S, TICK_S, RUN_S = 1.5, 0.25, 2.5
TICKS = round(RUN_S / TICK_S)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_blocked_silent_process_is_killed_with_its_children(tmp_path: Path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    t0 = time.monotonic()
    with pytest.raises(W.Stalled, match=f"no progress for {STALL_S:g} s"):
        W.run(_py(code), stall_s=STALL_S)
    assert time.monotonic() - t0 < 60
    child = int(pidfile.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_run_longer_than_the_limit_that_keeps_printing_finishes():
    code = f"import time\nfor i in range({TICKS}):\n    print(i, flush=True); time.sleep({TICK_S})\nprint('done')"
    proc = W.run(_py(code), stall_s=STALL_S, cpu=False)
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "done"


def test_a_silent_run_that_computes_is_progress_only_with_cpu_on():
    code = f"import time\nt = time.monotonic()\nwhile time.monotonic() - t < {RUN_S}: pass\nprint('done')"
    assert W.run(_py(code), stall_s=STALL_S).stdout == "done\n"
    with pytest.raises(W.Stalled):
        W.run(_py(code), stall_s=STALL_S, cpu=False)


def test_files_written_under_a_watched_folder_are_progress(tmp_path: Path):
    out = tmp_path / "out"
    code = (f"import pathlib, time\nd = pathlib.Path({str(out)!r}); d.mkdir()\n"
            f"for i in range({TICKS}):\n    (d / f'{{i}}.txt').write_text('x'); time.sleep({TICK_S})")
    assert W.run(_py(code), stall_s=STALL_S, cpu=False, watch=[out]).returncode == 0
    with pytest.raises(W.Stalled):
        W.run(_py(code.replace("out'", "out2'")), stall_s=STALL_S, cpu=False, watch=[out])


def test_check_raises_on_a_failing_exit_and_a_short_command_costs_no_polling():
    t0 = time.monotonic()
    assert W.run(_py("print('hi')")).stdout == "hi\n"
    assert time.monotonic() - t0 < 30  # not a limit on the machine: a stuck poll loop would take forever
    with pytest.raises(subprocess.CalledProcessError):
        W.run(_py("raise SystemExit(3)"), check=True)
    assert W.run(_py("raise SystemExit(3)")).returncode == 3


def test_ranks_that_block_silently_are_killed_and_ranks_that_work_are_not(tmp_path: Path):
    """tests/ranks.py's launcher: a world that sleeps is stopped after `timeout` s without progress; a world
    that runs longer than that while writing its log runs to the end."""
    from tests.ranks import launch

    blocked = launch(2, lambda r: ["-c", "import time; time.sleep(600)"], tmp_path / "a", timeout=STALL_S)
    assert blocked.codes == [None, None] and max(blocked.wall_s) < 60
    code = f"import time\nfor i in range({TICKS}):\n    print(i, flush=True); time.sleep({TICK_S})"
    working = launch(2, lambda r: ["-c", code], tmp_path / "b", timeout=STALL_S)
    assert working.codes == [0, 0] and not working.failed()
