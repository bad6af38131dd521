"""The figures of a run: JCT percentiles, queueing delay, allocation, fairness, deadlines.

All times are seconds here; report.py converts for people.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from schedd.sim.jobs import CANCELLED
from schedd.sim.outcome import SimResult

SERIES_POINTS = 1000  # the allocation series is averaged into at most this many buckets
NAN = math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks (as
    numpy's default); NaN for no values."""
    if not values:
        return NAN
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else NAN


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one has
    everything; NaN for no values or all zero."""
    squares = sum(x * x for x in values)
    if not values or squares == 0:
        return NAN
    return sum(values) ** 2 / (len(values) * squares)


def step_integral(series: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The integral over [start, end] of a step function given as (time, value) changes;
    before its first point the function is 0."""
    total = 0.0
    for i, (at, value) in enumerate(series):
        until = series[i + 1][0] if i + 1 < len(series) else end
        lo, hi = max(at, start), min(until, end)
        if hi > lo:
            total += value * (hi - lo)
    return total


def buckets(
    series: Sequence[tuple[float, float]], start: float, end: float, count: int = SERIES_POINTS
) -> list[tuple[float, float]]:
    """The step function averaged over `count` equal buckets: (bucket start, mean)."""
    if end <= start:
        return [(start, series[-1][1])] if series else []
    width = (end - start) / count
    out = []
    index = 0
    for b in range(count):
        lo, hi = start + b * width, start + (b + 1) * width
        # Skip the points that end before this bucket starts.
        while index + 1 < len(series) and series[index + 1][0] <= lo:
            index += 1
        total, i = 0.0, index
        while i < len(series) and series[i][0] < hi:
            until = series[i + 1][0] if i + 1 < len(series) else end
            total += series[i][1] * max(0.0, min(until, hi) - max(series[i][0], lo))
            i += 1
        out.append((lo, total / width))
    return out


@dataclass(frozen=True, slots=True)
class QueueFigures:
    name: str
    jobs: int
    weight: float
    avg_gpus: float  # time-averaged GPUs held over the run
    guarantee_gpus: int
    below_guarantee_s: float | None  # time under its guarantee with jobs waiting

    @property
    def share(self) -> float:
        return self.avg_gpus / self.weight


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    jobs: int
    dropped_zero_gpu: int
    finished: int
    cancelled: int
    never_finished: int  # pending or running when the replay ended
    jct_avg_s: float
    jct_p50_s: float
    jct_p95_s: float
    jct_p99_s: float
    queueing_avg_s: float  # first start - submission, over the jobs that started
    makespan_s: float  # last finish - first submission
    allocation_avg: float  # time-weighted fraction of the GPUs allocated
    allocation_series: tuple[tuple[float, float], ...]  # (seconds from start, fraction)
    # Time-weighted compute utilisation of all GPUs, by the assumed model (sim/sharing.py).
    utilization_avg: float
    # The same while any job waits: what a scheduler that shares idle cycles improves
    # (over the whole run, the same trace does the same work whatever the policy).
    utilization_backlogged: float
    queues: tuple[QueueFigures, ...]
    jain: float  # over queues, of avg GPUs / weight
    deadline_jobs: int
    deadline_missed: int  # finished after the deadline, or never
    jct_best_effort_avg_s: float  # over finished jobs with no deadline
    preemptions: int
    suspensions: int
    migrations: int
    resizes: int
    packs: int  # Resumes beside another job (packing.py); unpacks are in `actions`
    # Run time lost against running alone on one node, summed over jobs: to the GPUs'
    # spread (locality) and to sharing or packing; and the same over jobs without a
    # deadline (best-effort).
    slowed_by_locality_s: float
    slowed_by_sharing_s: float
    best_effort_slowed_by_locality_s: float
    best_effort_slowed_by_sharing_s: float
    waits: dict[str, int]  # job-instants waiting, by code
    actions: dict[str, int]
    unsupported_actions: dict[str, int]
    refused_actions: dict[str, int]
    plan_calls: int
    replan_cap_hits: int
    wall_s: float

    @property
    def deadline_miss_rate(self) -> float | None:
        return self.deadline_missed / self.deadline_jobs if self.deadline_jobs else None


def _queue_figures(result: SimResult) -> tuple[QueueFigures, ...]:
    ledger = result.ledger
    # A queue's GPU-seconds are counted to the replay's end (jobs cancelled, or left
    # suspended, give theirs back then), which may come after the last finish.
    counted = result.end_s - result.start_s
    specs = {q.name: q for q in result.queue_specs}
    counts: dict[str, int] = {}
    for job in result.jobs:
        counts[job.queue] = counts.get(job.queue, 0) + 1
    names = sorted(set(counts) | set(specs))
    figures = []
    for name in names:
        spec = specs.get(name)
        guarantee = spec.guarantee.gpus if spec else 0
        figures.append(
            QueueFigures(
                name=name,
                jobs=counts.get(name, 0),
                weight=spec.weight if spec else 1.0,
                avg_gpus=ledger.queue_gpu_seconds[name] / counted if counted > 0 else 0.0,
                guarantee_gpus=guarantee,
                below_guarantee_s=ledger.below_guarantee_s[name] if guarantee else None,
            )
        )
    return tuple(figures)


def summarize(result: SimResult) -> Summary:
    jobs = result.jobs
    jcts = [j.jct_s for j in jobs if j.jct_s is not None]
    queueing = [j.queueing_s for j in jobs if j.queueing_s is not None]
    finishes = [j.finish_s for j in jobs if j.finish_s is not None]
    end = max(finishes) if finishes else result.end_s
    span = end - result.start_s
    total_gpus = result.shape.gpus
    ledger = result.ledger
    allocation = buckets(ledger.series, result.start_s, end)
    queues = _queue_figures(result)
    with_deadline = [j for j in jobs if j.deadline_s is not None]
    missed = [j for j in with_deadline if j.finish_s is None or j.finish_s > (j.deadline_s or 0.0)]
    return Summary(
        policy=result.policy,
        jobs=len(jobs),
        dropped_zero_gpu=result.trace.dropped_zero_gpu,
        finished=len(jcts),
        cancelled=sum(1 for j in jobs if j.state == CANCELLED),
        never_finished=sum(1 for j in jobs if j.finish_s is None and j.state != CANCELLED),
        jct_avg_s=mean(jcts),
        jct_p50_s=percentile(jcts, 50),
        jct_p95_s=percentile(jcts, 95),
        jct_p99_s=percentile(jcts, 99),
        queueing_avg_s=mean(queueing),
        makespan_s=span,
        allocation_avg=step_integral(ledger.series, result.start_s, end) / (total_gpus * span)
        if span > 0
        else NAN,
        allocation_series=tuple((t - result.start_s, v / total_gpus) for t, v in allocation),
        utilization_backlogged=ledger.backlog_busy_gpu_s / (total_gpus * ledger.backlog_s)
        if ledger.backlog_s > 0
        else NAN,
        utilization_avg=step_integral(ledger.busy_series, result.start_s, end) / (total_gpus * span)
        if span > 0
        else NAN,
        queues=queues,
        jain=jain_index([q.share for q in queues if q.jobs]),
        deadline_jobs=len(with_deadline),
        deadline_missed=len(missed),
        jct_best_effort_avg_s=mean(
            [jct for j in jobs if j.deadline_s is None and (jct := j.jct_s) is not None]
        ),
        preemptions=sum(j.preemptions for j in jobs),
        suspensions=sum(j.suspensions for j in jobs),
        migrations=sum(j.migrations for j in jobs),
        resizes=sum(j.resizes for j in jobs),
        packs=sum(j.packs for j in jobs),
        slowed_by_locality_s=sum(j.slowed_by_locality_s for j in jobs),
        slowed_by_sharing_s=sum(j.slowed_by_sharing_s for j in jobs),
        best_effort_slowed_by_locality_s=sum(
            j.slowed_by_locality_s for j in jobs if j.deadline_s is None
        ),
        best_effort_slowed_by_sharing_s=sum(
            j.slowed_by_sharing_s for j in jobs if j.deadline_s is None
        ),
        waits=dict(ledger.waits.most_common()),
        actions=dict(ledger.actions),
        unsupported_actions=dict(ledger.unsupported),
        refused_actions=dict(ledger.refused),
        plan_calls=ledger.plan_calls,
        replan_cap_hits=ledger.replan_cap_hits,
        wall_s=result.wall_s,
    )
