"""Priority preemption within a queue (`make_room.priority`), in a profile that names it."""

from __future__ import annotations

import dataclasses

from schedd.policy import build
from schedd.policy.actions import Plan
from schedd.policy.profiles import ProfileSpec, stages
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PlacedJob, Snapshot
from tests.unit.policy_harness import (
    assert_valid,
    launches,
    node,
    pending,
    placed,
    preempted,
    snapshot,
)

SPEC = ProfileSpec(
    order="priority",
    place="best_fit",
    admit=("quota", "user_limit"),
    make_room=("reclaim", "priority"),
    settings=Settings(min_run_s=300.0),
)


def plan(snap: Snapshot, now: float = 10_000.0) -> Plan:
    result = build("priority-preempting", SPEC).plan(snap, now)
    assert_valid(snap, result)
    return result


def at(job: PlacedJob, priority: int) -> PlacedJob:
    return dataclasses.replace(job, priority=priority)


def test_a_job_preempts_the_lowest_priority_in_its_queue_then_the_least_work_lost() -> None:
    n = node("n", 4)
    running = [
        at(placed("low-old", n, [0], started_at=1_000.0), 1),
        at(placed("low-new", n, [1], started_at=9_000.0), 1),
        at(placed("lowest", n, [2], started_at=1_000.0), 0),
        at(placed("peer", n, [3], started_at=9_000.0), 5),
    ]
    result = plan(snapshot([n], [pending("urgent", 2, priority=5)], running))
    # lowest (priority 0) first, then of the two at 1 the one that ran least: low-new.
    assert preempted(result) == {"lowest", "low-new"}
    assert result.waiting["urgent"].code == "preempting"
    reason = next(a.reason for a in result.actions if getattr(a, "job_id", "") == "lowest")
    assert reason == "preempted: job urgent of priority 5 needs the GPUs"


def test_no_job_of_equal_priority_or_of_another_queue_is_a_victim() -> None:
    n = node("n", 2)
    running = [
        at(placed("peer", n, [0], started_at=0.0), 5),
        at(placed("elsewhere", n, [1], queue="other", started_at=0.0), 0),
    ]
    result = plan(snapshot([n], [pending("urgent", 1, priority=5)], running))
    assert not preempted(result) and not launches(result)
    assert result.waiting["urgent"].code == "no_capacity"


def test_a_young_victim_is_spared_until_it_comes_of_age() -> None:
    n = node("n", 1)
    running = [at(placed("young", n, [0], started_at=9_900.0), 0)]
    result = plan(snapshot([n], [pending("urgent", 1, priority=5)], running))
    assert not preempted(result)
    assert result.recheck_at == 10_200.0  # min_run_s after its start
    assert preempted(plan(snapshot([n], [pending("urgent", 1, priority=5)], running), 10_200.0))


def test_no_profile_answers_twins_from_a_wait_when_priorities_preempt() -> None:
    """The twins' shortcut takes jobs of equal service for equal rank; a priority is no
    service, so a profile naming `priority` plans every waiting job itself."""
    assert stages(SPEC, "priority-preempting").waits_alike is None
    n = node("n", 1)
    running = [at(placed("low", n, [0], started_at=0.0), 1)]
    # Two jobs alike but for their priority, in submission order: the first (priority
    # 1, as the runner's) finds no victim, the second (priority 2) does.
    waiting = [pending("same", 1, priority=1, at=0.0), pending("higher", 1, priority=2, at=1.0)]
    fifo = dataclasses.replace(SPEC, order="fifo", blocking="skip")
    result = build("fifo-priority-preempting", fifo).plan(snapshot([n], waiting, running), 1e4)
    assert preempted(result) == {"low"}
    assert result.waiting["higher"].code == "preempting"


def test_a_long_jobs_failure_is_not_taken_for_a_short_twins_under_reservations() -> None:
    """big holds n-g1 (backfill): a job may use it only if it ends before big starts.
    long, of the same request and priority, finds no room even with low stopped; short
    does, and is not answered from long's failure."""
    spec = dataclasses.replace(SPEC, order="fifo", blocking="backfill")
    n = node("n", 2)
    low = at(placed("low", n, [0], queue="q", started_at=0.0, estimate_s=20_000.0), 0)
    waiting = [
        pending("big", 2, queue="other", at=0.0),
        pending("long", 2, queue="q", priority=5, at=1.0, estimate_s=100_000.0),
        pending("short", 2, queue="q", priority=5, at=2.0, estimate_s=600.0),
    ]
    snap = snapshot([n], waiting, [low])
    result = build("fifo-backfill-priority", spec).plan(snap, 10_000.0)
    assert_valid(snap, result)
    assert preempted(result) == {"low"}
    assert result.waiting["short"].code == "preempting"


def test_a_queue_at_its_max_makes_room_for_its_higher_priority_job() -> None:
    """q may hold 2 GPUs and holds them, on a node of 4: the urgent job is within q's
    max only once a lower job of q stops, though GPUs are free. The next plan, with that
    job on its way out (no longer counted against the max), stops no other."""
    n = node("n", 4)
    queues = (QueueSpec("q", max=Resources(gpus=2)),)
    running = [
        at(placed("low0", n, [0], queue="q", started_at=0.0), 0),
        at(placed("low1", n, [1], queue="q", started_at=5_000.0), 0),
    ]
    urgent = pending("urgent", 1, queue="q", priority=5)
    first = plan(snapshot([n], [urgent], running, queues=queues))
    assert preempted(first) == {"low1"}  # the one that loses the least work
    assert first.claimants == {"urgent"}
    leaving = [running[0], dataclasses.replace(running[1], state="preempting")]
    snap = dataclasses.replace(
        snapshot([n], [urgent], leaving, queues=queues), claimants=frozenset({"urgent"})
    )
    second = plan(snap)
    assert not preempted(second) and "urgent" in launches(second)
    # A job of equal priority stays held back by the max.
    level = plan(snapshot([n], [pending("peer", 1, queue="q")], running, queues=queues))
    assert not preempted(level) and level.waiting["peer"].code == "queue_max"


def test_a_user_at_the_limit_stops_only_their_own_lower_jobs() -> None:
    """alice may hold 1 GPU of q and holds it; bob's lower job would not bring her
    within the limit, her own would."""
    n = node("n", 4)
    queues = (QueueSpec("q", guarantee=Resources(gpus=1), user_limit_factor=1.0),)
    bobs = at(placed("bob-low", n, [0], queue="q", user="bob", started_at=5_000.0), 0)
    alices = at(placed("alice-low", n, [1], queue="q", user="alice", started_at=0.0), 0)
    urgent = pending("urgent", 1, queue="q", user="alice", priority=5)
    assert preempted(plan(snapshot([n], [urgent], [bobs, alices], queues=queues))) == {"alice-low"}
    result = plan(snapshot([n], [urgent], [bobs], queues=queues))
    assert launches(result)["urgent"]  # alice holds nothing: within her limit, room free


def test_what_a_queues_victims_give_back_is_the_claimants_for_the_rest_of_the_plan() -> None:
    """low1 is stopped for urgent under q's max: peer, of q and a lower priority, must
    not take that share in the same plan (the stop would be for nothing)."""
    n = node("n", 4)
    queues = (QueueSpec("q", max=Resources(gpus=2)),)
    running = [
        at(placed("low0", n, [0], queue="q", started_at=9_900.0), 0),  # too young to stop
        at(placed("low1", n, [1], queue="q", started_at=0.0), 0),
    ]
    waiting = [pending("urgent", 1, queue="q", priority=5), pending("peer", 1, queue="q", at=1.0)]
    result = plan(snapshot([n], waiting, running, queues=queues))
    assert preempted(result) == {"low1"}
    assert "peer" not in launches(result) and result.waiting["peer"].code == "queue_max"


def test_a_queue_over_a_lowered_max_stops_enough_or_none() -> None:
    """q holds 3 GPUs under a max since lowered to 2: urgent is within it only with two
    of q's jobs gone. Two are too young to stop, so it stops none (not the one old job,
    for nothing); with them of age it stops two."""
    n = node("n", 4)
    queues = (QueueSpec("q", max=Resources(gpus=2)),)
    running = [
        at(placed("old", n, [0], queue="q", started_at=0.0), 0),
        at(placed("young1", n, [1], queue="q", started_at=9_900.0), 0),
        at(placed("young2", n, [2], queue="q", started_at=9_900.0), 0),
    ]
    urgent = pending("urgent", 1, queue="q", priority=5)
    assert not preempted(plan(snapshot([n], [urgent], running, queues=queues)))
    later = plan(snapshot([n], [urgent], running, queues=queues), now=10_300.0)
    assert len(preempted(later)) == 2


def test_a_claimant_keeps_its_share_of_a_capped_queue_for_the_rest_of_the_plan() -> None:
    """urgent stops low0 for its room (an 80 GB GPU), within q's max of 3: peer, of q,
    may not take urgent's share of the max in the same plan, or urgent would be over
    the max once low0 is gone and stop low1 too."""
    n1 = node("n1", 1, gpu_memory_mib=81_920)
    n2 = node("n2", 3, gpu_memory_mib=40_960)
    queues = (QueueSpec("q", max=Resources(gpus=3)),)
    running = [
        at(placed("low0", n1, [0], queue="q", started_at=0.0), 0),
        at(placed("low1", n2, [0], queue="q", started_at=0.0), 1),
    ]
    urgent = pending("urgent", 1, gpu_memory_mib=80_000, queue="q", priority=5)
    result = plan(
        snapshot([n1, n2], [urgent, pending("peer", 2, queue="q", at=1.0)], running, queues=queues)
    )
    assert preempted(result) == {"low0"}
    assert "peer" not in launches(result) and result.waiting["peer"].code == "queue_max"
