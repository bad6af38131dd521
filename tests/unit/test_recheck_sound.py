"""A plan's recheck time is never late (hypothesis).

`Plan.recheck_at` is when the plan's answer could first change with time alone: the
live scheduler and the simulator plan again then, and not before, unless an event
comes. So no plan made earlier, with nothing else changed, may preempt where the
first plan did not: the jobs it launched running since, every other job as it was.
Over random clusters, queues, service histories and minimum run times.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedd.policy import build
from schedd.policy.actions import Launch, Plan, Preempt
from schedd.policy.gittins import ServiceHistory
from schedd.policy.profiles import BUILTIN
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from schedd.policy.snapshot import Node, PendingJob, PlacedJob, Snapshot
from tests.unit.policy_harness import draw_free_gpus, node, pending, placed

NOW = 10_000.0
QUEUES = ("a", "b")


@st.composite
def cases(draw: st.DrawFn) -> tuple[Snapshot, float]:
    """A snapshot at NOW and a minimum run time."""
    nodes = [node(f"n{i}", draw(st.integers(1, 8))) for i in range(draw(st.integers(1, 4)))]
    free = [list(range(len(n.gpus))) for n in nodes]
    running = []
    for j in range(draw(st.integers(0, 10))):
        if (drawn := draw_free_gpus(draw, free)) is None:
            continue
        k, take = drawn
        started = NOW - draw(st.sampled_from([0.0, 30.0, 200.0, 5_000.0]))
        job = placed(
            f"r{j}",
            nodes[k],
            take,
            queue=draw(st.sampled_from(QUEUES)),
            started_at=started,
            attained_s=draw(st.sampled_from([0.0, 40.0, 3_000.0])),
            state=draw(st.sampled_from(["running", "running", "preempting"])),  # or leaving
        )
        # Service counted from the start, as the simulator keeps it: it grows with time.
        running.append(dataclasses.replace(job, attained_as_of=started))
    waiting = [
        pending(
            f"p{j}",
            draw(st.integers(1, 10)),
            at=float(j),
            queue=draw(st.sampled_from(QUEUES)),
            attained_s=draw(st.sampled_from([0.0, 0.0, 50.0, 2_000.0])),
        )
        for j in range(draw(st.integers(1, 6)))
    ]
    # Jobs an earlier plan found waiting for GPUs on their way out (or jobs no longer
    # pending: a shell may name one that has started since).
    claimants = draw(st.frozensets(st.sampled_from([f"p{i}" for i in range(7)]), max_size=2))
    samples = draw(st.lists(st.sampled_from([5.0, 60.0, 300.0, 4_000.0]), min_size=40))
    queues = tuple(QueueSpec(q, guarantee=Resources(gpus=draw(st.integers(0, 6)))) for q in QUEUES)
    snap = Snapshot(
        tuple(nodes),
        tuple(running),
        tuple(waiting),
        queues=queues,
        multi_node=draw(st.booleans()),
        service_history=ServiceHistory.of(samples),
        claimants=claimants,
    )
    return snap, draw(st.sampled_from([0.0, 100.0, 600.0]))


def _after(snap: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot once the plan's launches run, started at NOW."""
    launches = {a.job_id: a for a in plan.actions if isinstance(a, Launch)}
    started = [
        PlacedJob(
            j.job_id,
            j.user,
            j.queue,
            launches[j.job_id].shards,
            j.request,
            "running",
            started_at=NOW,
            attained_s=j.attained_s,
            attained_as_of=NOW,
        )
        for j in snap.pending
        if j.job_id in launches
    ]
    left: tuple[PendingJob, ...] = tuple(j for j in snap.pending if j.job_id not in launches)
    return dataclasses.replace(
        snap,
        placed=snap.placed + tuple(started),
        pending=left,
        claimants=frozenset(plan.claimants),  # kept by the shell, as the plan named them
    )


def _check(snap: Snapshot, name: str, min_run_s: float, share: float) -> bool:
    """Whether the case could be checked (a time before the recheck was left); fails if
    the later plan preempts."""
    spec = BUILTIN[name]
    profile = build(
        name,
        dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, min_run_s=min_run_s)),
    )
    first = profile.plan(snap, NOW)
    if any(isinstance(a, Preempt) for a in first.actions):
        return True  # the plan changed more than time will
    until = first.recheck_at if first.recheck_at is not None else NOW + 1_000_000.0
    later = NOW + share * (until - NOW)
    if later >= until:
        return False  # at the recheck time itself the answer may change
    second = profile.plan(_after(snap, first), later)
    preempted = [a.job_id for a in second.actions if isinstance(a, Preempt)]
    launched = {a.job_id for a in first.actions if isinstance(a, Launch)}
    if min_run_s == 0 and launched.intersection(preempted):
        # A job launched may be a victim as soon as it runs: the next plan, at whatever
        # event, finds it so (a recheck at once would only undo what the plan did), and
        # with it the victims beside it that make the room only together with it.
        return True
    assert not preempted, f"preempted {preempted} at {later}, before the recheck at {until}"
    return True


# Derandomized: the same 300 examples every run, so that the suite's verdict does not
# depend on what a random search happens to find; a wider search is run by hand with
# `derandomize=False` and more examples (the two cases below were found so, before the
# claims that now hold them).
@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    case=cases(),
    name=st.sampled_from(["default-guaranteed", "tiresias", "drf"]),
    share=st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
)
def test_no_preemption_comes_before_the_recheck_time(
    case: tuple[Snapshot, float], name: str, share: float
) -> None:
    snap, min_run_s = case
    assume(_check(snap, name, min_run_s, share))


def _running(job_id: str, on: Node, gpu: int, queue: str, attained: float) -> PlacedJob:
    """A 1-GPU job that started at NOW, its service counted from then."""
    job = placed(job_id, on, [gpu], queue=queue, started_at=NOW, attained_s=attained)
    return dataclasses.replace(job, attained_as_of=NOW)


def _two_queues(
    nodes: tuple[Node, ...], running: tuple[PlacedJob, ...], waiting: tuple[PendingJob, ...]
) -> Snapshot:
    """Queues a and b without guarantees; every finished job took 5 s."""
    return Snapshot(
        nodes,
        running,
        waiting,
        queues=tuple(QueueSpec(q, guarantee=Resources(gpus=0)) for q in QUEUES),
        service_history=ServiceHistory.of([5.0] * 40),
    )


def test_a_claim_on_leavers_survives_a_fair_tie_the_plans_launch_made() -> None:
    """p0 waits for r0's GPU and the free ones beside it; the plan's launch of p2 ties
    the two queues' fair shares, so the next plan would serve queue a first, whose p1
    would take those free GPUs. p0, the plan's claimant, is served first instead."""
    n0, n1, n2, n3 = node("n0", 1), node("n1", 7), node("n2", 1), node("n3", 1)
    leaving = dataclasses.replace(_running("r0", n1, 0, "a", 0.0), state="preempting")
    placed_jobs = (
        leaving,
        _running("r1", n2, 0, "a", 0.0),
        _running("r2", n0, 0, "b", 40.0),
        _running("r3", n1, 1, "a", 40.0),
    )
    waiting = tuple(
        pending(job_id, gpus, at=at, queue=queue)
        for job_id, gpus, at, queue in (
            ("p0", 6, 0.0, "b"),  # claims n1's 5 free GPUs and r0's leaving one
            ("p1", 2, 1.0, "a"),
            ("p2", 1, 2.0, "b"),  # launched: queue b then holds as much as a
            ("p3", 5, 3.0, "a"),
        )
    )
    snap = _two_queues((n0, n1, n2, n3), placed_jobs, waiting)
    assert _check(snap, "default-guaranteed", 0.0, 0.5)


def test_a_claim_on_leavers_survives_time_alone() -> None:
    """One queue's job waits for r6's GPUs on n2; with time alone the next plan would
    serve the other queue's job first, which would claim them, and the first would
    preempt. The claimant is served first instead."""
    n0, n1, n2 = node("n0", 3), node("n1", 1), node("n2", 3)
    leaving = dataclasses.replace(_running("r6", n2, 0, "a", 0.0), state="preempting")
    placed_jobs = (
        _running("r0", n0, 0, "a", 40.0),
        _running("r1", n1, 0, "b", 0.0),
        _running("r2", n0, 1, "a", 40.0),
        _running("r3", n0, 2, "a", 40.0),
        leaving,
    )
    waiting = (pending("p0", 3, at=0.0, queue="a"), pending("p1", 3, at=1.0, queue="b"))
    snap = _two_queues((n0, n1, n2), placed_jobs, waiting)
    assert _check(snap, "default-guaranteed", 0.0, 0.5)
