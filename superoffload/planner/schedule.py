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


@dataclass(slots=True)
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
    same core).

    The ops are held as columns (one list per field, indexed by op id): the cost model builds a graph of
    thousands of ops per prediction and hundreds of predictions per plan, and building an object per op cost
    them ~14 % (docs/results.md, twentieth session). ``ops`` gives them as ``Op`` records, for reading."""

    def __init__(self, aliases: dict[str, str] | None = None) -> None:
        self.names: list[str] = []
        self.resources: list[str | None] = []
        self.durations: list[float] = []
        self.deps: list[list[int]] = []
        self.kinds: list[str] = []
        self.iterations: list[int] = []
        self.priorities: list[float] = []
        self.aliases = dict(aliases or {})

    def add(self, name: str, resource: str | None, duration: float, deps: list[int] | None = None,
            kind: str = "", iteration: int = 0, priority: float | None = None) -> int:
        if duration < 0:
            raise ValueError(f"op {name!r} has negative duration {duration}")
        oid = len(self.names)
        if deps:  # checked in bulk: one min and one max per op
            deps = [d for d in deps if d is not None] if None in deps else list(deps)  # the op's own list
            if deps and (min(deps) < 0 or max(deps) >= oid):
                bad = next(d for d in deps if not 0 <= d < oid)
                raise ValueError(f"op {name!r} depends on unknown op id {bad}")
        else:
            deps = []
        if resource is not None and self.aliases:
            resource = self.aliases.get(resource, resource)
        self.names.append(name)
        self.resources.append(resource)
        self.durations.append(duration)
        self.deps.append(deps)
        self.kinds.append(kind)
        self.iterations.append(iteration)
        self.priorities.append(float(oid) if priority is None else priority)
        return oid

    def barrier(self, name: str, deps: list[int], iteration: int = 0) -> int:
        return self.add(name, None, 0.0, deps, kind="barrier", iteration=iteration)

    @property
    def ops(self) -> list[Op]:
        """The ops as records (built on each call: for reading, not for the hot path)."""
        return [Op(*row) for row in zip(self.names, self.resources, self.durations, self.deps, self.kinds,
                                        self.iterations, self.priorities, strict=True)]

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class Schedule:
    start: list[float]
    finish: list[float]
    graph: Graph

    @property
    def makespan(self) -> float:
        return max(self.finish, default=0.0)

    def busy(self, resource: str, iteration: int | None = None) -> float:
        g = self.graph
        return sum(d for d, r, it in zip(g.durations, g.resources, g.iterations, strict=True)
                   if r == resource and (iteration is None or it == iteration))

    def idle(self, resource: str, t0: float, t1: float) -> float:
        """Seconds in [t0, t1] during which ``resource`` runs nothing."""
        covered = 0.0
        for r, s, f in zip(self.graph.resources, self.start, self.finish, strict=True):
            if r == resource:
                covered += max(0.0, min(f, t1) - max(s, t0))
        return max(0.0, (t1 - t0) - covered)

    def kind_time(self, iteration: int | None = None) -> dict[str, float]:
        g = self.graph
        out: dict[str, float] = defaultdict(float)
        for k, d, it in zip(g.kinds, g.durations, g.iterations, strict=True):
            if k != "barrier" and (iteration is None or it == iteration):
                out[k] += d
        return dict(out)


def simulate(graph: Graph) -> Schedule:
    """Run the list scheduler; raises ValueError on a dependency cycle."""
    n = len(graph)
    resource, duration, priority = graph.resources, graph.durations, graph.priorities
    succ: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(d) for d in graph.deps]
    for i, deps in enumerate(graph.deps):
        for d in deps:
            succ[d].append(i)
    start = [0.0] * n
    finish = [0.0] * n
    ready: dict[str | None, list[tuple[float, int]]] = defaultdict(list)
    busy: set[str] = set()
    running: list[tuple[float, int, int]] = []  # (finish time, tie-break, op)
    push, pop = heapq.heappush, heapq.heappop
    counter = 0
    now = 0.0
    done = 0

    for i in range(n):
        if waiting[i] == 0:
            push(ready[resource[i]], (priority[i], i))
    # the resources whose state changed since they were last looked at (an op became ready on one, or
    # one finished an op): only they can start something
    changed: set[str | None] = set(ready)

    while True:
        # start everything that can start at `now`
        for res in changed:
            queue = ready[res]
            if res is None:
                while queue:
                    _, i = pop(queue)
                    start[i] = now
                    counter += 1
                    push(running, (now + duration[i], counter, i))
            elif queue and res not in busy:
                _, i = pop(queue)
                busy.add(res)
                start[i] = now
                counter += 1
                push(running, (now + duration[i], counter, i))
        changed.clear()
        if not running:
            break
        # complete every op that finishes at the next event time
        now = running[0][0]
        while running and running[0][0] <= now:
            t, _, i = pop(running)
            finish[i] = t
            done += 1
            res = resource[i]
            if res is not None:
                busy.discard(res)
                changed.add(res)
            for s in succ[i]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    push(ready[resource[s]], (priority[s], s))
                    changed.add(resource[s])
    if done != n:
        stuck = [graph.names[i] for i in range(n) if waiting[i] > 0][:5]
        raise ValueError(f"dependency cycle: {n - done} ops never became ready, e.g. {stuck}")
    return Schedule(start, finish, graph)
