"""Per-rank host placement (--bind-cores): the core split is a pure function of the available cores, the
rank and the NUMA nodes; binding happens in a child process so this test process keeps its cores."""

from __future__ import annotations

import json
import os
import sys

import pytest

from superoffload.harness import placement as pl
from tests import _watchdog as watchdog

GRACE = 72  # cores per Grace; one NUMA node per Grace


def _gh200_node(superchips: int = 4) -> dict[int, list[int]]:
    """A GH200 node as sysfs shows it: one node per Grace with its cores; the HBM nodes have none."""
    return {i: list(range(i * GRACE, (i + 1) * GRACE)) for i in range(superchips)}


def test_parse_cpulist() -> None:
    assert pl.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert pl.parse_cpulist("") == []
    assert pl.parse_cpulist("5") == [5]
    for bad in ("a-b", "3-1"):
        with pytest.raises(ValueError):
            pl.parse_cpulist(bad)


def test_four_ranks_on_a_gh200_node_get_one_grace_each() -> None:
    nodes = _gh200_node()
    cores = [c for cs in nodes.values() for c in cs]
    seen: set[int] = set()
    for rank in range(4):
        mine, node_ids, method = pl.split_cores(cores, rank, 4, nodes)
        assert method == "numa" and node_ids == [rank]
        assert mine == list(range(rank * GRACE, (rank + 1) * GRACE))
        assert pl.host_threads_for(mine) == GRACE - 1  # one core for Python and the communication proxy
        assert not seen & set(mine)
        seen |= set(mine)
    assert seen == set(cores)


def test_two_ranks_on_four_nodes_get_two_nodes_each() -> None:
    nodes = _gh200_node()
    cores = [c for cs in nodes.values() for c in cs]
    assert pl.split_cores(cores, 1, 2, nodes)[1] == [2, 3]


def test_more_ranks_than_nodes_split_the_cores_evenly() -> None:
    nodes = {0: list(range(8)), 1: list(range(8, 16))}
    slices = [pl.split_cores(range(16), r, 4, nodes) for r in range(4)]
    assert [s[0] for s in slices] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert [s[1] for s in slices] == [[0], [0], [1], [1]]
    assert {s[2] for s in slices} == {"split"}


def test_uneven_split_without_numa_information() -> None:
    slices = [pl.split_cores([0, 1, 2, 3, 4], r, 2)[0] for r in range(2)]
    assert slices == [[0, 1, 2], [3, 4]]
    assert pl.host_threads_for([7]) == 1  # a one-core slice still gets one host thread


def test_only_the_available_cores_are_dealt_out() -> None:
    """numactl / srun may have restricted the process: nodes are cut down to what it may use."""
    nodes = _gh200_node()
    allowed = list(range(72, 144)) + list(range(216, 288))  # Graces 1 and 3 only
    assert pl.split_cores(allowed, 0, 2, nodes)[:2] == (list(range(72, 144)), [1])
    assert pl.split_cores(allowed, 1, 2, nodes)[:2] == (list(range(216, 288)), [3])


def test_errors() -> None:
    with pytest.raises(ValueError, match="at least one core"):
        pl.split_cores([0, 1], 0, 3)
    with pytest.raises(ValueError, match="not a valid rank"):
        pl.split_cores([0, 1], 2, 2)


def test_numa_nodes_from_sysfs(tmp_path) -> None:
    for node, cpus in (("node0", "0-3"), ("node1", "4-7"), ("node4", "")):  # node4: HBM, no CPUs
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus + "\n")
    assert pl.numa_nodes(tmp_path) == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    assert pl.numa_nodes(tmp_path / "missing") == {}


def test_local_rank_and_world_from_torchrun_env() -> None:
    assert pl.local_rank_and_world({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == (1, 2)
    assert pl.local_rank_and_world({}) == (0, 1)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity API")
def test_bind_this_rank_binds_every_thread_of_the_process() -> None:
    """In a child: rank 1 of 2 binds to its slice; a thread started before the binding is moved too."""
    avail = sorted(os.sched_getaffinity(0))
    if len(avail) < 2:
        pytest.skip("needs two cores")
    code = (
        "import json, os, threading, time\n"
        "from superoffload.harness import placement as pl\n"
        "ev = threading.Event(); seen = {}\n"
        "def worker():\n"
        "    ev.wait(); seen['thread'] = sorted(os.sched_getaffinity(0))\n"
        "t = threading.Thread(target=worker); t.start(); time.sleep(0.05)\n"
        "p = pl.bind_this_rank()\n"
        "ev.set(); t.join()\n"
        "print(json.dumps({'placement': p.to_dict(), 'main': sorted(os.sched_getaffinity(0)), **seen}))\n"
    )
    env = {**os.environ, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    out = watchdog.run([sys.executable, "-c", code], env=env, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    expect = pl.split_cores(avail, 1, 2, pl.numa_nodes())[0]
    assert got["placement"]["cores"] == expect and got["placement"]["bound"] is True
    assert got["main"] == expect and got["thread"] == expect
    assert got["placement"]["host_threads"] == max(1, len(expect) - 1)
    assert pl.Placement(**got["placement"]).engine_config() == {"host_threads": max(1, len(expect) - 1)}


def test_the_host_a_rank_plans_for_is_the_one_bench_run_gives_it() -> None:
    # bound: a rank's slice; the host optimizer gets the slice minus one core (at least one)
    assert pl.rank_host(8, 2, True, 1, None) == pl.RankHost(4.0, 1, 3)
    assert pl.rank_host(2, 2, True, 1, None) == pl.RankHost(1.0, 1, 1)
    assert pl.rank_host(8, 2, True, 2, 2).host_threads == 2  # set explicitly: kept
    # unbound: the ranks share every CPU, a fair share each; the host threads are the run's
    assert pl.rank_host(2, 2, False, 1, 1) == pl.RankHost(1.0, 1, 1)
    assert pl.rank_host(3, 2, False, 1, None) == pl.RankHost(1.5, 1, None)
    assert pl.rank_host(2, 1, False, 4, 4).plan_kwargs() == {"cores_per_rank": 2.0, "compute_threads": 4,
                                                             "host_threads": 4}
