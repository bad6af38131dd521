"""A reservation keeps the CPUs and memory its job counts on, not only its GPUs: a job
that would still run at the reservation's start may not take them."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy import build
from schedd.policy.actions import Migrate, Reserve
from schedd.policy.profiles import BUILTIN, ProfileSpec
from schedd.policy.settings import Settings
from schedd.policy.snapshot import GUARANTEED, OPPORTUNISTIC, Gpu, Node
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


@pytest.mark.parametrize("make_room", ["las", "gittins"])
def test_a_long_jobs_failed_preemption_is_not_a_short_twins_under_a_reservation(
    make_room: str,
) -> None:
    """big holds n-g1: long, of q, finds no room even with low stopped; short, alike
    but ending first, may use n-g1 and preempts low (each job asks for itself)."""
    spec = ProfileSpec(
        order="fifo",
        place="best_fit",
        make_room=(make_room,),
        blocking="backfill",
        settings=Settings(reserve_after_s=0.0, min_run_s=0.0),
    )
    n = node("n", 2)
    low = placed("low", n, [0], queue="q", started_at=0.0, estimate_s=20_000.0, attained_s=10_000.0)
    waiting = [
        pending("big", 2, queue="other", at=0.0),
        pending("long", 2, queue="q", at=1.0, estimate_s=100_000.0),
        pending("short", 2, queue="q", at=2.0, estimate_s=600.0),
    ]
    snap = snapshot([n], waiting, [low])
    plan = build("backfill-" + make_room, spec).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert plan.waiting["short"].code == "preempting"


@pytest.mark.parametrize(("gpus", "kind"), [(0, GUARANTEED), (1, OPPORTUNISTIC)])
def test_what_a_short_job_takes_of_the_kept_cpus_comes_back_for_the_reservation(
    gpus: int, kind: str
) -> None:
    """short (ends before big starts) takes 40 of n1's 56 free CPUs; at big's start they
    are free again, so long (4 CPUs, outlasting it) still fits beside: 56 - 4 >= 32."""
    n1 = node("n1", gpus=8, cpus=64)
    running = [placed("r1", n1, [0, 1, 2, 3], cpus=8, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0),
        pending("short", 0, cpus=40, at=1.0, estimate_s=600.0),
        pending("long", gpus, cpus=4, at=2.0, estimate_s=1_000_000.0, kind=kind),
    ]
    snap = snapshot([n1], waiting, running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert {"short", "long"} <= set(launches(plan))


def test_a_gang_holds_only_the_free_gpus_it_counts_on_on_each_node() -> None:
    """gang counts on 2 of n2's GPUs, 7 of which are free: the 5 others are not held,
    and a long job of 5 GPUs starts there."""
    n1, n2 = node("n1", 8, cpus=128), node("n2", 8, cpus=128)
    running = [placed("r1", n2, [0], cpus=120, started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("gang", 10, cpus=100, at=0.0, estimate_s=3_600.0),
        pending("other", 5, cpus=0, memory_mib=0, at=1.0, estimate_s=1_000_000.0),
    ]
    snap = snapshot([n1, n2], waiting, running, multi_node=True)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert [a.node_ids for a in plan.actions if isinstance(a, Reserve)] == [("n1", "n2")]
    assert launches(plan)["other"].shards[0].node_id == "n2"


def test_an_elastic_job_started_smaller_is_judged_by_its_end_at_that_size() -> None:
    """e (1 to 4 GPUs, 8,000 s on 4) fits only on big's 2 held GPUs: on 2 it would run
    16,000 s, past big's start at 20,000 s, so it waits."""
    n1 = node("n1", 8, cpus=64)
    running = [placed("r1", n1, list(range(6)), cpus=8, started_at=0.0, estimate_s=20_000.0)]
    e = dataclasses.replace(pending("e", 4, cpus=4, at=1.0, estimate_s=8_000.0), gpu_range=(1, 4))
    big = pending("big", 8, cpus=32, at=0.0, estimate_s=3_600.0)
    snap = snapshot([n1], [big, e], running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert "e" not in launches(plan)


def test_a_node_with_free_gpus_too_small_for_a_job_says_so_beside_a_reservation() -> None:
    """n2 has 4 free GPUs, 2 of them with 80 GB; a job asking for 3 of 80 GB waits
    there "with too few free GPUs" while big holds n1 (the wait's words once looked for
    a reservation on n2 and raised)."""
    n1 = node("n1", gpus=8)
    n2 = Node(
        "n2",
        tuple(Gpu(f"n2-g{i}", i, "A100", 81_920 if i < 2 else 40_960) for i in range(4)),
        64,
        512_000,
        {},
    )
    running = [placed("r1", n1, [0, 1, 2, 3], started_at=0.0, estimate_s=20_000.0)]
    waiting = [
        pending("big", 8, at=0.0, estimate_s=3_600.0),
        pending("mem", 3, gpu_memory_mib=80_000, at=1.0, estimate_s=1_000_000.0),
    ]
    snap = snapshot([n1, n2], waiting, running)
    plan = build("backfill-now", SPEC).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert plan.waiting["mem"].code == "no_capacity"


def test_a_newcomer_takes_no_turns_on_gpus_a_reservation_counts_on() -> None:
    """big (4 GPUs) is held n1 from 20,000 s, when p1 and p2 end: long, outlasting that,
    may not take turns with p1 (it would keep p1's GPUs past big's start)."""
    spec = ProfileSpec(
        order="fifo",
        place="best_fit",
        make_room=("timeslice",),
        blocking="backfill",
        settings=Settings(reserve_after_s=0.0, min_run_s=0.0),
    )
    n1 = node("n1", 8)
    running = [
        placed("x", n1, [0, 1, 2], started_at=0.0, estimate_s=1e7),
        placed("y", n1, [3], started_at=0.0, estimate_s=1e7),
        placed("p1", n1, [4, 5], started_at=0.0, estimate_s=20_000.0),
        placed("p2", n1, [6, 7], started_at=0.0, estimate_s=20_000.0),
    ]
    waiting = [
        pending("big", 4, at=0.0, estimate_s=3_600.0),
        pending("long", 2, at=1.0, estimate_s=1e7),
    ]
    snap = snapshot([n1], waiting, running)
    plan = build("backfill-timeslice", spec).plan(snap, 10_000.0)
    assert_valid(snap, plan)
    assert [a.job_id for a in plan.actions if isinstance(a, Reserve)] == ["big"]
    assert "long" not in launches(plan)
