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
from schedd.policy.snapshot import PendingJob, PlacedJob, Snapshot
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
    samples = draw(st.lists(st.sampled_from([5.0, 60.0, 300.0, 4_000.0]), min_size=40))
    queues = tuple(QueueSpec(q, guarantee=Resources(gpus=draw(st.integers(0, 6)))) for q in QUEUES)
    snap = Snapshot(
        tuple(nodes),
        tuple(running),
        tuple(waiting),
        queues=queues,
        multi_node=draw(st.booleans()),
        service_history=ServiceHistory.of(samples),
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
    return dataclasses.replace(snap, placed=snap.placed + tuple(started), pending=left)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=cases(),
    name=st.sampled_from(["default-guaranteed", "tiresias", "drf"]),
    share=st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
)
def test_no_preemption_comes_before_the_recheck_time(
    case: tuple[Snapshot, float], name: str, share: float
) -> None:
    snap, min_run_s = case
    spec = BUILTIN[name]
    profile = build(
        name,
        dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, min_run_s=min_run_s)),
    )
    first = profile.plan(snap, NOW)
    if any(isinstance(a, Preempt) for a in first.actions):
        return  # the plan changed more than time will
    until = first.recheck_at if first.recheck_at is not None else NOW + 1_000_000.0
    later = NOW + share * (until - NOW)
    assume(later < until)  # at the recheck time itself the answer may change
    second = profile.plan(_after(snap, first), later)
    preempted = [a.job_id for a in second.actions if isinstance(a, Preempt)]
    if min_run_s == 0:
        # A job launched may be a victim as soon as it runs: the next plan, at whatever
        # event, finds it so (a recheck at once would only undo what the plan did).
        launched = {a.job_id for a in first.actions if isinstance(a, Launch)}
        preempted = [j for j in preempted if j not in launched]
    assert not preempted, f"preempted {preempted} at {later}, before the recheck at {until}"
