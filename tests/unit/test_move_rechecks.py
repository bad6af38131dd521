"""Gandiva's introspective mode: a move, shrink or grow passed over only because its job
was too young (`min_run_s` since it started) asks for a plan when the job comes of age
(`Plan.recheck_at`), so that it happens with no event; and a plan then makes it.

Each case: the job started at 900 s, the plan at 1,000 s finds it too young (300 s),
so the plan asks to be made again at 1,200 s, where the same snapshot gets the move.
"""

from __future__ import annotations

import dataclasses

from schedd.policy.actions import Migrate, Plan, Resize
from schedd.policy.snapshot import SUSPENDED, PlacedJob, Shard, Snapshot
from tests.unit.policy_harness import node, pending, placed, run, snapshot

STARTED = 900.0
EARLY, OF_AGE = 1000.0, STARTED + 300.0  # min_run_s: 300 s


def young(job: PlacedJob) -> PlacedJob:
    return dataclasses.replace(job, started_at=STARTED, state_since=STARTED)


def changes(plan: Plan) -> dict[str, Migrate | Resize]:
    return {a.job_id: a for a in plan.actions if isinstance(a, (Migrate, Resize))}


def acts_once_of_age(snap: Snapshot, job_id: str) -> Plan:
    early = run("gandiva", snap, now=EARLY)
    assert changes(early) == {}
    assert early.recheck_at == OF_AGE
    later = run("gandiva", snap, now=OF_AGE)
    assert set(changes(later)) == {job_id}
    return later


def test_a_move_to_free_a_node_waits_for_its_mover_to_come_of_age() -> None:
    a, b = node("a", 4), node("b", 4)
    running = [
        young(placed("small", a, [0], estimate_s=50_000.0)),
        placed("tail", a, [1], estimate_s=50_000.0, started_at=None),
        placed("tail2", a, [2], estimate_s=50_000.0, started_at=None),
        placed("three", b, [0, 1, 2], estimate_s=50_000.0, started_at=None),
    ]
    # The others cannot move at all (they save no checkpoint): only `small` could.
    running[1:] = [dataclasses.replace(j, checkpointable=False) for j in running[1:]]
    acts_once_of_age(snapshot([a, b], [pending("wide", 2)], running), "small")


def test_a_spread_job_is_gathered_once_it_comes_of_age() -> None:
    a, b, c = node("a", 4), node("b", 4), node("c", 4)
    spread = young(
        dataclasses.replace(
            placed("spread", a, [0, 1, 2, 3], estimate_s=20_000.0),
            shards=(Shard("a", ("a-g0", "a-g1")), Shard("b", ("b-g0", "b-g1"))),
        )
    )
    others = [placed("fill-a", a, [2, 3]), placed("fill-b", b, [2, 3])]
    acts_once_of_age(snapshot([a, b, c], [], [spread, *others], multi_node=True), "spread")


def test_a_time_sliced_partner_moves_to_free_gpus_once_it_comes_of_age() -> None:
    a, b = node("a", 1), node("b", 1)
    partner = young(placed("runs", a, [0], estimate_s=9_000.0))
    paused = dataclasses.replace(
        placed("paused", a, [0], estimate_s=9_000.0), state=SUSPENDED, state_since=0.0
    )
    snap = snapshot([a, b], [], [partner, paused])
    # The pair's turns end later than the partner comes of age: that is the first time.
    acts_once_of_age(snap, "runs")


def test_an_elastic_job_grows_once_it_comes_of_age() -> None:
    n = node("n", 4)
    small = young(
        dataclasses.replace(placed("e", n, [0, 1], estimate_s=20_000.0), gpu_range=(1, 4))
    )
    later = acts_once_of_age(snapshot([n], [], [small]), "e")
    assert isinstance(changes(later)["e"], Resize) and changes(later)["e"].gpus == 4


def test_an_elastic_job_shrinks_for_a_waiting_job_once_it_comes_of_age() -> None:
    n = node("n", 4)
    big = young(
        dataclasses.replace(placed("e", n, [0, 1, 2, 3], estimate_s=50_000.0), gpu_range=(1, 4))
    )
    later = acts_once_of_age(snapshot([n], [pending("w", 2)], [big]), "e")
    assert isinstance(changes(later)["e"], Resize) and changes(later)["e"].gpus == 2


def test_the_plan_at_the_recheck_finds_the_job_of_age_whatever_the_rounding() -> None:
    """For some start times (since + 300) - since < 300 in floating point: the plan at
    exactly the recheck time must still find the job of age."""
    since = 2096899.9701969943
    assert (since + 300.0) - since < 300.0
    n = node("n", 4)
    small = dataclasses.replace(
        placed("e", n, [0, 1], estimate_s=20_000.0),
        gpu_range=(1, 4),
        started_at=since,
        state_since=since,
    )
    early = run("gandiva", snapshot([n], [], [small]), now=since + 100.0)
    assert early.recheck_at == since + 300.0
    assert set(changes(run("gandiva", snapshot([n], [], [small]), now=early.recheck_at))) == {"e"}


def test_no_recheck_for_a_job_that_could_not_move_when_of_age() -> None:
    """No plan is asked for nothing: a partner that cannot save checkpoints (live: a
    gang, or a job whose shim never reported steps; the scheduler wakes when it first
    does), a partner with no GPUs of its size free anywhere, an elastic job while a
    job waits for GPUs (grow gives way to it)."""
    a, b = node("a", 1), node("b", 1)
    paused = dataclasses.replace(
        placed("paused", a, [0], estimate_s=9_000.0), state=SUSPENDED, state_since=0.0
    )
    partner = young(placed("runs", a, [0], estimate_s=9_000.0))
    stuck = dataclasses.replace(partner, checkpointable=False)
    assert run("gandiva", snapshot([a, b], [], [stuck, paused]), now=EARLY).recheck_at != OF_AGE
    wide, one = node("w", 4), node("o", 1)
    big_paused = dataclasses.replace(
        placed("paused", wide, [0, 1, 2, 3], estimate_s=9_000.0), state=SUSPENDED, state_since=0.0
    )
    big = young(placed("runs", wide, [0, 1, 2, 3], estimate_s=9_000.0))
    plan = run("gandiva", snapshot([wide, one], [], [big, big_paused]), now=EARLY)
    assert plan.recheck_at != OF_AGE  # only one GPU free elsewhere: it cannot move there
    n, m = node("n", 4), node("m", 4)
    small = young(
        dataclasses.replace(placed("e", n, [0, 1], estimate_s=20_000.0), gpu_range=(2, 4))
    )
    fill = dataclasses.replace(
        placed("fill", m, [0, 1, 2, 3], estimate_s=90_000.0), checkpointable=False
    )
    plan = run("gandiva", snapshot([n, m], [pending("w", 3)], [small, fill]), now=EARLY)
    assert plan.waiting["w"].code == "no_capacity"
    assert plan.recheck_at != OF_AGE


def test_no_recheck_where_nothing_would_move() -> None:
    """A young elastic job already at its most, on a full node, with nobody waiting:
    coming of age changes nothing, so the plan asks for no recheck."""
    n = node("n", 2)
    full = young(dataclasses.replace(placed("e", n, [0, 1], estimate_s=20_000.0), gpu_range=(1, 2)))
    assert run("gandiva", snapshot([n], [], [full]), now=EARLY).recheck_at is None
