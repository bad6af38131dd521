"""Priority preemption within a queue (`make_room.priority`), in a profile that names it."""

from __future__ import annotations

import dataclasses

from schedd.policy import build
from schedd.policy.actions import Plan
from schedd.policy.profiles import ProfileSpec, stages
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
