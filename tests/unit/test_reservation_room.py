"""A reservation keeps the CPUs and memory its job counts on, not only its GPUs: a job
that would still run at the reservation's start may not take them."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy import build
from schedd.policy.actions import Migrate, Reserve
from schedd.policy.profiles import BUILTIN, ProfileSpec
from schedd.policy.settings import Settings
from schedd.policy.snapshot import GUARANTEED, OPPORTUNISTIC
from tests.unit.policy_harness import assert_valid, launches, node, pending, placed, snapshot

# `backfill`, reserving from the first plan (it waits a day by default).
SPEC = dataclasses.replace(
    BUILTIN["backfill"],
    settings=dataclasses.replace(BUILTIN["backfill"].settings, reserve_after_s=0.0),
)


@pytest.mark.parametrize(("gpus", "kind"), [(0, GUARANTEED), (1, OPPORTUNISTIC)])
@pytest.mark.parametrize(("estimate_s", "starts"), [(1_000_000.0, False), (600.0, True)])
def test_a_job_past_the_reservations_start_leaves_it_the_cpus_it_counts_on(
    gpus: int, kind: str, estimate_s: float, starts: bool
) -> None:
    """big needs all 8 GPUs and 32 CPUs of n1, where r1 holds 4 GPUs until 20,000 s:
    it reserves n1. A job of 40 CPUs (CPUs alone, or opportunistic beside the free
    GPUs) that would run past 20,000 s leaves 24 CPUs, too few: it waits. One that ends
    before starts at once."""
    n1 = node("n1", gpus=8, cpus=64)
    running = [placed("r1", n1, [0, 1, 2, 3], cpus=8, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0),
        pending("other", gpus, cpus=40, at=1.0, estimate_s=estimate_s, kind=kind),
    ]
    snap = snapshot([n1], waiting, running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert [a.job_id for a in plan.actions if isinstance(a, Reserve)] == ["big"]
    assert ("other" in launches(plan)) == starts
    if not starts and kind == GUARANTEED:
        assert "reserved for job big" in plan.waiting["other"].reason


@pytest.mark.parametrize(("gpus", "kind", "busy"), [(0, GUARANTEED, 8), (1, OPPORTUNISTIC, 4)])
def test_a_long_twins_wait_is_not_a_short_jobs(gpus: int, kind: str, busy: int) -> None:
    """long, past big's start, may not take the CPUs big's reservation keeps; short, of
    the same request but ending first, may: the plan remembers long's "no room" for its
    request and end, not for the request alone (also where all of n1's GPUs are busy, so
    the reservation marks no free GPU)."""
    n1 = node("n1", gpus=8, cpus=64)
    running = [placed("r1", n1, list(range(busy)), cpus=8, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0),
        pending("long", gpus, cpus=40, at=1.0, estimate_s=1_000_000.0, kind=kind),
        pending("short", gpus, cpus=40, at=2.0, estimate_s=600.0, kind=kind),
    ]
    snap = snapshot([n1], waiting, running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert "long" not in launches(plan) and "short" in launches(plan)


def test_a_job_asking_no_cpus_is_not_refused_once_the_kept_cpus_are_taken() -> None:
    """short (ending before big starts) takes 40 of the 56 free CPUs, 32 of them kept for
    big: a job that asks for no CPUs still starts beside."""
    n1 = node("n1", gpus=8, cpus=64)
    running = [placed("r1", n1, [0, 1, 2, 3], cpus=8, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0),
        pending("short", 0, cpus=40, at=1.0, estimate_s=600.0),
        pending("nocpu", 1, cpus=0, at=2.0, estimate_s=1_000_000.0, kind=OPPORTUNISTIC),
    ]
    snap = snapshot([n1], waiting, running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert {"short", "nocpu"} <= set(launches(plan))


def test_a_gang_keeps_on_each_node_its_share_for_the_gpus_it_counts_on_there() -> None:
    """gang (10 GPUs, 100 CPUs) reserves n1's 8 GPUs and 2 of n2's: it keeps 80 CPUs on
    n1 and 20 on n2, not 80 on each. A long job of 50 CPUs fits beside on n2 only."""
    n1, n2 = node("n1", 8, cpus=128), node("n2", 8, cpus=128)
    running = [placed("r1", n2, list(range(7)), cpus=8, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("gang", 10, cpus=100, at=0.0, estimate_s=3_600.0),
        pending("other", 0, cpus=50, at=1.0, estimate_s=1_000_000.0),
    ]
    snap = snapshot([n1, n2], waiting, running, multi_node=True)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert [a.node_ids for a in plan.actions if isinstance(a, Reserve)] == [("n1", "n2")]
    assert launches(plan)["other"].shards[0].node_id == "n2"


def test_a_move_lands_on_no_reservations_gpus_or_cpus_it_would_outlast() -> None:
    """Defragmenting n2 for w, m could move onto n1, whose free GPUs and CPUs big's
    reservation holds; m runs far past big's start, so it does not move there."""
    spec = ProfileSpec(
        order="fifo",
        place="best_fit",
        blocking="backfill",
        anticipate=("defragment",),
        settings=Settings(reserve_after_s=0.0, min_run_s=0.0),
    )
    n1, n2 = node("n1", 8, cpus=64), node("n2", 8, cpus=64)
    running = [
        placed("r1", n1, [0, 1, 2, 3], cpus=8, started_at=0.0, estimate_s=20_000.0),
        placed("m", n2, [0, 1], cpus=30, started_at=0.0, estimate_s=1_000_000.0),
        placed("x", n2, [2, 3, 4, 5], cpus=4, started_at=0.0, estimate_s=1_000_000.0),
    ]
    waiting = [
        pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0),
        pending("w", 4, cpus=4, at=1.0, estimate_s=1_000_000.0),
    ]
    snap = snapshot([n1, n2], waiting, running)
    plan = build("backfill-defrag", spec).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert [a.job_id for a in plan.actions if isinstance(a, Reserve)] == ["big"]
    assert not [a for a in plan.actions if isinstance(a, Migrate)]
