"""Liquid's placement: the grouping GA for bursts and the network-aware gang spread."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy.place.grouping_ga import Bin, Budget, _Packing, pack
from schedd.policy.place.network import spread_cost
from schedd.policy.settings import Settings
from schedd.policy.snapshot import Shard
from schedd.policy.view import View
from tests.unit.policy_harness import launches, node, pending, placed, run, snapshot

# Two nodes with 6 free GPUs and jobs of 2, 3, 4 and 3 GPUs, in that order: one by one,
# the fullest node that takes each leaves the last 3 without room; {2, 4} and {3, 3} fit.
FIRST_FIT_STRANDS = [("a", 2), ("b", 3), ("c", 4), ("d", 3)]
TWO_SIXES = [Bin("n0", 8, 6), Bin("n1", 8, 6)]


def _seated(assignment: dict[str, str], items: list[tuple[str, int]], bins: list[Bin]) -> dict:
    used = {b.node_id: 0 for b in bins}
    sizes = dict(items)
    for job_id, node_id in assignment.items():
        used[node_id] += sizes[job_id]
    return used


def test_the_ga_seats_a_burst_that_first_fit_strands() -> None:
    first = _Packing([n for _, n in FIRST_FIT_STRANDS], TWO_SIXES)
    first.first_fit(range(4), [0, 1])
    assert first.where.count(-1) == 1  # the starting point misses one
    assignment = pack(FIRST_FIT_STRANDS, TWO_SIXES, seed=7)
    assert set(assignment) == {"a", "b", "c", "d"}
    assert _seated(assignment, FIRST_FIT_STRANDS, TWO_SIXES) == {"n0": 6, "n1": 6}


PACK_IN_A_PROCESS = """
from schedd.policy.place.grouping_ga import Bin, pack
items = [(f"j{i}", 1 + i % 4) for i in range(20)]
bins = [Bin(f"n{i}", 8, 1 + i % 8) for i in range(12)]
print(sorted(pack(items, bins, seed=3).items()))
"""


def test_the_ga_places_alike_in_every_process() -> None:
    """Replays must not depend on the process: string hashing (set and dict order of
    job and node names) is seeded per process, so two hash seeds must agree."""
    runs = {
        subprocess.run(
            [sys.executable, "-c", PACK_IN_A_PROCESS],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(runs) == 1 and "j0" in runs.pop()


def test_the_ga_fills_a_busy_node_before_an_idle_one() -> None:
    # Tried in this order, first fit puts the 2-GPU job on an idle node; on the node with
    # 2 free it completes that node and leaves one idle node whole.
    bins = [Bin("idle1", 8, 8), Bin("idle2", 8, 8), Bin("busy", 8, 2)]
    assignment = pack([("small", 2), ("whole", 8)], bins, seed=1)
    assert assignment["small"] == "busy"
    assert assignment["whole"] in {"idle1", "idle2"}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 8), min_size=1, max_size=24),
    st.lists(st.integers(0, 8), min_size=1, max_size=10),
    st.integers(0, 2**16),
)
def test_the_ga_never_overfills_and_never_seats_fewer_gpus_than_first_fit(
    sizes: list[int], frees: list[int], seed: int
) -> None:
    items = [(f"j{i}", n) for i, n in enumerate(sizes)]
    bins = [Bin(f"n{i}", 8, f) for i, f in enumerate(frees)]
    assignment = pack(items, bins, seed=seed, budget=Budget(generations=5, population=4))
    used = _seated(assignment, items, bins)
    assert all(used[b.node_id] <= b.free for b in bins)
    first = _Packing(sizes, bins)
    first.first_fit(range(len(sizes)), range(len(bins)))
    assert sum(used.values()) >= first.fitness()[0]


def test_a_liquid_plan_launches_the_whole_burst() -> None:
    nodes = [node("n0", 8), node("n1", 8)]
    busy = [placed("x", nodes[0], [6, 7]), placed("y", nodes[1], [6, 7])]
    burst = [pending(j, n, at=100.0 + i) for i, (j, n) in enumerate(FIRST_FIT_STRANDS)]
    plan = run("liquid", snapshot(nodes, burst, busy), now=110.0)
    assert set(launches(plan)) == {"a", "b", "c", "d"}
    # Arrivals too far apart are no burst: one by one, the last waits.
    plan = run("liquid", snapshot(nodes, burst, busy), now=110.0, batch_window_s=5.0)
    assert set(launches(plan)) == {"a", "b", "c"}


def test_a_gang_goes_where_its_spread_costs_least() -> None:
    # Rack r0: three idle nodes. Rack r1: four nodes with 4 free GPUs each, the rack with
    # the fewest free GPUs that holds 16 (topology's choice), but over four nodes.
    r0 = [node(f"a{i}", 8, rack="r0") for i in range(3)]
    r1 = [node(f"b{i}", 8, rack="r1") for i in range(4)]
    busy = [placed(f"x{i}", n, [4, 5, 6, 7]) for i, n in enumerate(r1)]
    snap = snapshot([*r0, *r1], [pending("gang", 16)], busy, multi_node=True)
    liquid = launches(run("liquid", snap))["gang"]
    assert sorted(s.node_id for s in liquid.shards) == ["a0", "a1"]
    topology = launches(run("default", snap))["gang"]
    assert len(topology.shards) == 4


def test_the_spread_cost_counts_nodes_racks_and_domains() -> None:
    nodes = [
        node("a", 8, rack="r0", domain="d0"),
        node("b", 8, rack="r0", domain="d0"),
        node("c", 8, rack="r1", domain="d0"),
        node("d", 8, rack="r2", domain="d1"),
    ]
    view = View.build(snapshot(nodes, []), 0.0, Settings())

    def cost(*ids: str) -> float:
        return spread_cost(tuple(Shard(i, ()) for i in ids), view)

    assert cost("a") == 0.0
    assert cost("a", "b") == 1.0  # one more node
    assert cost("a", "c") == 1.0 + 4.0  # and another rack
    assert cost("a", "d") == 1.0 + 4.0 + 16.0  # and another domain
