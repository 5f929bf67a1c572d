"""Start one multi-chip run inside a job: `bench run --nproc N` when the ranks fit one node, else one
torchrun per node with srun (Slurm), every rank running the same `superoffload bench run` arguments.

    launch_ranks.py --chips 16 --gpus-per-node 4 [--port 29500] [--dry-run] -- bench run --system ... --out R.json

Multi-node: `srun --nodes=K --ntasks=K --ntasks-per-node=1 python -m torch.distributed.run --nnodes=K
--nproc_per_node=G --rdzv-backend=c10d --rdzv-endpoint=<this host>:<port> --rdzv-id=<job id> -m
superoffload bench run ...`: the rendezvous runs on the node that started the job script (the first of
the allocation), which all torchruns reach over the cluster network. Rank 0 writes the record; the
workflow's guard writes an error record when none appears. `--dry-run` prints the command instead.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys


def command(chips: int, gpus_per_node: int, port: int, bench: list[str], env: dict[str, str] | None = None,
            python: str = sys.executable, host: str | None = None) -> list[str]:
    env = os.environ if env is None else env
    nodes = -(-chips // gpus_per_node)
    per_node = min(chips, gpus_per_node)
    if chips % per_node:
        raise ValueError(f"{chips} chips do not fill nodes of {gpus_per_node} GPUs evenly")
    if nodes == 1:
        return [python, "-m", "superoffload", *bench, "--nproc", str(chips)]
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise ValueError(f"{chips} chips need {nodes} nodes: run inside a Slurm allocation (the slurm profile)")
    have = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or nodes)
    if have < nodes:
        raise ValueError(f"{chips} chips need {nodes} nodes; the allocation has {have}")
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            python, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc_per_node={per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={host or socket.gethostname()}:{port}", f"--rdzv-id={job}",
            "-m", "superoffload", *bench]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("launch_ranks.py: expected `--` before the bench run arguments", file=sys.stderr)
        return 2
    i = argv.index("--")
    p = argparse.ArgumentParser(prog="launch_ranks.py")
    p.add_argument("--chips", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv[:i])
    try:
        cmd = command(a.chips, a.gpus_per_node, a.port, argv[i + 1:])
    except ValueError as e:
        print(f"launch_ranks.py: error: {e}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(shlex.join(cmd))
        return 0
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
