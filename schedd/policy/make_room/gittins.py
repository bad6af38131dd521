"""Preemption by Gittins index: a waiting job displaces running jobs of a lower index.

Victims come from the job's own tenant queue, lowest index first (latest started first
among equals), none younger than `min_run_s`. Where run times are alike a job that has
started always has the higher index, and nothing is ever preempted for a newcomer; where
they are heavy-tailed, long runners give way to new jobs, as under 2D-LAS. With no
history to learn from yet, this is 2D-LAS preemption (`make_room.las`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable

from schedd.policy.gittins import GittinsTable
from schedd.policy.kept import Kept
from schedd.policy.make_room import las
from schedd.policy.make_room.las import SpareFn
from schedd.policy.make_room.victims import (
    Eviction,
    GpuCount,
    PlaceFn,
    fewest_victims,
    known_to_fail,
    leaving_jobs,
    placed_by_queue,
    protected,
    protection_ends,
    remember_failure,
)
from schedd.policy.order.gittins import placed_rank, table
from schedd.policy.snapshot import PendingJob, PlacedJob, holds_gpus
from schedd.policy.view import View

Row = tuple[float, float, str, PlacedJob]  # (rank negated, start negated, id, job)


class _Ranking:
    """One tenant queue's placed jobs by rank, kept from plan to plan and mended, not
    rebuilt, when it goes stale: a queue's jobs change far less often than the snapshot
    does, and each running job's rank only at a step of the index, at its own time (a
    heap of those times says whose rank to find again)."""

    __slots__ = ("expiry", "held", "jobs", "learned", "rows", "since")

    def __init__(self, learned: GittinsTable, now: float) -> None:
        self.learned = learned
        self.since = now  # the rows hold from this time on, not before it
        self.jobs: list[PlacedJob] | None = None  # the list object they were found for
        self.rows: list[Row] = []  # ascending: lowest priority first
        self.held: dict[int, tuple[PlacedJob, Row, float]] = {}  # id -> (job, row, until)
        self.expiry: list[tuple[float, int]] = []  # (until, id), some stale: checked on pop

    def update(self, jobs: list[PlacedJob], view: View) -> list[Row]:
        now = view.now
        if jobs is not self.jobs:
            current = {id(job): job for job in jobs}
            for key in [k for k, (job, _, _) in self.held.items() if current.get(k) is not job]:
                _drop(self.rows, self.held.pop(key)[1])
            for key, job in current.items():
                if key not in self.held:
                    self._rank(key, job, view)
            self.expiry = [(until, key) for key, (_, _, until) in self.held.items()]
            heapq.heapify(self.expiry)
            self.jobs = jobs
        expiry = self.expiry
        stale = []
        while expiry and expiry[0][0] <= now:
            until, key = heapq.heappop(expiry)
            held = self.held.get(key)
            if held is not None and held[2] == until:  # not found again since
                stale.append((key, held))
        for key, (job, row, _) in stale:  # after the pops: a rank may hold for `now` only
            _drop(self.rows, row)
            self._rank(key, job, view)
        self.since = now
        return self.rows

    def _rank(self, key: int, job: PlacedJob, view: View) -> None:
        value, holds = placed_rank(job, view, self.learned)
        if job.started_at is None:
            holds = view.now  # ordered by a start of `now`: holds for this plan only
        row = (-value, -view.started(job), job.job_id, job)
        bisect.insort(self.rows, row)
        self.held[key] = (job, row, holds)
        heapq.heappush(self.expiry, (holds, key))


def _drop(rows: list[Row], row: Row) -> None:
    del rows[bisect.bisect_left(rows, row)]


_rankings: dict[str, _Ranking] = {}


def _by_rank(view: View, queue: str, learned: GittinsTable) -> list[Row]:
    """The queue's placed jobs, lowest priority first (latest started first among
    equals), each as (rank negated, start negated, id, job), ascending."""
    key = ("gittins_victims", queue)
    known = view.memo.get(key)
    if known is not None:
        return known  # type: ignore[return-value]
    ranking = _rankings.get(queue)
    if ranking is None or ranking.learned is not learned or view.now < ranking.since:
        ranking = _rankings[queue] = _Ranking(learned, view.now)
    rows = ranking.update(placed_by_queue(view).get(queue, []), view)
    view.memo[key] = rows
    return rows


def make_room(
    job: PendingJob, view: View, place: PlaceFn, spare: SpareFn | None = None
) -> Eviction | None:
    """`spare` says which running jobs are never victims (`gittins_sparing_urgent`)."""
    learned = table(view)
    if learned is None:
        return las.make_room(job, view, place, spare)
    mine = -learned.index(job.attained_s)  # `rank` of a pending job, the table at hand
    # A job that found no victims leaves none for a job of the same request and a rank
    # no better (its candidates are fewer), for the rest of the cycle: capacity only
    # shrinks as the plan goes on.
    # With GPUs reserved, whether a job may use them depends on its own estimate: then
    # only the same rank is known to fail.
    memo = ("gittins", job.queue, job.request, mine if view.reserved else None, spare)
    if known_to_fail(view, memo, mine):
        return None
    rows = _by_rank(view, job.queue, learned)
    # Those ranked below it: (x,) sorts before every row whose rank negated is x.
    below = bisect.bisect_left(rows, (-mine,))
    if not below or not _reaches(job, view, rows, below):
        victims = None  # none, or too few GPUs to free below its rank by count alone
    else:
        ranked = [row[3] for row in rows[:below]]
        if spare is not None:
            ranked = [v for v in ranked if not spare(v, view)]
        victims = fewest_victims(job, view, ranked, place) if ranked else None
    if victims is None:
        remember_failure(view, memo, mine)
        return None
    return Eviction(victims, f"preempted: job {job.job_id} has the higher Gittins index")


class _Scan:
    """How far `_reaches` has released a queue's rows for one request."""

    __slots__ = ("count", "found", "scanned")

    def __init__(self, count: GpuCount) -> None:
        self.count = count
        self.scanned = 0  # rows released (protected ones skipped)
        self.found: int | None = None  # rows released when the GPUs were enough


def _reaches(job: PendingJob, view: View, rows: list[Row], below: int) -> bool:
    """Whether releasing the first `below` rows (protected ones skipped) could give the
    job enough GPUs by count; where not, `fewest_victims` would find no victims among
    them. The rows are released once per request and plan, as far as any job asked:
    counts taken earlier in the plan are at least what they would be now (capacity
    only shrinks as the plan goes on; a job it stopped since was counted), so "too few"
    stays true, and "enough" is for `fewest_victims` to confirm."""
    if leaving_jobs(view):
        return True  # `fewest_victims` counts them
    key = ("gittins_reach", job.queue, job.request)
    scan = view.memo.get(key)
    if not isinstance(scan, _Scan):
        scan = view.memo[key] = _Scan(GpuCount(job, view, [], view.free_gpu_count()))
    while scan.found is None and scan.scanned < below:
        victim = rows[scan.scanned][3]
        scan.scanned += 1
        if not protected(victim, view) and scan.count.release(victim):
            scan.found = scan.scanned
    return scan.found is not None and scan.found <= below


_best = Kept[dict[str, float]]()


def _best_waiting(view: View, learned: GittinsTable) -> dict[str, float]:
    """Per tenant queue, the highest index waiting once the plan is made: of the
    pending jobs, less those it launches (`View.launching`)."""
    pending = view.snapshot.pending
    known = _best.get(pending, learned)
    if known is None:
        known = _best.put(_highest_index(pending, learned), pending, learned)
    if not view.launching:
        return known
    # Only the queues the plan launched in can have lost their best: found again there.
    launched = {j.job_id for j in view.launching}
    queues = {j.queue for j in view.launching}
    best = {q: value for q, value in known.items() if q not in queues}
    best |= _highest_index(
        (j for j in pending if j.queue in queues and j.job_id not in launched), learned
    )
    return best


def _highest_index(waiters: Iterable[PendingJob], learned: GittinsTable) -> dict[str, float]:
    best: dict[str, float] = {}
    for waiter in waiters:
        value = learned.index(waiter.attained_s)
        if value > best.get(waiter.queue, 0.0):
            best[waiter.queue] = value
    return best


# Per tenant queue: its placed jobs' list (the same object while its jobs are), the best
# waiting index and the table compared, when that was found, and the crossing found.
_queue_crossings: dict[str, tuple[list[PlacedJob], float, GittinsTable, float, float | None]] = {}


def _next_crossing(view: View, learned: GittinsTable) -> float | None:
    """When a running job's index next falls below the best waiting in its queue. A
    running job whose service is counted from a fixed time (`attained_as_of`) gains
    its GPU count per second, so that time is fixed while the queue's jobs, the table
    and the best waiting index stay the same: a queue's answer is computed again only
    when one changes or the time has passed."""
    best = _best_waiting(view, learned)
    now = view.now
    by_queue = placed_by_queue(view)
    earliest: float | None = None
    for queue, waiting in best.items():
        jobs = by_queue.get(queue)
        if not jobs:
            continue
        hit = _queue_crossings.get(queue)
        if (
            hit is not None
            and hit[0] is jobs
            and hit[1] == waiting
            and hit[2] is learned
            and hit[3] <= now  # found from that time on, not before it
            and (hit[4] is None or hit[4] > now)
        ):
            when = hit[4]
        else:
            when, queue_fixed = _queue_crossing(jobs, waiting, view, learned)
            if queue_fixed:
                _queue_crossings[queue] = (jobs, waiting, learned, now, when)
            else:
                _queue_crossings.pop(queue, None)
        if when is not None and (earliest is None or when < earliest):
            earliest = when
    # The jobs this plan launches run from now, from their earlier attempts' service.
    for launched in view.launching:
        above = best.get(launched.queue)
        if above is None or launched.request.gpus <= 0:
            continue
        attained = launched.attained_s
        at = learned.drops_below(attained, above, learned.steps_below(above))
        if at is not None:
            when = view.now + (at - attained) / launched.request.gpus
            if earliest is None or when < earliest:
                earliest = when
    return earliest


def _queue_crossing(
    jobs: list[PlacedJob], waiting: float, view: View, learned: GittinsTable
) -> tuple[float | None, bool]:
    """The earliest time one of the queue's running jobs falls below `waiting`, and
    whether that time is fixed (every job's service counted from a fixed time)."""
    steps = learned.steps_below(waiting)
    earliest: float | None = None
    fixed = True
    for job in jobs:
        if job.started_at is None or not job.stoppable or job.request.gpus <= 0:
            continue
        if not holds_gpus(job):
            continue  # never a victim: its crossing changes no plan
        if job.attained_as_of is None:
            fixed = False  # its service is as of now: the time moves with the clock
        attained = view.attained(job)
        at = learned.drops_below(attained, waiting, steps)
        if at is not None:
            when = view.now + (at - attained) / job.request.gpus
            if earliest is None or when < earliest:
                earliest = when
    return earliest, fixed


def recheck_at(view: View) -> float | None:
    """When a running job next comes of age, or its index (which changes as its service
    grows by its GPU count each second) falls below that of a job waiting in its queue."""
    learned = table(view)
    if learned is None:
        return las.recheck_at(view)
    times = [t for t in (_next_crossing(view, learned), protection_ends(view)) if t is not None]
    return min(times, default=None)
