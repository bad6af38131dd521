"""What the policy keeps between plans of the same snapshot objects (`kept.py`, the
running jobs' ranks and index crossings, protection ends) never changes a plan: the
same snapshot planned again, later and earlier, gives what fresh objects give."""

from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from schedd.policy import framework, profile
from schedd.policy import placed_totals as _placed_totals
from schedd.policy.actions import Plan
from schedd.policy.gittins import ServiceHistory
from schedd.policy.kept import forget_all
from schedd.policy.make_room import gittins, victims
from schedd.policy.placed_totals import placed_totals
from schedd.policy.snapshot import PendingJob, PlacedJob, Request, Shard, Snapshot
from tests.unit.policy_harness import node

HEAVY_TAIL = ServiceHistory.of([600.0] * 180 + [50_000.0] * 20)


def build(seed: int) -> Snapshot:
    rng = random.Random(seed)
    nodes = [node(f"n{i}", 4) for i in range(3)]
    placed = []
    for n in nodes:
        free = list(range(4))
        rng.shuffle(free)
        for k in range(rng.randint(1, 4)):
            start = rng.uniform(2000, 4000)
            placed.append(
                PlacedJob(
                    f"{n.node_id}-r{k}",
                    "u",
                    rng.choice(["a", "b"]),
                    (Shard(n.node_id, (n.gpus[free[k]].uuid,)),),
                    Request(1, 1, 1024),
                    "running",
                    started_at=start,
                    attained_s=rng.choice([0.0, 500.0]),
                    attained_as_of=start,
                )
            )
    pending = [
        PendingJob(
            f"p{i}",
            "u",
            rng.choice(["a", "b"]),
            0,
            "guaranteed",
            Request(rng.choice([1, 2]), 1, 1024),
            float(i),
            attained_s=rng.choice([0.0, 300.0, 900.0]),
        )
        for i in range(rng.randint(1, 8))
    ]
    return Snapshot(tuple(nodes), tuple(placed), tuple(pending), service_history=HEAVY_TAIL)


def fresh(snap: Snapshot) -> Snapshot:
    """The same cluster in new objects: nothing kept applies to it."""
    return Snapshot(
        tuple(snap.nodes),
        tuple(dataclasses.replace(j) for j in snap.placed),
        tuple(dataclasses.replace(j) for j in snap.pending),
        service_history=snap.service_history,
        claimants=snap.claimants,
    )


def same(a: Plan, b: Plan) -> bool:
    # A crossing time kept from an earlier plan was computed from another `now`: equal
    # but for the last bits of a float.
    if (a.recheck_at is None) != (b.recheck_at is None):
        return False
    close = a.recheck_at is None or math.isclose(a.recheck_at, b.recheck_at or 0.0)
    return (a.actions, a.waiting, a.claimants) == (b.actions, b.waiting, b.claimants) and close


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), times=st.lists(st.floats(4000, 6000), min_size=3, max_size=6))
def test_planning_the_same_objects_again_gives_what_fresh_ones_give(
    seed: int, times: list[float]
) -> None:
    snap = build(seed)
    for name in ("default", "las", "tiresias"):
        plan = profile(name).plan
        kept = [plan(snap, now) for now in times]  # later and earlier, in any order
        for now, again in zip(times, kept, strict=True):
            assert same(again, plan(fresh(snap), now)), (name, now)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    steps=st.lists(st.tuples(st.floats(4000, 6000), st.integers(0, 3)), min_size=3, max_size=8),
)
def test_snapshots_that_share_some_objects_plan_as_fresh_ones(
    seed: int, steps: list[tuple[float, int]]
) -> None:
    """As the simulator does: from one plan to the next a job leaves, one job comes as
    a new object, or a queue's waiting jobs come as new objects with more service (the
    best index waiting there changes), while the others stay the very same objects (so
    per-queue lists and what is kept for them are reused for the queues that did not
    change)."""
    rng = random.Random(seed)
    snapshots = []
    current = build(seed)
    for now, change in steps:
        placed, pending = list(current.placed), list(current.pending)
        if change == 1 and placed:
            placed.pop(rng.randrange(len(placed)))
        elif change == 2 and placed:
            i = rng.randrange(len(placed))
            placed[i] = dataclasses.replace(placed[i], attained_s=placed[i].attained_s + 700.0)
        elif change == 3:  # one queue's waiting jobs all served more before
            queue = rng.choice(["a", "b"])
            pending = [
                dataclasses.replace(j, attained_s=j.attained_s + 600.0) if j.queue == queue else j
                for j in pending
            ]
        current = dataclasses.replace(current, placed=tuple(placed), pending=tuple(pending))
        snapshots.append((now, current))
    for name in ("default", "las", "tiresias"):
        plan = profile(name).plan
        # Each recheck found as soon as its plan is made, then each left to be found
        # after all the later plans (a deferred recheck reads its own view only).
        found_at_once = [plan(snap, now).with_recheck_found() for now, snap in snapshots]
        kept = [plan(snap, now) for now, snap in snapshots]
        for (now, snap), got, at_once in zip(snapshots, kept, found_at_once, strict=True):
            assert same(got, at_once), (name, now)
            assert same(got, plan(fresh(snap), now)), (name, now)


def test_forgetting_what_is_kept_leaves_plans_as_they_were() -> None:
    """After a plan that raised, the shell drops every memo kept between plans
    (`kept.forget_all`): they are empty then, and the same objects plan as before."""
    snap = build(7)
    plan = profile("default").plan
    before = plan(snap, 5000.0)
    assert placed_totals(snap).placed is snap.placed and gittins._rankings
    forget_all()
    assert _placed_totals._kept.placed == () and not gittins._rankings
    assert all(memo.last() is None for memo in (framework._never_fit, victims._protection))
    assert same(plan(snap, 5000.0), before)
