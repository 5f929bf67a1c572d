"""The pool growing at a job under a pinned configuration (the caller then does not work itself) runs the job:
a worker created for a job takes it even when the job is published before the worker first runs (it used to
read the generation then, wait for the next job, and leave the caller waiting forever)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import grace_adam

SCRIPT = """
import os, torch, grace_adam
cpu = sorted(os.sched_getaffinity(0))[0]
grace_adam.set_affinity([cpu])          # pinned: the caller hands the job to the workers
for n in (2, 3, 4):                     # each job first creates a worker, then publishes at once
    grace_adam.set_num_threads(n)
    p, g, m, v = (torch.rand(1 << 16) for _ in range(4))
    grace_adam.adam_step(p, g, m, v, step=1, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
print("ok")
"""


@pytest.mark.skipif(not grace_adam.native_available() or not hasattr(os, "sched_getaffinity"),
                    reason="the native pool, pinned (Linux)")
def test_a_pool_that_grows_at_a_job_runs_it():
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True) for _ in range(6)]
    for p in procs:
        try:
            out, _ = p.communicate(timeout=300)  # a hang guard: each takes about a second
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a GraceAdam job never finished: the pool lost a worker's wake-up")
        assert p.returncode == 0 and out.strip() == "ok"
