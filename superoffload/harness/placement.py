"""Per-rank host placement: each rank's process bound to its own slice of the host's cores.

On a GH200 node with four Superchips every Grace (72 cores, its LPDDR5X) is one NUMA node; a rank
that trains on Superchip k should run its host optimizer on Grace k's cores and allocate its host state
in Grace k's memory. ``bench run --bind-cores`` (``RunConfig.bind_cores``) does that per rank:

1. the cores this process may use (``os.sched_getaffinity``: all of them under torchrun, or what
   numactl / srun left it) are split by ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (``split_cores``);
   with NUMA information (``/sys/devices/system/node/node*/cpulist``) whole nodes go to ranks, one
   node per rank when there are as many nodes as ranks; otherwise the cores are cut into equal
   contiguous slices;
2. every thread of the process is bound to its slice (``bind``); threads started later (the engine's
   host worker, GraceAdam's pool, torch's OpenMP pool, DeepSpeed's CPU-Adam worker) inherit it, and
   Linux's default local allocation puts the memory they first touch on the slice's node;
3. one core of the slice is left for the Python thread and the communication proxy: the host
   optimizer gets ``len(slice) - 1`` threads (at least 1), ``Placement.host_threads``.

Engine users outside the harness do the same with::

    placement = bind_this_rank()                   # under torchrun
    engine = superoffload.initialize(model, {**config, **placement.engine_config()})
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NODE_ROOT = Path("/sys/devices/system/node")


@dataclass(frozen=True)
class Placement:
    """Where one rank runs: its cores, their NUMA nodes and the host optimizer's thread count."""

    local_rank: int
    local_world: int
    cores: list[int]
    numa_nodes: list[int] = field(default_factory=list)
    method: str = "split"  # "numa": whole NUMA nodes per rank; "split": equal contiguous slices
    host_threads: int = 1
    bound: bool = False  # whether os.sched_setaffinity was applied

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def engine_config(self) -> dict[str, Any]:
        """The SuperOffload engine config keys this placement sets."""
        return {"host_threads": self.host_threads}


def parse_cpulist(text: str) -> list[int]:
    """A kernel cpulist ("0-3,8,10-11") as a sorted list of core ids; empty text gives []."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"not a cpulist: {text!r}") from None
        if b < a:
            raise ValueError(f"not a cpulist: {text!r}")
        out.update(range(a, b + 1))
    return sorted(out)


def numa_nodes(root: str | os.PathLike[str] = NODE_ROOT) -> dict[int, list[int]]:
    """NUMA node -> its cores, from sysfs; nodes without cores (a GH200's HBM node) are left out.
    Empty when the machine does not expose NUMA information."""
    nodes: dict[int, list[int]] = {}
    base = Path(root)
    if not base.is_dir():
        return nodes
    for d in sorted(base.glob("node[0-9]*")):
        try:
            cores = parse_cpulist((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cores:
            nodes[int(d.name.removeprefix("node"))] = cores
    return nodes


def split_cores(available: Sequence[int], local_rank: int, local_world: int,
                nodes: Mapping[int, Sequence[int]] | None = None) -> tuple[list[int], list[int], str]:
    """This rank's cores: (cores, their NUMA nodes, method). Pure: the same inputs give the same slice.

    With at least as many NUMA nodes (that hold available cores) as ranks, the nodes are dealt out in
    contiguous groups (one node per rank when the counts match, as on a 4-Superchip GH200 node).
    Otherwise the sorted available cores are cut into ``local_world`` contiguous slices whose sizes
    differ by at most one. Raises ValueError when there are fewer cores than ranks.
    """
    if local_world < 1 or not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} of {local_world} is not a valid rank")
    avail = sorted(set(available))
    if len(avail) < local_world:
        raise ValueError(f"{local_world} ranks need at least one core each; {len(avail)} available")
    aset = set(avail)
    usable = {n: sorted(c for c in cores if c in aset) for n, cores in sorted((nodes or {}).items())}
    usable = {n: c for n, c in usable.items() if c}
    core_node = {c: n for n, cores in usable.items() for c in cores}
    if len(usable) >= local_world and len(usable) > 1:
        ids = sorted(usable)
        lo, hi = local_rank * len(ids) // local_world, (local_rank + 1) * len(ids) // local_world
        mine = ids[lo:hi]
        return sorted(c for n in mine for c in usable[n]), mine, "numa"
    base, extra = divmod(len(avail), local_world)
    start = local_rank * base + min(local_rank, extra)
    cores = avail[start:start + base + (1 if local_rank < extra else 0)]
    return cores, sorted({core_node[c] for c in cores if c in core_node}), "split"


def host_threads_for(cores: Sequence[int]) -> int:
    """Host optimizer threads on a slice: one core stays with the Python thread and the communication
    proxy, at least one thread."""
    return max(1, len(cores) - 1)


@dataclass(frozen=True)
class RankHost:
    """What the planner is told about one rank's host (``make_plan(cores_per_rank=, compute_threads=,
    host_threads=)``): its cores, the threads its compute runs on and the host optimizer's threads."""

    cores_per_rank: float
    compute_threads: int
    host_threads: int | None

    def plan_kwargs(self) -> dict[str, Any]:
        return asdict(self)


def rank_host(available: int, local_world: int, bind_cores: bool, compute_threads: int,
              host_threads: int | None) -> RankHost:
    """One rank's host as ``bench run`` sets it up, from the CPUs the job may use (``available``), the ranks of
    this host, ``--bind-cores``, the compute threads (torch's pool) and the engine's ``host_threads`` (None:
    the run's ``--threads`` or, bound, the slice's cores minus one, as ``_place`` sets it; None when neither
    is set). Bound, a rank gets its slice (``split_cores``: the smallest slice when they differ); unbound the
    ranks share every CPU, a fair share each. Pure, so ``plan_optimality`` plans exactly as the run does."""
    ranks = max(1, local_world)
    if bind_cores:
        cores: float = float(max(1, available // ranks))
        host = host_threads if host_threads is not None else host_threads_for(range(int(cores)))
    else:
        cores, host = available / ranks, host_threads
    return RankHost(cores_per_rank=cores, compute_threads=max(1, compute_threads), host_threads=host)


def bind(cores: Sequence[int]) -> None:
    """Bind every thread of this process (and so everything it starts later) to ``cores``."""
    mask = set(cores)
    os.sched_setaffinity(0, mask)
    task_dir = Path("/proc/self/task")
    if task_dir.is_dir():
        for t in task_dir.iterdir():
            with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(t.name), mask)


def local_rank_and_world(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) as torchrun sets them; (0, 1) outside torchrun."""
    env = os.environ if env is None else env
    rank = int(env.get("LOCAL_RANK", "0"))
    world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    return rank, world


def plan_placement(local_rank: int | None = None, local_world: int | None = None,
                   available: Sequence[int] | None = None,
                   nodes: Mapping[int, Sequence[int]] | None = None) -> Placement:
    """The placement of this rank without applying it (defaults: torchrun's env, this process's
    affinity, sysfs NUMA nodes)."""
    env_rank, env_world = local_rank_and_world()
    rank = env_rank if local_rank is None else local_rank
    world = env_world if local_world is None else local_world
    avail = sorted(os.sched_getaffinity(0)) if available is None else list(available)
    cores, node_ids, method = split_cores(avail, rank, world, numa_nodes() if nodes is None else nodes)
    return Placement(local_rank=rank, local_world=world, cores=cores, numa_nodes=node_ids, method=method,
                     host_threads=host_threads_for(cores))


def bind_this_rank(**kw: Any) -> Placement:
    """Plan this rank's placement (see ``plan_placement``) and bind the process to it."""
    p = plan_placement(**kw)
    bind(p.cores)
    return Placement(**{**p.to_dict(), "bound": True})


def current_placement() -> dict[str, Any]:
    """What a run without --bind-cores records: the cores it may use, unbound by us."""
    cores = sorted(os.sched_getaffinity(0))
    nodes = numa_nodes()
    return {"cores": cores, "numa_nodes": sorted({n for n, cs in nodes.items() if set(cs) & set(cores)}),
            "bound": False}
