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
import math
from collections.abc import Iterable
from itertools import takewhile

from schedd.policy.gittins import GittinsTable
from schedd.policy.kept import Kept, forgettable
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
    remember_failure,
)
from schedd.policy.order.gittins import placed_rank, table
from schedd.policy.snapshot import PendingJob, PlacedJob, Shard, holds_gpus
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
            if len(self.expiry) > 2 * len(self.held) + 64:  # mostly stale: rebuilt
                self.expiry = [(until, key) for key, (_, _, until) in self.held.items()]
                heapq.heapify(self.expiry)
            self.jobs = jobs
        expiry = self.expiry
        # By id: a job's entry and that of a job gone before it, whose id it took, may
        # both be due.
        stale: dict[int, tuple[PlacedJob, Row, float]] = {}
        while expiry and expiry[0][0] <= now:
            until, key = heapq.heappop(expiry)
            held = self.held.get(key)
            if held is not None and held[2] == until:  # not found again since
                stale[key] = held
        for key, (job, row, _) in stale.items():  # after the pops: a rank may hold for now only
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
forgettable(_rankings.clear)


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
    # With a reservation standing, whether a job may use what it holds depends on the
    # job's own end: then each job asks for itself.
    memo = ("gittins", job.queue, job.request, job.job_id if view.reservations else None, spare)
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


# What waits in a tenant queue: for each GPU count asked (an elastic job's least),
# ascending, the highest index of a job asking that many or fewer; and every index
# waiting, ascending.
Waiting = tuple[tuple[tuple[int, float], ...], tuple[float, ...]]
_waiting = Kept[dict[str, Waiting]]()


def _waiting_by_queue(view: View, learned: GittinsTable) -> dict[str, Waiting]:
    """What waits in each tenant queue once the plan is made: the pending jobs, less
    those it launches (`View.launching`)."""
    pending = view.snapshot.pending
    known = _waiting.get(pending, learned)
    if known is None:
        known = _waiting.put(_summed(pending, learned), pending, learned)
    if not view.launching:
        return known
    # Only the queues the plan launched in can have changed: found again there.
    launched = {j.job_id for j, _ in view.launching}
    queues = {j.queue for j, _ in view.launching}
    waiting = {q: w for q, w in known.items() if q not in queues}
    waiting |= _summed(
        (j for j in pending if j.queue in queues and j.job_id not in launched), learned
    )
    return waiting


def _summed(waiters: Iterable[PendingJob], learned: GittinsTable) -> dict[str, Waiting]:
    by_size: dict[str, dict[int, float]] = {}
    indices: dict[str, set[float]] = {}
    for waiter in waiters:
        value = learned.index(waiter.attained_s)
        gpus = waiter.gpu_range[0] if waiter.gpu_range is not None else waiter.request.gpus
        sizes = by_size.setdefault(waiter.queue, {})
        if value > sizes.get(gpus, -1.0):
            sizes[gpus] = value
        indices.setdefault(waiter.queue, set()).add(value)
    summed: dict[str, Waiting] = {}
    for queue, sizes in by_size.items():
        best = -1.0
        frontier = []
        for gpus in sorted(sizes):
            best = max(best, sizes[gpus])
            frontier.append((gpus, best))
        summed[queue] = (tuple(frontier), tuple(sorted(indices[queue])))
    return summed


# A running job as the recheck sees it: its service now, GPUs, start and shards.
Runner = tuple[float, int, float, tuple[Shard, ...]]
# A runner that may be a victim: when next one, its key (unique in the queue), its
# shards, and until when it stays one (inf: for good).
Victim = tuple[float, int, tuple[Shard, ...], float]
# A kept victim list: when found, the next key and removals then, the victims.
_KeptVictims = tuple[float, int, int, list[Victim]]


def _next_victim(view: View, learned: GittinsTable) -> float | None:
    """When the jobs running in a queue may next be victims enough for a job waiting
    there (`_queue_next`), the earliest over the queues."""
    waiting = _waiting_by_queue(view, learned)
    now = view.now
    by_queue = placed_by_queue(view)
    launching: dict[str, list[tuple[PendingJob, tuple[Shard, ...]]]] = {}
    for job, shards in view.launching:
        launching.setdefault(job.queue, []).append((job, shards))
    free = _FreeSoon(view)
    earliest: float | None = None
    for queue, what in waiting.items():
        jobs = by_queue.get(queue, [])
        starting = launching.get(queue)
        if not jobs and not starting:
            continue
        running = _kept_runners.get(queue)
        if running is None or running.learned is not learned:
            running = _kept_runners[queue] = _Runners(learned)
        running.update(jobs)
        # They run from now, from their earlier attempts' service.
        extra = [(j.attained_s, j.request.gpus, now, shards) for j, shards in starting or ()]
        when = _queue_next(running, extra, what, free, view)
        if when is not None and (earliest is None or when < earliest):
            earliest = when
    return earliest


class _Runners:
    """A queue's jobs that could be victims, with when each is next a victim of a job
    waiting at an index and until when it stays one (`_victim_at`), by index. Kept
    from plan to plan while the table is the same, and mended as the queue's jobs
    change: a job's times are kept while its snapshot object is the same and its
    service is counted from a fixed time (it runs: `attained_as_of`), since those
    times stay true as the clock passes them. A later plan finds again only the jobs
    that have come or stopped being victims since, and what is kept gives what a fresh
    plan would. A job whose service is given as of now (leaving, suspended) is found
    again each plan (`loose`)."""

    __slots__ = (
        "by_id",
        "jobs",
        "learned",
        "loose",
        "next_key",
        "removed",
        "runs",
        "victims",
    )

    def __init__(self, learned: GittinsTable) -> None:
        self.learned = learned
        self.jobs: list[PlacedJob] | None = None  # the list object last mended for
        self.by_id: dict[int, tuple[PlacedJob, int]] = {}  # id(job) -> (job, key)
        # key -> (service as of `attained_as_of`, that time, GPUs, start, shards); keys
        # are given ascending, so the dict's order is theirs
        self.runs: dict[int, tuple[float, float, int, float, tuple[Shard, ...]]] = {}
        self.next_key = 0
        self.removed = 0  # keys removed so far
        self.loose: list[Runner] = []
        self.victims: dict[float, _KeptVictims] = {}

    def update(self, jobs: list[PlacedJob]) -> None:
        if jobs is self.jobs:
            return
        self.jobs = jobs
        current = {id(job): job for job in jobs}
        by_id = self.by_id
        for key in [k for k, (job, _) in by_id.items() if current.get(k) is not job]:
            del self.runs[by_id.pop(key)[1]]
            self.removed += 1
        self.loose = []
        for key, job in current.items():
            started = job.started_at
            if key in by_id or started is None or not job.stoppable or job.request.gpus <= 0:
                continue
            if not holds_gpus(job):
                continue  # never a victim: its crossing changes no plan
            gpus = job.request.gpus
            if job.attained_as_of is None or job.state != "running":
                # Its service is as of now (the view's too), or grows once it runs.
                self.loose.append((job.attained_s, gpus, started, job.shards))
                continue
            by_id[key] = (job, self.next_key)
            self.runs[self.next_key] = (
                job.attained_s,
                job.attained_as_of,
                gpus,
                started,
                job.shards,
            )
            self.next_key += 1

    def now(self, view: View, keys: Iterable[int] | None = None) -> list[tuple[int, Runner]]:
        """The kept runners (those of `keys`, or all) with their service as of now."""
        now = view.now
        runs = self.runs
        found = []
        for key in runs if keys is None else keys:
            attained, as_of, gpus, started, on = runs[key]
            if now > as_of:
                attained += gpus * (now - as_of)
            found.append((key, (attained, gpus, started, on)))
        return found

    def others(self, extra: list[Runner]) -> list[Runner]:
        """The runners found again each plan, with `extra`."""
        return self.loose + extra if self.loose else extra

    def victims_of(self, index: float, extra: list[Runner], view: View) -> list[Victim]:
        """When each job (and each of `extra`) is next a victim of a job waiting at
        `index`, earliest first."""
        now = view.now
        learned = self.learned
        kept = self.victims.get(index)
        if kept is None or kept[0] > now:
            times = _victim_times(self.now(view), index, view, learned)
        else:
            found, added, removed, times = kept
            if removed != self.removed:
                runs = self.runs
                times = [v for v in times if v[1] in runs]
            if found < now:
                due = bisect.bisect_right(times, (now, math.inf))
                # Those due and no longer victims are found again; the others still are.
                over = [k for _, k, _, until in times[:due] if until <= now]
                if over:
                    staying = [v for v in times if v[0] > now or v[3] > now]
                    again = _victim_times(self.now(view, over), index, view, learned)
                    times = sorted(staying + again)
            if added != self.next_key:  # keys given since: the last of `runs`
                new = list(takewhile(lambda k: k >= added, reversed(self.runs)))
                if new:
                    times = sorted(times + _victim_times(self.now(view, new), index, view, learned))
        self.victims[index] = (now, self.next_key, self.removed, times)
        others = self.others(extra)
        if not others:
            return times
        # Keys of the others come below the runners': no two victims are alike.
        more = _victim_times(list(enumerate(others, 1)), index, view, learned)
        return sorted(times + [(at, -k, on, end) for at, k, on, end in more])


_kept_runners: dict[str, _Runners] = {}
forgettable(_kept_runners.clear)


def _victim_times(
    runners: list[tuple[int, Runner]], index: float, view: View, learned: GittinsTable
) -> list[Victim]:
    """The runners (by key) that ever are victims of a job waiting at `index`: when
    next, ascending."""
    steps = learned.steps_below(index)
    found = []
    for k, (attained, gpus, started, shards) in runners:
        times = _victim_at(attained, gpus, started, index, steps, view, learned)
        if times is not None:
            found.append((times[0], k, shards, times[1]))
    found.sort()
    return found


def _queue_next(
    running: _Runners, extra: list[Runner], waiting: Waiting, free: _FreeSoon, view: View
) -> float | None:
    """The earliest time after now a job waiting in the queue could preempt, with time
    alone. A waiting job of index w and g GPUs needs victims (jobs of age below w) that
    free, with the GPUs free, g on one node (or in all, for a gang across nodes); jobs
    below a higher index with as many or fewer GPUs need no less, so each GPU count is
    checked at the highest index asking it or fewer. Where that is met now already,
    GPUs are not what holds the jobs back (a quota, CPUs, a job that waits for one
    that is leaving): then whenever a running job next becomes a victim of any."""
    now = view.now
    earliest: float | None = None
    for gpus, index in waiting[0]:
        at = _first_room(running.victims_of(index, extra, view), free, gpus)
        if at is not None and at <= now:
            runners = [r for _, r in running.now(view)] + running.others(extra)
            return _next_new_victim(runners, waiting[1], view, running.learned)
        if at is not None and (earliest is None or at < earliest):
            earliest = at
    return earliest


def _next_new_victim(
    runners: list[Runner], indices: tuple[float, ...], view: View, learned: GittinsTable
) -> float | None:
    """The earliest time after now a running job becomes a victim of a waiting job it
    is not one of now: it comes of age below one, or falls below the highest waiting
    index it is not below yet (the lower ones it falls below later)."""
    now = view.now
    min_run = view.settings.min_run_s
    earliest: float | None = None
    for attained, gpus, started, _ in runners:
        value = learned.index(attained)
        of_age = started + min_run
        times = []
        if of_age > now and value < indices[-1]:
            times.append(of_age)
        above = bisect.bisect_right(indices, value) - 1  # the highest index <= its own
        if above >= 0:
            at = learned.drops_below(attained, indices[above])
            if at is not None:
                times.append(max(now + (at - attained) / gpus, of_age))
        for at in times:
            if earliest is None or at < earliest:
                earliest = at
    return earliest


class _FreeSoon:
    """The GPUs free in the plan's view, and those of jobs on their way out (stopped
    before or by this plan), per node and in all: all a victim's GPUs could add to."""

    __slots__ = ("by_node", "largest", "total")

    def __init__(self, view: View) -> None:
        self.by_node: dict[str, int] = {}
        for count, nodes in enumerate(view.by_free):
            if count:
                for node_id in nodes:
                    self.by_node[node_id] = count
        stopping = view.stopping
        for job in view.snapshot.placed if stopping else ():
            if job.job_id in stopping:
                for shard in job.shards:
                    n = shard.node_id
                    self.by_node[n] = self.by_node.get(n, 0) + len(shard.gpu_uuids)
        self.total = sum(self.by_node.values())
        snapshot = view.snapshot
        # A job of more GPUs than this runs across nodes; of this many or fewer, on one.
        self.largest = (
            max(view.largest_node_gpus(), snapshot.largest_node_gpus)
            if snapshot.multi_node
            else 1 << 30
        )


def _first_room(victims: list[Victim], free: _FreeSoon, need: int) -> float | None:
    """The earliest time the GPUs free and those of the jobs then victims (`victims`:
    from when, earliest first, on which shards) make `need`: on one node for a job that
    runs on one, in all for a gang across nodes; -inf if the free ones are enough
    already. None: never, with the jobs running now."""
    across = need > free.largest
    if (free.total if across else max(free.by_node.values(), default=0)) >= need:
        return -math.inf
    by_node = dict(free.by_node)
    total = free.total
    for at, _, shards, _ in victims:
        for shard in shards:
            n = shard.node_id
            by_node[n] = have = by_node.get(n, 0) + len(shard.gpu_uuids)
            total += len(shard.gpu_uuids)
            if (total if across else have) >= need:
                return at
    return None


def _victim_at(
    attained: float,
    gpus: int,
    started: float,
    waiting: float,
    steps: tuple[int, ...],
    view: View,
    learned: GittinsTable,
) -> tuple[float, float] | None:
    """The earliest time from now a job running on `gpus` since `started`, with
    `attained` service now, is a victim of a job waiting at index `waiting` (no longer
    too young, and its index below that), and until when it stays one (inf: for good).
    None: never."""
    now = view.now
    at = max(now, started + view.settings.min_run_s)
    service = attained + gpus * (at - now)
    if learned.index(service) >= waiting:
        beyond = learned.drops_below(service, waiting, steps)  # strictly more service
        if beyond is None:
            return None
        at += (beyond - service) / gpus
        service = beyond
    end = learned.below_until(service, waiting)
    return at, (math.inf if end is None else at + (end - service) / gpus)


def recheck_at(view: View) -> float | None:
    """When a running job's index (which changes as its service grows by its GPU count
    each second) may next be below that of a job waiting in its queue with the job no
    longer too young to preempt: only then can the answer change with time alone."""
    learned = table(view)
    if learned is None:
        return las.recheck_at(view)
    return _next_victim(view, learned)
