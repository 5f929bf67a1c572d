"""stop_group ends a process group without waiting out its grace period for a leader that already exited."""

from __future__ import annotations

import subprocess
import sys
import time

from superoffload.harness import processes


def test_stop_group_reaps_the_leader_instead_of_waiting_for_its_zombie():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    t0 = time.monotonic()
    processes.stop_group(proc.pid, grace_s=120.0, leader=proc)
    # without reaping, the exited leader stays a zombie group member and the wait runs the whole 120 s
    assert proc.returncode is not None
    assert time.monotonic() - t0 < 60
