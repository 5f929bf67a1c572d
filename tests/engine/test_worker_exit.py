"""A script that ends while the host worker still has tasks (the last step's weight returns) lets them finish:
the worker is closed at exit, before the interpreter finalizes. Killed mid-task instead, a daemon thread inside
a torch call aborts the process ("terminate called without an active exception"), as TRL's SFTTrainer did."""

from __future__ import annotations

import subprocess
import sys

from tests.ranks import REPO, rank_env

SCRIPT = """
import sys, time, torch
from superoffload.device import get_device
from superoffload.engine.worker import HostWorker

w = HostWorker(get_device("host"))
base = torch.randn(1 << 16, requires_grad=True)

def task():
    time.sleep(0.5)  # the main thread is at exit by now
    for _ in range(200):
        v = base[: 1 << 15] * 2  # views and temporaries made and freed inside the task
        del v
    open(sys.argv[1], "w").write("done")

w.submit(task)
"""


def test_tasks_queued_at_exit_finish_and_the_process_exits_cleanly(tmp_path):
    marker = tmp_path / "marker"
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(marker)], cwd=REPO, env=rank_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert marker.read_text() == "done"  # without the exit hook the daemon thread dies before its task ends
