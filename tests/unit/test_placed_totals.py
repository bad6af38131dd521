"""The totals kept between plans equal a full recount after any sequence of snapshots."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy import build
from schedd.policy.placed_totals import PlacedTotals, counted_afresh, placed_totals
from schedd.policy.profiles import BUILTIN
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    MIGRATING,
    OPPORTUNISTIC,
    SUSPENDED,
    FreeCapacity,
    Node,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
    free_capacity,
    holds_gpus,
)
from schedd.policy.view import View
from tests.unit.policy_harness import node, pending, placed

NODES = (node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=8, cpus=32))


def recount(nodes: tuple[Node, ...], jobs: tuple[PlacedJob, ...]) -> dict[str, object]:
    """What View.build counted before the totals were kept: everything, from scratch."""
    held: dict[tuple[str, str], Resources] = {}
    sizes: dict[str, dict[int, int]] = {}
    shared: dict[str, frozenset[str]] = {}
    for job in jobs:
        if job.kind == OPPORTUNISTIC:
            for shard in job.shards:
                shared[shard.node_id] = shared.get(shard.node_id, frozenset()) | set(
                    shard.gpu_uuids
                )
        if not holds_gpus(job):
            continue  # opportunistic or suspended: no GPU of its own
        # A migrating job holds its target's GPUs too; one size per node it is on.
        for node_id in {s.node_id for s in (*job.shards, *job.moving_to)}:
            on = sizes.setdefault(node_id, {})
            on[job.request.gpus] = on.get(job.request.gpus, 0) + 1
        if job.stoppable or job.state == MIGRATING:
            key = (job.queue, job.user)
            # A job growing counts the GPUs it resumes with, already.
            most = max(job.request.gpus, sum(len(s.gpu_uuids) for s in job.moving_to))
            counted = dataclasses.replace(job.request, gpus=most).resources()
            held[key] = held.get(key, Resources()) + counted
    capacity = free_capacity(Snapshot(nodes, jobs, ()))
    return {
        "free": {
            n: ([g.uuid for g in c.free_gpus], c.cpus, c.memory_mib) for n, c in capacity.items()
        },
        "held": held,
        "sizes": sizes,
        "leaving": {
            j.job_id for j in jobs if not j.stoppable and holds_gpus(j) and j.state != MIGRATING
        },
        "shared": {n: gpus for n, gpus in shared.items() if n in {x.node_id for x in nodes}},
        "unstoppable": sum(1 for j in jobs if holds_gpus(j) and not j.stoppable),
        "by_queue": {q: {id(j) for j in jobs if j.queue == q} for q in {j.queue for j in jobs}},
    }


def kept(totals: PlacedTotals) -> dict[str, object]:
    return {
        "free": {
            n: ([g.uuid for g in c.free_gpus], c.cpus, c.memory_mib)
            for n, c in totals.free_capacity().items()
        },
        "held": totals.held,
        "sizes": totals.gpu_sizes(),
        "leaving": totals.leaving_ids(),
        "shared": totals.shared_gpus(),
        "unstoppable": totals.unstoppable,
        "by_queue": {q: {id(j) for j in js} for q, js in totals.by_queue.items()},
    }


def _targets(job: PlacedJob) -> tuple[str, ...]:
    return tuple(u for s in job.moving_to for u in s.gpu_uuids)


def two_node_job(job_id: str, user: str) -> PlacedJob:
    """A gang across n0 and n1 (GPUs 3 of each), its CPUs and memory split by shard."""
    return PlacedJob(
        job_id,
        user,
        "q",
        (Shard("n0", ("n0-g3",)), Shard("n1", ("n1-g3",))),
        Request(2, 3.0, 2048),
        "running",
    )


STEPS = ["add", "add", "share", "stop", "end", "renew_all", "new_nodes", "pause", "move", "grow"]
steps = st.lists(
    st.tuples(
        st.sampled_from(STEPS),
        st.integers(0, 2),  # node
        st.integers(1, 3),  # GPUs
        st.sampled_from(["alice", "bob"]),
        st.sampled_from([0.5, 1.0, 4.0]),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_kept_totals_match_a_full_recount(sequence: list[tuple[str, int, int, str, float]]) -> None:
    nodes = NODES
    jobs: list[PlacedJob] = [two_node_job("gang", "alice")]
    totals = PlacedTotals()
    for n, (what, node_index, gpus, user, cpus) in enumerate(sequence):
        if what == "add":
            on = nodes[node_index]
            taken = {u for j in jobs for u in j.gpu_uuids}
            free = [g.index for g in on.gpus if g.uuid not in taken][:gpus]
            if free:
                queue = "q" if cpus == 4.0 else "default"
                jobs.append(placed(f"j{n}", on, free, cpus, 1000 * gpus, user=user, queue=queue))
        elif what == "share":  # an opportunistic job, on GPUs no other one shares
            on = nodes[node_index]
            taken = {u for j in jobs if not holds_gpus(j) for u in j.gpu_uuids}
            free = [g.index for g in on.gpus if g.uuid not in taken][:gpus]
            if free:
                jobs.append(placed(f"o{n}", on, free, cpus, 500, user=user, kind=OPPORTUNISTIC))
        elif what == "pause" and jobs:  # suspended: its GPUs free, its CPUs held
            i = node_index % len(jobs)
            if jobs[i].state == "running" and jobs[i].kind != OPPORTUNISTIC:
                jobs[i] = dataclasses.replace(jobs[i], state=SUSPENDED)
        elif what == "move" and jobs:  # migrating: it holds free GPUs of a node too
            i, on = node_index % len(jobs), nodes[(node_index + 1) % len(nodes)]
            mover = jobs[i]
            taken = {u for j in jobs if holds_gpus(j) for u in (*j.gpu_uuids, *_targets(j))}
            free = [g.uuid for g in on.gpus if g.uuid not in taken][: mover.request.gpus]
            if mover.state == "running" and holds_gpus(mover) and len(free) == mover.request.gpus:
                target = (Shard(on.node_id, tuple(free)),)
                jobs[i] = dataclasses.replace(mover, state=MIGRATING, moving_to=target)
        elif what == "grow" and jobs:  # saving a checkpoint to grow: its GPUs and more
            i = node_index % len(jobs)
            grower = jobs[i]
            (shard, *rest) = grower.shards
            taken = {u for j in jobs if holds_gpus(j) for u in (*j.gpu_uuids, *_targets(j))}
            here = next(x for x in nodes if x.node_id == shard.node_id)
            free = [g.uuid for g in here.gpus if g.uuid not in taken][:gpus]
            if grower.state == "running" and holds_gpus(grower) and not rest and free:
                target = (Shard(shard.node_id, (*shard.gpu_uuids, *free)),)
                jobs[i] = dataclasses.replace(grower, state=MIGRATING, moving_to=target)
        elif what == "stop" and jobs:
            i = node_index % len(jobs)
            jobs[i] = dataclasses.replace(jobs[i], state="preempting")
        elif what == "end" and jobs:
            del jobs[node_index % len(jobs)]
        elif what == "renew_all":
            jobs = [dataclasses.replace(j) for j in jobs]  # as the live scheduler does
        elif what == "new_nodes":
            nodes = tuple(dataclasses.replace(x) for x in nodes)
        snapshot = tuple(jobs)
        totals.update(nodes, snapshot)
        assert kept(totals) == recount(nodes, snapshot)
        assert all(len(js) == len({id(j) for j in js}) for js in totals.by_queue.values())


def test_a_job_on_a_node_that_is_away_takes_nothing_from_the_nodes_there_are() -> None:
    away = node("away", gpus=2)
    jobs = (
        placed("a", away, [0, 1], gpu_memory_mib=30_000, user="bob"),
        placed("b", NODES[0], [0]),
    )
    totals = placed_totals(Snapshot(NODES, jobs, ()))
    assert kept(totals) == recount(NODES, jobs)
    assert "away" not in totals.free_capacity()
    # The GPU memory a job asks counts with its GPUs; the cluster's, of connected nodes.
    assert totals.held[("default", "bob")] == Resources(2, 1.0, 1024, 60_000)
    assert totals.total == Resources(16, 64 + 64 + 32, 3 * 512_000, 16 * 81_920)


def test_a_view_counted_afresh_leaves_the_plans_totals_alone() -> None:
    """The queue report builds its view while a large plan may run in a worker thread:
    it counts its own totals, and those the plan reads stay the plan's."""
    plans = Snapshot(NODES, (placed("a", NODES[0], [0]),), ())
    kept_by_plans = placed_totals(plans)
    reports = Snapshot(NODES, (placed("b", NODES[1], [0, 1], user="bob"),), ())
    view = View.build(reports, 0.0, Settings(), counted_afresh(reports))
    assert view.allocated["default"].gpus == 2
    assert kept_by_plans.placed is plans.placed
    assert kept(kept_by_plans) == recount(NODES, plans.placed)


def test_the_view_a_plan_changes_is_a_copy() -> None:
    """Views share the kept totals' entries and copy a node's before changing it."""
    jobs = (placed("a", NODES[0], [0]),)
    snap = Snapshot(NODES, jobs, ())
    view = View.build(snap, 0.0, Settings())
    untouched = view.capacity["n1"]
    view.take(pending("b", 1), (Shard("n0", ("n0-g1",)),))
    again = placed_totals(snap)
    assert [g.uuid for g in again.free_capacity()["n0"].free_gpus] == ["n0-g1", "n0-g2", "n0-g3"]
    assert again.gpu_sizes()["n0"] == {1: 1}
    assert [g.uuid for g in view.capacity["n0"].free_gpus] == ["n0-g2", "n0-g3"]
    assert view.gpu_sizes["n0"] == {1: 2}
    assert view.capacity["n1"] is untouched  # nothing copied that the plan did not change
    # A second view of the same snapshot starts from the totals, not from the first.
    assert len(View.build(snap, 0.0, Settings()).capacity["n0"].free_gpus) == 3


class _Shared(FreeCapacity):
    """A kept totals' entry that fails the test if anything changes it."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AssertionError(f"a capacity entry shared with the kept totals was changed: {name}")


def _shared(cap: FreeCapacity) -> _Shared:
    entry = object.__new__(_Shared)
    for name in ("node", "free_gpus", "cpus", "memory_mib"):
        object.__setattr__(entry, name, getattr(cap, name))
    return entry


def test_plans_change_their_own_copies_never_the_kept_totals() -> None:
    """Launches, and a victim search's trial placements (GPUs given back and taken
    again), change a view's own copy of a node's entry, never the one the kept totals
    share with every view."""
    n, m = node("n", 2), node("m", 2)
    runner = placed("runner", n, [0, 1], attained_s=9_000.0)
    snap = Snapshot((n, m), (runner,), (pending("small", 1), pending("new", 2)))
    totals = placed_totals(snap)
    for node_id, cap in list(totals.free.items()):
        totals.free[node_id] = _shared(cap)
    plan = build("tiresias", BUILTIN["tiresias"]).plan(snap, 10_000.0)
    assert {type(a).__name__ for a in plan.actions} == {"Launch", "Preempt"}
