"""A data-flow graph of timed ops and a list scheduler for it.

Each op runs on one resource (a CUDA stream, a link direction, the host CPU pool) or on none (a
zero-cost barrier). A resource runs one op at a time; an op starts when all its dependencies have
finished and its resource is free. When several ready ops wait for the same resource, the one with
the lowest priority number (by default: the order ops were added) goes first, which mimics a stream's
issue order and a worker queue's FIFO. The simulation is event driven: O(n log n) in the op count.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

# Resource names used by the cost model.
COMPUTE = "compute"  # the device's compute stream (kernels that fill the SMs)
D2H = "d2h"  # device -> host copy engine / link direction
H2D = "h2d"  # host -> device
HOST = "host"  # the host CPU pool running optimizer steps and casts
NET = "net"  # the collectives between chips (one communication stream; several chips only)
RESOURCES = (COMPUTE, D2H, H2D, HOST, NET)


@dataclass
class Op:
    name: str
    resource: str | None
    duration: float
    deps: list[int] = field(default_factory=list)
    kind: str = ""  # stage label, e.g. "forward", "d2h", "host_adam"
    iteration: int = 0
    priority: float = 0.0


class Graph:
    """Ops in insertion order; ``add`` returns the op's id for use as a dependency. ``aliases`` maps a
    resource onto another that runs its ops (e.g. the host pool onto the compute stream when both are the
    same core)."""

    def __init__(self, aliases: dict[str, str] | None = None) -> None:
        self.ops: list[Op] = []
        self.aliases = dict(aliases or {})

    def add(self, name: str, resource: str | None, duration: float, deps: list[int] | None = None,
            kind: str = "", iteration: int = 0, priority: float | None = None) -> int:
        if duration < 0:
            raise ValueError(f"op {name!r} has negative duration {duration}")
        deps = [d for d in (deps or []) if d is not None]
        for d in deps:
            if not 0 <= d < len(self.ops):
                raise ValueError(f"op {name!r} depends on unknown op id {d}")
        oid = len(self.ops)
        resource = self.aliases.get(resource, resource) if resource is not None else None
        self.ops.append(Op(name, resource, duration, deps, kind, iteration,
                           float(oid) if priority is None else priority))
        return oid

    def barrier(self, name: str, deps: list[int], iteration: int = 0) -> int:
        return self.add(name, None, 0.0, deps, kind="barrier", iteration=iteration)

    def __len__(self) -> int:
        return len(self.ops)


@dataclass
class Schedule:
    start: list[float]
    finish: list[float]
    graph: Graph

    @property
    def makespan(self) -> float:
        return max(self.finish, default=0.0)

    def busy(self, resource: str, iteration: int | None = None) -> float:
        return sum(op.duration for op in self.graph.ops
                   if op.resource == resource and (iteration is None or op.iteration == iteration))

    def idle(self, resource: str, t0: float, t1: float) -> float:
        """Seconds in [t0, t1] during which ``resource`` runs nothing."""
        covered = 0.0
        for i, op in enumerate(self.graph.ops):
            if op.resource == resource:
                covered += max(0.0, min(self.finish[i], t1) - max(self.start[i], t0))
        return max(0.0, (t1 - t0) - covered)

    def kind_time(self, iteration: int | None = None) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for op in self.graph.ops:
            if op.kind != "barrier" and (iteration is None or op.iteration == iteration):
                out[op.kind] += op.duration
        return dict(out)


def simulate(graph: Graph) -> Schedule:
    """Run the list scheduler; raises ValueError on a dependency cycle."""
    n = len(graph.ops)
    succ: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for i, op in enumerate(graph.ops):
        waiting[i] = len(op.deps)
        for d in op.deps:
            succ[d].append(i)
    start = [0.0] * n
    finish = [0.0] * n
    ready: dict[str | None, list[tuple[float, int]]] = defaultdict(list)
    busy_until: dict[str, bool] = {}
    running: list[tuple[float, int, int]] = []  # (finish time, tie-break, op)
    counter = 0
    now = 0.0
    done = 0

    def release(i: int) -> None:
        heapq.heappush(ready[graph.ops[i].resource], (graph.ops[i].priority, i))

    for i in range(n):
        if waiting[i] == 0:
            release(i)

    while True:
        # start everything that can start at `now`
        for res, queue in ready.items():
            if res is None:
                while queue:
                    _, i = heapq.heappop(queue)
                    start[i] = now
                    counter += 1
                    heapq.heappush(running, (now + graph.ops[i].duration, counter, i))
            elif queue and not busy_until.get(res, False):
                _, i = heapq.heappop(queue)
                busy_until[res] = True
                start[i] = now
                counter += 1
                heapq.heappush(running, (now + graph.ops[i].duration, counter, i))
        if not running:
            break
        # complete every op that finishes at the next event time
        now = running[0][0]
        while running and running[0][0] <= now:
            t, _, i = heapq.heappop(running)
            finish[i] = t
            done += 1
            res = graph.ops[i].resource
            if res is not None:
                busy_until[res] = False
            for s in succ[i]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    release(s)
    if done != n:
        stuck = [graph.ops[i].name for i in range(n) if waiting[i] > 0][:5]
        raise ValueError(f"dependency cycle: {n - done} ops never became ready, e.g. {stuck}")
    return Schedule(start, finish, graph)
