"""Grow/shrink (Gandiva): elastic jobs start on fewer GPUs where that is all there is,
grow into idle GPUs, and shrink to make room for a job that waits."""

from __future__ import annotations

import dataclasses

import pytest

from schedd.policy.actions import Plan, Resize, SetKind, Suspend
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.snapshot import (
    GUARANTEED,
    MIGRATING,
    Gpu,
    Node,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
)
from tests.unit.policy_harness import (
    HEAVY_TAIL,
    converted,
    launches,
    node,
    pending,
    placed,
    preempted,
    run,
    snapshot,
)


def elastic(job: PendingJob | PlacedJob, least: int, most: int) -> PendingJob | PlacedJob:
    return dataclasses.replace(job, gpu_range=(least, most))


def resizes(plan: Plan) -> dict[str, Resize]:
    return {a.job_id: a for a in plan.actions if isinstance(a, Resize)}


def test_an_elastic_job_starts_on_the_most_gpus_that_fit() -> None:
    n = node("n", 4)
    busy = [placed("busy", n, [0])]
    job = elastic(pending("e", 4), 2, 4)
    plan = run("fifo", snapshot([n], [job], busy))  # type: ignore[list-item]
    assert len(launches(plan)["e"].gpu_uuids) == 3
    assert "elastic, on 3 of its 4 GPUs" in launches(plan)["e"].reason
    # Below its least it waits, as any job would.
    crowded = [placed("busy", n, [0, 1, 2])]
    plan = run("fifo", snapshot([n], [job], crowded))  # type: ignore[list-item]
    assert plan.waiting["e"].code == "no_capacity"
    # A job that is not elastic never starts smaller.
    plan = run("fifo", snapshot([n], [pending("rigid", 4)], busy))
    assert plan.waiting["rigid"].code == "no_capacity"
    # One that no node could run whole is planned at the most a node could run, and
    # its label names its range's most.
    wide = elastic(pending("e", 8), 2, 8)
    plan = run("fifo", snapshot([n], [wide], busy))  # type: ignore[list-item]
    assert "elastic, on 3 of its 8 GPUs" in launches(plan)["e"].reason


def test_an_elastic_job_starts_smaller_on_what_the_jobs_behind_it_leave() -> None:
    # Where jobs that do not fit are passed over (gandiva), an elastic job that does not
    # fit whole lets the jobs behind it that fit go first, and starts on what is left.
    n = node("n", 8)
    busy = [placed("busy", n, [0, 1, 2])]
    first = elastic(pending("e", 8, at=0.0), 4, 8)
    behind = pending("r", 1, at=10.0)
    plan = run("gandiva", snapshot([n], [first, behind], busy))  # type: ignore[list-item]
    assert len(launches(plan)["r"].gpu_uuids) == 1
    assert len(launches(plan)["e"].gpu_uuids) == 4
    assert "elastic, on 4 of its 8 GPUs" in launches(plan)["e"].reason
    # Where too little is left it waits, as any job would.
    behind2 = pending("r2", 1, at=20.0)
    plan = run("gandiva", snapshot([n], [first, behind, behind2], busy))  # type: ignore[list-item]
    assert set(launches(plan)) == {"r", "r2"}
    assert plan.waiting["e"].code == "no_capacity"
    # In submission order kept strictly (fifo), it starts smaller in its place.
    plan = run("fifo", snapshot([n], [first, behind], busy))  # type: ignore[list-item]
    assert len(launches(plan)["e"].gpu_uuids) == 5
    assert plan.waiting["r"].code == "no_capacity"


def test_an_elastic_job_takes_turns_at_its_full_count_before_starting_smaller() -> None:
    full, roomy = node("full", 8), node("roomy", 8)
    partner = placed("p", full, list(range(8)), started_at=0.0)
    busy = placed("busy", roomy, [0, 1, 2])
    job = elastic(pending("e", 8), 4, 8)
    plan = run("gandiva", snapshot([full, roomy], [job], [partner, busy]), now=1000.0)  # type: ignore[list-item]
    assert [a.job_id for a in plan.actions if isinstance(a, Suspend)] == ["p"]
    assert {s.node_id for s in launches(plan)["e"].shards} == {"full"}
    assert len(launches(plan)["e"].gpu_uuids) == 8
    # With no one of its count to take turns with, it starts smaller on the free GPUs.
    ones = [placed(f"one{i}", full, [i], started_at=0.0) for i in range(8)]
    plan = run("gandiva", snapshot([full, roomy], [job], [*ones, busy]), now=1000.0)  # type: ignore[list-item]
    assert not any(isinstance(a, Suspend) for a in plan.actions)
    assert {s.node_id for s in launches(plan)["e"].shards} == {"roomy"}
    assert len(launches(plan)["e"].gpu_uuids) == 5


def test_an_elastic_job_grows_into_idle_gpus_when_nobody_waits() -> None:
    n = node("n", 4)
    small = elastic(placed("e", n, [0, 1], estimate_s=20_000.0), 1, 4)
    plan = run("gandiva", snapshot([n], [], [small]), now=1000.0)  # type: ignore[list-item]
    grown = resizes(plan)["e"]
    assert (grown.gpus, grown.node_id) == (4, "n")
    assert grown.gpu_uuids == ("n-g0", "n-g1", "n-g2", "n-g3")  # its own first
    assert "grows into 2 idle GPU(s)" in grown.reason
    # Not while a job waits for GPUs, nor with too little left to gain, nor in a profile
    # without grow/shrink.
    waiting = pending("w", 4)
    plan = run("gandiva", snapshot([n], [waiting], [small]), now=1000.0)  # type: ignore[list-item]
    assert resizes(plan) == {}
    ending = dataclasses.replace(small, estimate_s=50.0)  # 50 s x 4 GPUs of work: 100 s on 2
    assert resizes(run("gandiva", snapshot([n], [], [ending]), now=1000.0)) == {}
    assert resizes(run("default", snapshot([n], [], [small]), now=1000.0)) == {}  # type: ignore[list-item]


@pytest.mark.parametrize("profile", ["default", "drf", "antman"])
def test_an_elastic_job_over_its_queues_max_whole_starts_within_it(profile: str) -> None:
    """Queue a may hold 4 GPUs, 1 of them held already: e (2 to 8) starts on 3; a rigid
    job of 8 waits at the max."""
    n = node("n", 8)
    queues = (QueueSpec("a", max=Resources(gpus=4)),)
    held = [placed("r", n, [7], queue="a")]
    e = elastic(pending("e", 8, queue="a"), 2, 8)
    plan = run(profile, snapshot([n], [e], held, queues=queues))  # type: ignore[list-item]
    assert len(launches(plan)["e"].gpu_uuids) == 3
    plan = run(profile, snapshot([n], [pending("e", 8, queue="a")], held, queues=queues))
    assert plan.waiting["e"].code == "queue_max"


@pytest.mark.parametrize(
    ("limits", "grows_by"),
    [
        ({"max": Resources(gpus=4)}, 1),  # a holds r's GPU and e's 2: one more
        ({"max": Resources(gpus=1 << 40, gpu_memory_mib=200_000)}, 2),  # 3 x 40,000 held
        ({"guarantee": Resources(gpus=2), "user_limit_factor": 2.0}, 2),  # bob: 4 at most
        ({}, 6),
    ],
)
def test_an_elastic_job_grows_within_its_queues_max_and_its_users_limit(
    limits: dict[str, object], grows_by: int
) -> None:
    """Growth is admitted as a new job would be: within every max of the queue (GPUs,
    GPU memory) and the user's limit."""
    n = node("n", 10)
    queues = (QueueSpec("a", **limits),)  # type: ignore[arg-type]
    held = [placed("r", n, [9], gpu_memory_mib=40_000, queue="a", user="carol")]
    e = placed("e", n, [0, 1], gpu_memory_mib=40_000, estimate_s=1e6, queue="a", user="bob")
    snap = snapshot([n], [], [*held, elastic(e, 1, 8)], queues=queues)  # type: ignore[list-item]
    plan = run("gandiva", snap, now=10_000.0)
    assert resizes(plan)["e"].gpus == 2 + grows_by


def test_two_jobs_growing_in_one_plan_count_each_others_growth() -> None:
    """Queue a may hold 4 GPUs; e1 and e2 hold one each: e1 grows by the 2 left, and e2,
    counting e1's growth, by none."""
    n = node("n", 8)
    queues = (QueueSpec("a", max=Resources(gpus=4)),)
    e1 = elastic(placed("e1", n, [0], estimate_s=1e6, queue="a"), 1, 4)
    e2 = elastic(placed("e2", n, [1], estimate_s=1e6, queue="a", user="bob"), 1, 4)
    plan = run("gandiva", snapshot([n], [], [e1, e2], queues=queues), now=10_000.0)  # type: ignore[list-item]
    assert {job_id: r.gpus for job_id, r in resizes(plan).items()} == {"e1": 3}


def test_a_job_saving_a_checkpoint_to_grow_counts_its_new_gpus_in_its_queue() -> None:
    """e (2 GPUs) grows to 4 in queue a (max 4): while it saves its checkpoint it holds
    4 of a's, and j (2 more) waits at the max rather than take a past it."""
    n = node("n", 8)
    queues = (QueueSpec("a", max=Resources(gpus=4)),)
    e = elastic(placed("e", n, [0, 1], estimate_s=1e6, queue="a"), 1, 4)
    growing = dataclasses.replace(
        e, state=MIGRATING, moving_to=(Shard("n", ("n-g0", "n-g1", "n-g2", "n-g3")),)
    )
    plan = run(
        "default-gandiva", snapshot([n], [pending("j", 2, queue="a")], [growing], queues=queues)
    )  # type: ignore[list-item]
    assert plan.waiting["j"].code == "queue_max"


def test_an_elastic_job_grows_only_into_gpus_with_the_memory_it_asks() -> None:
    """e asks 40,000 MiB a GPU: of the 6 idle GPUs it grows into the 2 of 80 GiB, not
    into the 4 of 16 GiB."""
    sizes = [81_920] * 4 + [16_384] * 4
    n = Node("n", tuple(Gpu(f"n-g{i}", i, "A100", m) for i, m in enumerate(sizes)), 64, 512_000)
    job = placed("e", n, [0, 1], estimate_s=1e6)
    job = elastic(dataclasses.replace(job, request=Request(2, 1, 1024, 40_000)), 1, 6)
    plan = run("gandiva", snapshot([n], [], [job]), now=10_000.0)  # type: ignore[list-item]
    assert resizes(plan)["e"].gpu_uuids == ("n-g0", "n-g1", "n-g2", "n-g3")


def test_an_elastic_job_shrinks_to_make_room_for_a_waiting_job() -> None:
    n = node("n", 4)
    big = elastic(placed("e", n, [0, 1, 2, 3], estimate_s=50_000.0), 1, 4)
    plan = run("gandiva", snapshot([n], [pending("w", 2)], [big]), now=1000.0)  # type: ignore[list-item]
    shrunk = resizes(plan)["e"]
    assert (shrunk.gpus, shrunk.gpu_uuids) == (2, ("n-g0", "n-g1"))
    assert "to make room on node n for job w" in shrunk.reason
    assert plan.waiting["w"].code == "no_capacity"  # it starts once e has restarted
    # Never below its least: a job of 3 GPUs cannot be made room for by a 2..4 job.
    firm = elastic(big, 2, 4)
    plan = run("gandiva", snapshot([n], [pending("w", 3)], [firm]), now=1000.0)  # type: ignore[list-item]
    assert resizes(plan) == {}
    # Not worth it where the waiting job's wait is short.
    soon = dataclasses.replace(big, estimate_s=1010.0)
    assert resizes(run("gandiva", snapshot([n], [pending("w", 2)], [soon]), now=1000.0)) == {}


def test_two_jobs_never_grow_into_the_same_gpus() -> None:
    n = node("n", 4)
    longer = elastic(placed("long", n, [0], estimate_s=40_000.0), 1, 4)
    shorter = elastic(placed("short", n, [1], estimate_s=20_000.0), 1, 4)
    plan = run("gandiva", snapshot([n], [], [shorter, longer]), now=1000.0)  # type: ignore[list-item]
    # The one with the most left goes first and takes both idle GPUs.
    assert {j: (r.gpus, r.gpu_uuids) for j, r in resizes(plan).items()} == {
        "long": (3, ("n-g0", "n-g2", "n-g3"))
    }


def test_an_elastic_job_within_its_queues_guarantee_starts_smaller_in_its_place() -> None:
    """Queue a holds none of its 8 guaranteed GPUs, b borrows 4: a's elastic job starts
    on the 4 free at once, before b's job behind it. b's own elastic job, borrowing,
    lets that job go first (and waits for more)."""
    n = node("n", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=8)), QueueSpec("b"))
    held = [placed("b_old", n, [0, 1, 2, 3], queue="b", started_at=9_900.0)]
    behind = pending("r", 2, at=10.0, queue="b")
    owner = elastic(pending("e", 8, queue="a"), 4, 8)
    plan = run("default-gandiva", snapshot([n], [owner, behind], held, queues=queues), now=1e4)  # type: ignore[list-item]
    assert len(launches(plan)["e"].gpu_uuids) == 4
    assert plan.waiting["r"].code == "no_capacity"
    borrower = elastic(pending("e", 8, queue="b"), 4, 8)
    plan = run("default-gandiva", snapshot([n], [borrower, behind], held, queues=queues), now=1e4)  # type: ignore[list-item]
    assert set(launches(plan)) == {"r"}
    assert plan.waiting["e"].code == "no_capacity"


def test_an_elastic_job_takes_a_turn_where_a_rigid_one_would_preempt() -> None:
    """Under `default-gandiva` the Gittins preemption comes before the turns: a rigid
    newcomer stops the long runner; an elastic one takes turns with it instead."""
    n = node("n", 8)
    runner = placed("runner", n, list(range(8)), started_at=0.0, attained_s=80_000.0)
    job = elastic(pending("e", 8, at=9_990.0), 4, 8)
    snap = snapshot([n], [job], [runner], service_history=HEAVY_TAIL)  # type: ignore[list-item]
    plan = run("default-gandiva", snap, now=10_000.0)
    assert [a.job_id for a in plan.actions if isinstance(a, Suspend)] == ["runner"]
    assert not preempted(plan) and len(launches(plan)["e"].gpu_uuids) == 8
    rigid = dataclasses.replace(snap, pending=(pending("e", 8, at=9_990.0),))
    plan = run("default-gandiva", rigid, now=10_000.0)
    assert preempted(plan) == {"runner"} and "e" not in launches(plan)


def test_an_elastic_job_made_opportunistic_shares_in_its_place() -> None:
    """Every GPU is held, little used: e, made opportunistic and elastic, has no room
    as guaranteed at any count; it shares them in its place, before o behind it."""
    n = node("n", 4)
    held = [placed(f"h{i}", n, [i], started_at=0.0, utilization_pct=5) for i in range(4)]
    e = converted(elastic(pending("e", 4, at=0.0), 2, 4))  # type: ignore[arg-type]
    o = converted(pending("o", 4, at=10.0))
    plan = run("default", snapshot([n], [e, o], held), now=10_000.0)
    assert "opportunistic" in launches(plan)["e"].reason
    assert plan.waiting["o"].code == "no_shareable_gpu"


def test_an_elastic_job_within_its_guarantee_takes_a_turn_before_it_preempts() -> None:
    """As a borrowing one does: the runner, of its own queue, is paused, not stopped."""
    n = node("n", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=16)),)
    runner = placed("runner", n, list(range(8)), queue="a", attained_s=80_000.0)
    job = elastic(pending("e", 8, at=9_990.0, queue="a"), 4, 8)
    snap = snapshot([n], [job], [runner], queues=queues, service_history=HEAVY_TAIL)  # type: ignore[list-item]
    plan = run("default-gandiva", snap, now=10_000.0)
    assert [a.job_id for a in plan.actions if isinstance(a, Suspend)] == ["runner"]
    assert not preempted(plan) and len(launches(plan)["e"].gpu_uuids) == 8


def test_an_elastic_job_reclaims_what_its_guarantee_covers_of_its_range() -> None:
    """Queue a's guarantee covers 4 of e's 4..8 GPUs: b's borrowed GPUs are taken back
    for e at 4, though 8 would be beyond the guarantee; r of b, behind it, waits."""
    n = node("n", 8)
    queues = (QueueSpec("a", guarantee=Resources(gpus=4)), QueueSpec("b"))
    held = [placed(f"b{i}", n, [i], queue="b") for i in range(8)]
    job = elastic(pending("e", 8, queue="a"), 4, 8)
    behind = pending("r", 2, at=10.0, queue="b")
    plan = run("drf", snapshot([n], [job, behind], held, queues=queues), now=10_000.0)  # type: ignore[list-item]
    assert len(preempted(plan)) == 4
    assert plan.waiting["e"].code == "preempting"
    assert "r" not in launches(plan)


def test_a_converted_elastic_job_that_cannot_share_starts_smaller_once_the_order_is_through() -> (
    None
):
    """The busy GPUs are not little used, so e cannot share 8; deferred, it takes its
    guarantee back on the 4 free GPUs (no queue holds one: it would only borrow)."""
    n = node("n", 8)
    held = [placed(f"h{i}", n, [i], utilization_pct=95, queue="b") for i in range(4)]
    e = converted(elastic(pending("e", 8), 4, 8))  # type: ignore[arg-type]
    plan = run("default", snapshot([n], [e], held), now=10_000.0)
    assert len(launches(plan)["e"].gpu_uuids) == 4
    assert [(a.job_id, a.kind) for a in plan.actions if isinstance(a, SetKind)] == [
        ("e", GUARANTEED)
    ]
    assert "e" not in plan.waiting
