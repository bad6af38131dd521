"""The plan's index of shareable GPUs (`place.share._ShareIndex`) chooses what a scan of
every node would, job after job, as the plan takes GPUs, CPUs and sharing places, and
where nothing fits gives the scan's reasons."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy.place import share
from schedd.policy.placement import Placement
from schedd.policy.settings import Settings
from schedd.policy.snapshot import OPPORTUNISTIC, Gpu, Node, Request, Shard
from schedd.policy.view import View
from tests.unit.policy_harness import node, pending, placed, snapshot


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], list[object]]:
    nodes, running = [], []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(1, 4))
        n = node(f"n{i}", gpus, cpus=draw(st.sampled_from([2.0, 4.0, 16.0])))
        uses = draw(st.lists(st.integers(0, 100), min_size=gpus, max_size=gpus))
        n = dataclasses.replace(
            n,
            gpus=tuple(with_use(g, u) for g, u in zip(n.gpus, uses, strict=True)),
            coordinated=draw(st.booleans()) or i == 0,
        )
        for g in range(gpus):
            if draw(st.booleans()):  # a guaranteed holder, known to use a share or not
                use = draw(st.none() | st.integers(0, 100))
                started = draw(st.sampled_from([0.0, 900.0]))  # young at now=1000
                running.append(placed(f"r{i}-{g}", n, [g], started_at=started, utilization_pct=use))
        nodes.append(n)
    return nodes, running


def with_use(gpu: Gpu, use: int) -> Gpu:
    return dataclasses.replace(gpu, utilization_pct=use)


@settings(max_examples=150, deadline=None)
@given(
    clusters(),
    st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([1.0, 2.0, 3.0]), st.booleans()),
        min_size=1,
        max_size=12,
    ),
)
def test_the_index_places_each_job_where_a_scan_would(
    cluster: tuple[list[Node], list[object]], jobs: list[tuple[int, float, bool]]
) -> None:
    nodes, running = cluster
    view = View.build(snapshot(nodes, [], running), 1000.0, Settings())  # type: ignore[arg-type]
    for i, (gpus, cpus, guaranteed_first) in enumerate(jobs):
        if guaranteed_first:  # a guaranteed job takes a free GPU: it is fresh from then on
            for n in nodes:
                free = view.capacity[n.node_id].free_gpus
                if free and view.capacity[n.node_id].cpus >= 1:
                    g = pending(f"g{i}", 1)
                    view.take(g, (Shard(n.node_id, (free[0].uuid,)),))
                    break
        job = pending(f"o{i}", gpus, cpus, kind=OPPORTUNISTIC)
        scanned = share._scan(job, view)
        indexed = share.place(job, view)
        assert indexed == scanned  # the same node and GPUs, or the same reasons
        if isinstance(indexed, Placement):
            view.take(job, indexed.shards)


def test_a_request_the_index_cannot_place_is_told_why() -> None:
    n = dataclasses.replace(node("n", 2), gpus=tuple(with_use(g, 90) for g in node("n", 2).gpus))
    view = View.build(snapshot([n], []), 0.0, Settings())
    nofit = share.place(pending("o", 1, kind=OPPORTUNISTIC), view)
    assert not isinstance(nofit, Placement)
    assert "1 node with too few GPUs used below 50% and not shared" in nofit.describe(
        Request(1, 1, 1024)
    )
