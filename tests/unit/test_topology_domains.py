"""Topology-aware placement of a gang too large for a rack: within one domain."""

from __future__ import annotations

import pytest

from tests.unit.policy_harness import launches, node, pending, placed, run, snapshot

# Two domains of two racks of two 4-GPU nodes. d0's nodes but n1 run a 1-GPU job each:
# 13 free GPUs, no rack more than 7. d1 is idle but its 8 free GPUs are too few for 12.
D0 = [
    node("n1", 4, rack="r0", domain="d0"),
    node("n2", 4, rack="r0", domain="d0"),
    node("n3", 4, rack="r1", domain="d0"),
    node("n4", 4, rack="r1", domain="d0"),
]
D1 = [node("m1", 4, rack="r2", domain="d1"), node("m2", 4, rack="r3", domain="d1")]


@pytest.mark.parametrize("profile", ["default", "las", "backfill"])
def test_a_gang_too_large_for_any_rack_stays_within_one_domain(profile: str) -> None:
    """The emptiest nodes are d1's: spreading over the whole cluster would take them
    and cross domains, the slowest links; d0 holds the gang on its own."""
    busy = [placed(f"x{i}", n, [0]) for i, n in enumerate(D0[1:])]
    snap = snapshot([*D0, *D1], [pending("gang", 12)], busy, multi_node=True)
    plan = run(profile, snap)
    shards = launches(plan)["gang"].shards
    assert {s.node_id for s in shards} == {"n1", "n2", "n3", "n4"}
    assert sum(len(s.gpu_uuids) for s in shards) == 12
