"""Preemption by Gittins index: a waiting job displaces running jobs of a lower index.

Victims come from the job's own tenant queue, lowest index first (latest started first
among equals), none younger than `min_run_s`. Where run times are alike a job that has
started always has the higher index, and nothing is ever preempted for a newcomer; where
they are heavy-tailed, long runners give way to new jobs, as under 2D-LAS. With no
history to learn from yet, this is 2D-LAS preemption (`make_room.las`).
"""

from __future__ import annotations

from collections import defaultdict

from schedd.policy.make_room import las
from schedd.policy.make_room.victims import Eviction, PlaceFn, fewest_victims, protection_ends
from schedd.policy.order.gittins import rank, table
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View


def _by_rank(view: View) -> dict[str, list[tuple[float, PlacedJob]]]:
    """Per tenant queue, its placed jobs as (rank, job), lowest priority first."""
    key = ("gittins_victims",)
    known = view.memo.get(key)
    if known is None:
        ranked: dict[str, list[tuple[float, float, str, PlacedJob]]] = defaultdict(list)
        for job in view.snapshot.placed:
            ranked[job.queue].append((-rank(job, view), -view.started(job), job.job_id, job))
        known = {q: [(-r, j) for r, _, _, j in sorted(jobs)] for q, jobs in ranked.items()}
        view.memo[key] = known
    return known  # type: ignore[return-value]


def make_room(job: PendingJob, view: View, place: PlaceFn) -> Eviction | None:
    if table(view) is None:
        return las.make_room(job, view, place)
    mine = rank(job, view)
    memo = ("gittins", job.queue, mine, job.request)
    if memo in view.memo:
        return None  # found no victims earlier in this cycle; there are fewer now
    ranked = [v for theirs, v in _by_rank(view).get(job.queue, ()) if theirs > mine]
    victims = fewest_victims(job, view, ranked, place) if ranked else None
    if victims is None:
        view.memo[memo] = None
        return None
    return Eviction(victims, f"preempted: job {job.job_id} has the higher Gittins index")


def recheck_at(view: View) -> float | None:
    """When a running job next comes of age, or its index (which changes as its service
    grows by its GPU count each second) falls below that of a job waiting in its queue."""
    learned = table(view)
    if learned is None:
        return las.recheck_at(view)
    best: dict[str, float] = {}  # per tenant queue, the highest index waiting
    for waiter in view.snapshot.pending:
        best[waiter.queue] = max(best.get(waiter.queue, 0.0), learned.index(waiter.attained_s))
    steps = {q: learned.steps_below(value) for q, value in best.items()}
    times = []
    for job in view.snapshot.placed:
        waiting = best.get(job.queue)
        if waiting is None or job.started_at is None or not job.stoppable:
            continue
        if job.request.gpus <= 0:
            continue
        attained = view.attained(job)
        at = learned.drops_below(attained, waiting, steps[job.queue])
        if at is not None:
            times.append(view.now + (at - attained) / job.request.gpus)
    ends = protection_ends(view)
    if ends is not None:
        times.append(ends)
    return min(times, default=None)
