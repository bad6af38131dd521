"""Time-slicing (Gandiva): a job that finds no free GPUs takes turns with a running job
of its GPU count, and suspended jobs come back by weighted round-robin."""

from __future__ import annotations

import dataclasses

from schedd.policy import build
from schedd.policy.actions import Launch, Plan, Resume, Suspend
from schedd.policy.gittins import ServiceHistory
from schedd.policy.profiles import ProfileSpec
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.snapshot import SUSPENDED, PendingJob, PlacedJob, Request
from tests.unit.policy_harness import assert_valid, launches, node, pending, placed, run, snapshot


def paused(job: PlacedJob, since: float) -> PlacedJob:
    return dataclasses.replace(job, state=SUSPENDED, state_since=since)


def turn(job: PlacedJob, since: float) -> PlacedJob:
    return dataclasses.replace(job, state_since=since)


def kinds(plan: Plan) -> list[tuple[str, str]]:
    """The plan's suspends, resumes and launches, in order."""
    wanted = (Suspend, Resume, Launch)
    return [(type(a).__name__, a.job_id) for a in plan.actions if isinstance(a, wanted)]


def test_a_job_with_no_free_gpus_takes_turns_with_a_job_of_its_size() -> None:
    n = node("n", 4)
    running = [placed("one", n, [0]), placed("two", n, [1, 2]), placed("one-b", n, [3])]
    plan = run("gandiva", snapshot([n], [pending("new", 2)], running), now=1000.0)
    # Its partner has its GPU count (Gandiva's affinity): paused first, then it starts there.
    assert kinds(plan) == [("Suspend", "two"), ("Launch", "new")]
    assert plan.recheck_at == 1600.0  # when the newcomer's turn ends, for two's turn
    assert launches(plan)["new"].gpu_uuids == ("n-g1", "n-g2")
    assert "takes turns" in next(a for a in plan.actions if isinstance(a, Suspend)).reason
    # With no running job of its size it waits, as in any profile.
    plan = run("gandiva", snapshot([n], [pending("new", 3)], running), now=1000.0)
    assert plan.actions == []
    assert plan.waiting["new"].code == "no_capacity"


def test_the_gittins_order_with_gandivas_mechanisms_takes_turns_where_it_would_not_preempt() -> (
    None
):
    """Run times alike: a job that has run is worth more than a newcomer, so the
    Gittins index preempts nobody; `default-gandiva` then takes turns,
    `default-guaranteed` (the same without Gandiva's mechanisms) waits."""
    n = node("n", 1)
    alike = ServiceHistory.of([10_000.0 + i for i in range(64)])
    held = [placed("runner", n, [0], attained_s=5_000.0, started_at=0.0)]
    snap = snapshot([n], [pending("new", 1)], held, service_history=alike)
    assert run("default-guaranteed", snap, now=10_000.0).actions == []
    plan = run("default-gandiva", snap, now=10_000.0)
    assert kinds(plan) == [("Suspend", "runner"), ("Launch", "new")]


def test_nobody_takes_turns_with_a_job_its_user_paused() -> None:
    """A user's suspend keeps the job's GPUs: the scheduler may not pause it for another
    (live, that suspend would be refused, cycle after cycle)."""
    n = node("n", 2)
    held = [placed("mine", n, [0]), placed("other", n, [1])]
    plan = run("gandiva", snapshot([n], [pending("new")], held), now=1000.0)
    assert kinds(plan) == [("Suspend", "mine"), ("Launch", "new")]
    held[0] = dataclasses.replace(held[0], paused=True)
    plan = run("gandiva", snapshot([n], [pending("new")], held), now=1000.0)
    assert kinds(plan) == [("Suspend", "other"), ("Launch", "new")]
    held[1] = dataclasses.replace(held[1], paused=True)
    plan = run("gandiva", snapshot([n], [pending("new")], held), now=1000.0)
    assert kinds(plan) == [] and plan.waiting["new"].code == "no_capacity"


def test_other_profiles_never_time_slice() -> None:
    n = node("n", 1)
    plan = run("fifo", snapshot([n], [pending("new")], [placed("a", n, [0])]), now=100.0)
    assert plan.actions == [] and plan.waiting["new"].code == "no_capacity"


def test_the_least_shared_gpus_first_then_the_longest_turn() -> None:
    n = node("n", 4)
    a = turn(placed("a", n, [0]), 50.0)
    b = turn(placed("b", n, [1]), 10.0)
    c = turn(placed("c", n, [2]), 0.0)
    d = turn(placed("d", n, [3]), 400.0)
    d_partner = paused(placed("d2", n, [3]), 300.0)
    waiting = [pending("x"), pending("y"), pending("z"), pending("w")]
    snap = snapshot([n], waiting, [a, b, c, d, d_partner])
    plan = run("gandiva", snap, now=1000.0, timeslice_max=3)
    # The unshared first, the one whose turn began longest ago first. d's turn is over
    # too, but d2 has waited for it: d2 takes it, and w waits for the next.
    assert [launches(plan)[j].gpu_uuids for j in "xyz"] == [("n-g2",), ("n-g1",), ("n-g0",)]
    assert ("Resume", "d2") in kinds(plan) and plan.waiting["w"].code == "no_capacity"
    # At most `timeslice_max` jobs take turns on one set of GPUs: with 1, none.
    plan = run("gandiva", snap, now=1000.0, timeslice_max=1)
    assert not launches(plan)


def test_a_partner_needs_room_for_the_jobs_cpus_and_memory_beside_it() -> None:
    n = node("n", 1, cpus=4)
    running = [placed("a", n, [0], cpus=3)]
    plan = run("gandiva", snapshot([n], [pending("big", cpus=2)], running), now=1000.0)
    assert plan.actions == []
    plan = run("gandiva", snapshot([n], [pending("small", cpus=1)], running), now=1000.0)
    assert kinds(plan) == [("Suspend", "a"), ("Launch", "small")]


def test_a_newcomer_never_cuts_a_turn_short() -> None:
    n = node("n", 1)
    young = turn(placed("young", n, [0]), 900.0)  # resumed or started 100 s ago
    plan = run("gandiva", snapshot([n], [pending("new")], [young]), now=1000.0)
    assert plan.actions == [] and plan.waiting["new"].code == "no_capacity"
    assert plan.recheck_at == 900.0 + 600.0 - 60.0  # its turn is over then (the slack)
    assert kinds(run("gandiva", snapshot([n], [pending("new")], [young]), now=1440.0)) == [
        ("Suspend", "young"),
        ("Launch", "new"),
    ]


def test_a_job_that_needs_large_gpus_never_takes_turns_on_small_ones() -> None:
    small = node("small", 1, gpu_memory_mib=16_384)
    large = node("large", 2)  # it could run there one day: it is not refused outright
    running = [placed("r", small, [0]), placed("l", large, [0, 1])]
    big = dataclasses.replace(pending("big"), request=Request(1, 1, 1024, 40_000))
    plan = run("gandiva", snapshot([small, large], [big], running), now=1000.0)
    assert plan.actions == []
    assert plan.waiting["big"].code == "no_capacity"


def test_turns_rotate_when_the_running_jobs_turn_is_over() -> None:
    n = node("n", 1)
    waiting = paused(placed("s", n, [0]), 0.0)
    active = turn(placed("a", n, [0]), 100.0)
    snap = snapshot([n], [], [waiting, active])
    early = run("gandiva", snap, now=500.0, timeslice_s=600.0)
    assert early.actions == []
    assert early.recheck_at == 700.0  # when a's turn ends, though nothing is pending
    due = run("gandiva", snap, now=700.0, timeslice_s=600.0)
    assert kinds(due) == [("Suspend", "a"), ("Resume", "s")]
    assert due.recheck_at == 1300.0  # s's turn ends then: a's comes again
    assert "turn is over" in due.actions[0].reason  # type: ignore[union-attr]


def test_turns_are_weighted_by_queue() -> None:
    n = node("n", 1)
    heavy = QueueSpec("heavy", weight=2.0)
    waiting = paused(placed("s", n, [0]), 0.0)
    active = turn(placed("a", n, [0], queue="heavy"), 100.0)
    snap = snapshot([n], [], [waiting, active], queues=(heavy,))
    assert run("gandiva", snap, now=700.0, timeslice_s=600.0).actions == []
    assert run("gandiva", snap, now=700.0, timeslice_s=600.0).recheck_at == 1300.0
    assert kinds(run("gandiva", snap, now=1300.0, timeslice_s=600.0)) == [
        ("Suspend", "a"),
        ("Resume", "s"),
    ]


def test_a_suspended_job_resumes_on_its_freed_gpus_before_a_pending_job_takes_them() -> None:
    n = node("n", 1)
    waiting = paused(placed("s", n, [0]), 0.0)
    plan = run("gandiva", snapshot([n], [pending("new")], [waiting]), now=10.0)
    # The GPU is free (its partner ended): s resumes at once, and new takes turns with s.
    assert kinds(plan) == [("Resume", "s")]
    assert plan.waiting["new"].code == "no_capacity"


def test_the_longest_paused_job_goes_first() -> None:
    n = node("n", 1)
    older = paused(placed("older", n, [0]), 5.0)
    newer = paused(placed("newer", n, [0]), 50.0)
    active = turn(placed("a", n, [0]), 0.0)
    plan = run("gandiva", snapshot([n], [], [newer, older, active]), now=900.0, timeslice_max=3)
    assert kinds(plan) == [("Suspend", "a"), ("Resume", "older")]


def test_a_gpu_held_by_a_job_that_cannot_pause_keeps_its_suspended_job_waiting() -> None:
    n = node("n", 1)
    waiting = paused(placed("s", n, [0]), 0.0)
    leaving = placed("p", n, [0], state="preempting")
    plan = run("gandiva", snapshot([n], [], [waiting, leaving]), now=5000.0)
    assert plan.actions == []


def test_a_suspended_job_holds_no_gpu_and_no_share_of_its_queue() -> None:
    """Another profile sees a suspended job's GPUs as free (it does not rotate turns)."""
    n = node("n", 1)
    waiting = paused(placed("s", n, [0]), 0.0)
    plan = run("drf", snapshot([n], [pending("new")], [waiting]), now=10.0)
    assert launches(plan)["new"].gpu_uuids == ("n-g0",)


def test_a_borrower_takes_no_turns_from_a_queue_within_its_guarantee() -> None:
    """a holds exactly its guarantee: b's job, a borrower, waits rather than pause a's
    job; a's own newcomer takes turns with it (a turn inside a queue keeps its total)."""
    n = node("n", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=8)), QueueSpec("b"))
    running = [placed("a1", n, list(range(8)), queue="a")]
    plan = run(
        "default-gandiva",
        snapshot([n], [pending("b1", 8, queue="b")], running, queues=queues),
        now=10_000.0,
    )
    assert kinds(plan) == []
    assert plan.waiting["b1"].code == "no_capacity"
    plan = run(
        "default-gandiva",
        snapshot([n], [pending("a2", 8, queue="a")], running, queues=queues),
        now=10_000.0,
    )
    assert kinds(plan) == [("Suspend", "a1"), ("Launch", "a2")]
    # Above its guarantee a lends what it holds beyond it: one of two 4-GPU jobs.
    halves = [placed("a1", n, [0, 1, 2, 3], queue="a"), placed("a2", n, [4, 5, 6, 7], queue="a")]
    lender = (QueueSpec("a", guarantee=Resources(gpus=4)), QueueSpec("b"))
    snap = snapshot([n], [pending("b1", 4, queue="b")], halves, queues=lender)
    assert kinds(run("default-gandiva", snap, now=10_000.0)) == [
        ("Suspend", "a1"),
        ("Launch", "b1"),
    ]


def test_a_turn_never_takes_a_queue_within_its_guarantee_below_it() -> None:
    """b's job, paused, would come back in place of a's, whose queue then holds none of
    its guarantee: it stays paused while a holds no more than its guarantee."""
    n = node("n", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=8)), QueueSpec("b"))
    held = [
        paused(placed("b1", n, list(range(8)), queue="b"), 0.0),
        turn(placed("a1", n, list(range(8)), queue="a"), 100.0),
    ]
    plan = run("gandiva", snapshot([n], [], held, queues=queues), now=5_000.0)
    assert kinds(plan) == []
    plan = run("gandiva", snapshot([n], [], held, queues=(QueueSpec("b"),)), now=5_000.0)
    assert kinds(plan) == [("Suspend", "a1"), ("Resume", "b1")]


def test_a_paused_job_comes_back_only_within_its_queues_max() -> None:
    """A paused job holds nothing of its queue's, so a2 was admitted beside it; a1's
    turn then waits while a would exceed its max of 8, and comes when a2 is gone."""
    n1, n2 = node("n1", 8), node("n2", 8)
    queues = (QueueSpec("a", max=Resources(gpus=8)), QueueSpec("b"))
    a1 = paused(placed("a1", n1, list(range(8)), queue="a"), 0.0)
    b1 = turn(placed("b1", n1, list(range(8)), queue="b"), 100.0)
    a2 = placed("a2", n2, list(range(8)), queue="a", started_at=200.0)
    plan = run("default-gandiva", snapshot([n1, n2], [], [a1, b1, a2], queues=queues), now=5_000.0)
    assert kinds(plan) == []
    plan = run("default-gandiva", snapshot([n1, n2], [], [a1, b1], queues=queues), now=5_000.0)
    assert kinds(plan) == [("Suspend", "b1"), ("Resume", "a1")]
    # In place of a job of its own queue, what that job gives back counts: a turn.
    a3 = turn(placed("a3", n1, list(range(8)), queue="a"), 100.0)
    plan = run("default-gandiva", snapshot([n1, n2], [], [a1, a3], queues=queues), now=5_000.0)
    assert kinds(plan) == [("Suspend", "a3"), ("Resume", "a1")]


def test_gpus_freed_for_a_claimant_go_to_it_not_to_a_paused_job() -> None:
    """C reclaimed a's guarantee by stopping V, with whom S took turns. V gone, its
    GPUs are C's: S resuming there first would have C stop S too."""
    n = node("n", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=8)), QueueSpec("b"))
    v = turn(placed("V", n, list(range(8)), queue="b", started_at=0.0), 8_000.0)
    s = paused(placed("S", n, list(range(8)), queue="b", user="u2", started_at=0.0), 8_000.0)
    c = pending("C", 8, queue="a", at=9_000.0)
    first = run("default-gandiva", snapshot([n], [c], [v, s], queues=queues), now=8_100.0)
    assert first.claimants == {"C"}
    after = dataclasses.replace(
        snapshot([n], [c], [s], queues=queues), claimants=frozenset(first.claimants)
    )
    plan = run("default-gandiva", after, now=8_200.0)
    assert kinds(plan) == [("Launch", "C")]
    # With no claimant, S resumes on its freed GPUs before any pending job.
    alone = run("default-gandiva", snapshot([n], [c], [s], queues=queues), now=8_200.0)
    assert ("Resume", "S") in kinds(alone)


def test_a_job_turned_down_for_a_guarantee_leaves_its_twin_free_to_take_turns() -> None:
    """x1 may not take turns with p1 (p holds no more than its guarantee); p2 then
    starts, and p is above it: x2, alike to x1, takes turns with p1 (a "none" kept from
    x1 would have had it wait)."""
    a, b = node("a", 1, gpu_memory_mib=81_920), node("b", 1, gpu_memory_mib=40_960)
    queues = (QueueSpec("p", guarantee=Resources(gpus=1)),)
    p1 = placed("p1", a, [0], queue="p", started_at=0.0)

    def x(job_id: str, at: float) -> PendingJob:
        return pending(job_id, 1, gpu_memory_mib=60_000, queue="x", user="xu", at=at)

    waiting = [x("x1", 0.0), pending("p2", 1, queue="p", at=1.0), x("x2", 2.0)]
    plan = run("gandiva", snapshot([a, b], waiting, [p1], queues=queues), now=1000.0)
    assert launches(plan)["p2"].gpu_uuids == ("b-g0",)
    assert kinds(plan)[-2:] == [("Suspend", "p1"), ("Launch", "x2")]


def test_a_paused_job_that_would_pause_another_leaves_the_free_gpus_to_a_claimant() -> None:
    """S (g0 and g1) would resume in place of B on g0 and take the free g1 too, which
    claimant C was stopped for: it does not; C starts on g1."""
    spec = ProfileSpec("fifo", "best_fit", make_room=("timeslice",), decide=("timeslice",))
    n = node("n", 2)
    s = paused(placed("S", n, [0, 1]), 0.0)
    b = turn(placed("B", n, [0], started_at=0.0), 0.0)
    snap = dataclasses.replace(snapshot([n], [pending("C", 1)], [s, b]), claimants=frozenset({"C"}))
    plan = build("fifo-timeslice", spec).plan(snap, 5000.0)
    assert_valid(snap, plan)
    assert kinds(plan) == [("Launch", "C")]


def test_no_turns_are_taken_from_a_queue_within_its_guarantee_of_cpus() -> None:
    """b is guaranteed 4 CPUs (no GPUs) and holds 3: a job of a, a borrower, may not
    pause b's job (reclaim keeps b at that guarantee too)."""
    spec = ProfileSpec("fifo", "best_fit", make_room=("timeslice",), decide=("timeslice",))
    n = node("n", 1)
    queues = (QueueSpec("a"), QueueSpec("b", guarantee=Resources(gpus=0, cpus=4.0)))
    held = [placed("B", n, [0], cpus=3, queue="b", started_at=0.0)]
    snap = snapshot([n], [pending("N", 1, cpus=1, queue="a")], held, queues=queues)
    plan = build("fifo-timeslice", spec).plan(snap, 5000.0)
    assert_valid(snap, plan)
    assert kinds(plan) == []
