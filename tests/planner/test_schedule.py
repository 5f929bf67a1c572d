"""The list scheduler on hand-built graphs with hand-computed makespans."""

from __future__ import annotations

import pytest

from superoffload.planner.schedule import COMPUTE, D2H, HOST, Graph, simulate


def test_serial_chain_adds_up() -> None:
    g = Graph()
    a = g.add("a", COMPUTE, 1.0)
    b = g.add("b", COMPUTE, 2.0, [a])
    g.add("c", COMPUTE, 3.0, [b])
    s = simulate(g)
    assert s.makespan == pytest.approx(6.0)
    assert s.start == pytest.approx([0.0, 1.0, 3.0])


def test_independent_resources_overlap() -> None:
    g = Graph()
    g.add("gpu", COMPUTE, 4.0)
    g.add("cpu", HOST, 3.0)
    s = simulate(g)
    assert s.makespan == pytest.approx(4.0)
    assert s.idle(HOST, 0.0, 4.0) == pytest.approx(1.0)


def test_same_resource_is_exclusive_even_without_dependencies() -> None:
    g = Graph()
    g.add("x", HOST, 2.0)
    g.add("y", HOST, 2.0)
    s = simulate(g)
    assert s.makespan == pytest.approx(4.0)
    assert sorted(s.start) == pytest.approx([0.0, 2.0])


def test_dependency_across_resources_pipelines() -> None:
    # compute produces 3 buckets (1 s each); each is copied (0.5 s) then stepped on the host (2 s).
    # host: starts at 1.5, runs back to back: 1.5-3.5, 3.5-5.5, 5.5-7.5
    g = Graph()
    prev = None
    for j in range(3):
        prev = g.add(f"bwd{j}", COMPUTE, 1.0, [prev] if prev is not None else [])
        cp = g.add(f"d2h{j}", D2H, 0.5, [prev])
        g.add(f"adam{j}", HOST, 2.0, [cp])
    s = simulate(g)
    assert s.makespan == pytest.approx(7.5)
    assert s.busy(HOST) == pytest.approx(6.0)


def test_priority_orders_a_contended_resource() -> None:
    g = Graph()
    g.add("late", COMPUTE, 1.0, priority=5)
    g.add("early", COMPUTE, 1.0, priority=1)
    s = simulate(g)
    assert s.start[1] == 0.0 and s.start[0] == 1.0


def test_barrier_costs_nothing_and_joins() -> None:
    g = Graph()
    a = g.add("a", COMPUTE, 1.0)
    b = g.add("b", HOST, 2.5)
    j = g.barrier("join", [a, b])
    g.add("after", COMPUTE, 1.0, [j])
    assert simulate(g).makespan == pytest.approx(3.5)


def test_bad_graphs_are_rejected() -> None:
    g = Graph()
    with pytest.raises(ValueError):
        g.add("neg", COMPUTE, -1.0)
    with pytest.raises(ValueError):
        g.add("dangling", COMPUTE, 1.0, [7])
    a = g.add("a", COMPUTE, 1.0)
    b = g.add("b", COMPUTE, 1.0, [a])
    g.ops[a].deps.append(b)  # forge a cycle
    with pytest.raises(ValueError, match="cycle"):
        simulate(g)


def test_ops_are_read_back_as_records_with_aliases_applied() -> None:
    g = Graph(aliases={HOST: COMPUTE})
    a = g.add("a", COMPUTE, 1.0, kind="forward")
    b = g.add("b", HOST, 2.0, [a, None], kind="host_adam", iteration=1)
    g.barrier("end", [b])
    assert [(o.name, o.resource, o.duration, o.deps, o.kind, o.iteration, o.priority) for o in g.ops] == [
        ("a", COMPUTE, 1.0, [], "forward", 0, 0.0), ("b", COMPUTE, 2.0, [0], "host_adam", 1, 1.0),
        ("end", None, 0.0, [1], "barrier", 0, 2.0)]
    s = simulate(g)  # the host op runs on the compute stream it is aliased to: after a
    assert s.finish == [1.0, 3.0, 3.0] and s.busy(COMPUTE) == 3.0 and s.kind_time(1) == {"host_adam": 2.0}
    assert s.idle(COMPUTE, 0.0, 4.0) == 1.0
