"""Choosing victims: free just enough for a job, losing the least work."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from schedd.policy.actions import Wait
from schedd.policy.immutable import immutable
from schedd.policy.kept import Kept
from schedd.policy.placed_totals import placed_totals
from schedd.policy.placement import NoFit, Placement, needs_spreading
from schedd.policy.snapshot import (
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    holds_gpus,
    shard_requests,
)
from schedd.policy.view import View

PlaceFn = Callable[[PendingJob, View], Placement | NoFit]


@immutable
class Eviction:
    victims: tuple[PlacedJob, ...]
    reason: str  # told to each victim, e.g. "reclaimed by queue a for job 7"
    # Where set, the victims are suspended, not preempted (time-slicing): their GPUs
    # are free at once and the job starts there in the same plan.
    launch_on: tuple[Shard, ...] | None = None


def work_at_risk(job: PlacedJob, view: View) -> float:
    """Seconds of work a preemption would lose: since its start or last checkpoint."""
    since = view.started(job)
    if job.checkpointed_at is not None:
        since = max(since, job.checkpointed_at)
    return max(view.now - since, 0.0)


def protected(job: PlacedJob, view: View) -> bool:
    """Too young to preempt, already on its way out, or holding no GPU of its own (an
    opportunistic job: stopping it would free nothing a guaranteed job may not use)."""
    return view.decided(job.job_id) or _protected_all_cycle(job, view)


def _protected_all_cycle(job: PlacedJob, view: View) -> bool:
    """`protected` but for the plan's own decisions: the same all cycle."""
    if not job.stoppable or not holds_gpus(job):
        return True
    return view.now - view.started(job) < view.settings.min_run_s


_FIXED_KEY = ("protected_all_cycle",)


def unprotected(ranked: Sequence[PlacedJob], view: View) -> list[PlacedJob]:
    """`ranked` less its protected jobs, the part of `protected` that holds all cycle
    found once per placed job (make-room plugins ask it of the same jobs again and
    again: a busy cycle, thousands of times)."""
    fixed = cast("dict[str, bool] | None", view.memo.get(_FIXED_KEY))
    if fixed is None:
        fixed = {j.job_id: _protected_all_cycle(j, view) for j in view.snapshot.placed}
        view.memo[_FIXED_KEY] = fixed
    decided = view.decided
    kept = []
    for v in ranked:
        if decided(v.job_id):
            continue
        held = fixed.get(v.job_id)
        if held is None:  # a job placed in this plan
            held = _protected_all_cycle(v, view)
        if not held:
            kept.append(v)
    return kept


def leaving_jobs(view: View) -> list[PlacedJob]:
    """Placed jobs already on their way out when the cycle began (in the snapshot), as
    what each will free: a job moving within a node (a shrink, or a move to other GPUs
    there) frees only the GPUs it leaves behind, in pieces of one shard each. Less the
    GPUs, CPUs and memory that jobs waiting on them earlier in the plan claimed
    (`hold_room`)."""
    key = ("leaving",)
    known = view.memo.get(key)
    if known is None:
        # Counted as the totals are kept: most snapshots have none to look for.
        some = placed_totals(view.snapshot).unstoppable
        known = view.memo[key] = [
            piece
            for j in (view.snapshot.placed if some else ())
            if not j.stoppable and holds_gpus(j)
            for piece in _freed_pieces(j)
        ]
    return known  # type: ignore[return-value]


def await_leavers(job: PendingJob, view: View, place: PlaceFn) -> Wait:
    """`job` waits for jobs on their way out (`fewest_victims` found their GPUs enough):
    the room it will run in is held for it (`hold_room`)."""
    leaving = leaving_jobs(view)
    found = hold_room(job, view, place)
    if isinstance(found, Placement):
        nodes = {s.node_id for s in found.shards}
        leaving = [j for j in leaving if any(s.node_id in nodes for s in j.shards)] or leaving
    ids = list(dict.fromkeys(j.job_id for j in leaving))  # a job in pieces once
    named = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return Wait("preempting", f"waiting for stopping jobs to free their GPUs: {named}")


_ROOM = "room_with_victims"


def hold_room(
    job: PendingJob, view: View, place: PlaceFn, stopped: Sequence[PlacedJob] = ()
) -> Placement | NoFit:
    """Where `job` will run once the jobs on their way out, and those this plan stops for
    it (`stopped`), have left. What it counts on there is kept from the rest of the
    plan: the free GPUs, and the CPUs and memory it needs beyond those the jobs whose
    GPUs it takes will free, from its other victims there first, then from what is free
    now, then from what other leavers on the node will free; the leavers' part it
    counts on is for no later job.
    A later job taking any of it would leave the stops for nothing and the job short
    again, to stop more once they are done."""
    known = cast(
        "tuple[tuple[PlacedJob, ...], Placement] | None", view.memo.get((_ROOM, job.job_id))
    )
    gone = [*leaving_jobs(view), *stopped]
    found: Placement | NoFit
    if stopped and known is not None and known[0] is stopped:
        found = known[1]  # where `fewest_victims` found it room with them
    else:
        found = _place_without(job, view, gone, place)
    if isinstance(found, Placement):
        # A job that asks for no CPUs or memory (the simulator's) holds GPUs alone.
        asks = job.request.cpus > 0 or job.request.memory_mib > 0
        freed, spare = _freed_beside(gone, len(gone) - len(stopped), found.shards, asks)
        held = []
        claimed: set[str] = set()
        short: dict[str, list[float]] = {}  # node -> [CPUs, memory] owed by other leavers
        parts = shard_requests(job.request, found.shards)
        for shard, part in zip(found.shards, parts, strict=True):
            cap = view.capacity[shard.node_id]
            free = {g.uuid for g in cap.free_gpus}
            mine = tuple(u for u in shard.gpu_uuids if u in free)
            cpus, memory = freed.get(shard.node_id, (0.0, 0))
            more_cpus, more_memory = spare.get(shard.node_id, (0.0, 0))
            need_cpus = max(part.cpus - cpus - more_cpus, 0.0)
            need_memory = max(part.memory_mib - memory - more_memory, 0)
            free_cpus, free_memory = max(cap.cpus, 0.0), max(cap.memory_mib, 0)
            rest = Request(0, min(need_cpus, free_cpus), min(need_memory, free_memory))
            if mine or rest.cpus or rest.memory_mib:
                held.append((Shard(shard.node_id, mine), rest))
            if need_cpus > free_cpus or need_memory > free_memory:
                short[shard.node_id] = [
                    max(need_cpus - free_cpus, 0.0),
                    max(need_memory - free_memory, 0),
                ]
            claimed.update(u for u in shard.gpu_uuids if u not in free)
        _claim(view, claimed, short)
        view.hold(tuple(held))  # a new generation: the leavers changed too
    return found


def _freed_beside(
    gone: Sequence[PlacedJob], first_victim: int, shards: tuple[Shard, ...], asks: bool
) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, int]]]:
    """Per node of `shards`, the CPUs and memory freed by the jobs of `gone` whose GPUs
    there the shards take (they go with the GPUs: `_claim`), and by the victims of this
    plan (`gone[first_victim:]`) whose GPUs there they do not take: nobody else counts
    on those (they are no leavers to later jobs), so they are used first. Nothing where
    the job asks for no CPUs or memory (not `asks`)."""
    freed: dict[str, tuple[float, int]] = {}
    spare: dict[str, tuple[float, int]] = {}
    if not asks:
        return freed, spare
    gpus = {u for shard in shards for u in shard.gpu_uuids}
    nodes = {shard.node_id for shard in shards}
    for i, piece in enumerate(gone):
        for shard, part in zip(
            piece.shards, shard_requests(piece.request, piece.shards), strict=True
        ):
            node_id = shard.node_id
            if node_id not in nodes:
                continue
            if any(u in gpus for u in shard.gpu_uuids):
                into = freed
            elif i >= first_victim:
                into = spare
            else:
                continue
            cpus, memory = into.get(node_id, (0.0, 0))
            into[node_id] = (cpus + part.cpus, memory + part.memory_mib)
    return freed, spare


def _claim(view: View, gpus: set[str], short: dict[str, list[float]]) -> None:
    """The leavers' GPUs a waiting job will run on count for no later job of the plan:
    each would otherwise wait on the same stops, and preempt only once the first had
    taken them. A leaver's CPUs and memory on a node where the job takes its GPUs go
    with them (the claimant's placement counted on them); `short` is, per node, what
    the job counts on beyond those and beyond what is free now: taken from the other
    leavers there, in turn. What the leavers free beyond that stays counted."""
    if not gpus and not short:
        return
    pieces: list[PlacedJob] = []
    for piece in leaving_jobs(view):
        if all(u not in gpus for u in piece.gpu_uuids) and all(
            s.node_id not in short for s in piece.shards
        ):
            pieces.append(piece)
            continue
        parts = shard_requests(piece.request, piece.shards)
        for shard, part in zip(piece.shards, parts, strict=True):
            rest = tuple(u for u in shard.gpu_uuids if u not in gpus)
            if len(rest) < len(shard.gpu_uuids):
                if rest:
                    pieces.append(_part_of(piece, Shard(shard.node_id, rest)))
                continue
            cpus, memory = part.cpus, part.memory_mib
            owed = short.get(shard.node_id)
            if owed is not None:
                taken_cpus, taken_memory = min(cpus, owed[0]), min(memory, int(owed[1]))
                owed[0] -= taken_cpus
                owed[1] -= taken_memory
                cpus, memory = cpus - taken_cpus, memory - taken_memory
            pieces.append(_part_of(piece, shard, cpus, memory))
    view.memo[("leaving",)] = pieces


def _part_of(job: PlacedJob, shard: Shard, cpus: float = 0.0, memory_mib: int = 0) -> PlacedJob:
    """The part of a leaving job that frees these GPUs, and these CPUs and memory (by
    default none: they stay with it, or with whoever counted on them)."""
    return replace(job, shards=(shard,), request=Request(len(shard.gpu_uuids), cpus, memory_mib))


def _freed_pieces(job: PlacedJob) -> list[PlacedJob]:
    staying = {s.node_id: frozenset(s.gpu_uuids) for s in job.moving_to}
    if not any(s.node_id in staying for s in job.shards):
        return [job]  # it frees everything it runs on (its target is held apart)
    pieces = []
    for shard, part in zip(job.shards, shard_requests(job.request, job.shards), strict=True):
        kept = staying.get(shard.node_id)
        if kept is None:
            pieces.append(replace(job, shards=(shard,), request=part))
            continue
        # It stays on this node: its CPUs and memory too.
        freed = tuple(u for u in shard.gpu_uuids if u not in kept)
        if freed:
            pieces.append(_part_of(job, Shard(shard.node_id, freed)))
    return pieces


def placed_by_queue(view: View) -> dict[str, list[PlacedJob]]:
    """The placed jobs of each tenant queue (`PlacedTotals.by_queue`)."""
    return placed_totals(view.snapshot).by_queue


def by_work_at_risk(view: View) -> list[PlacedJob]:
    """Placed jobs, those that would lose the least work first (ties by job id)."""
    key = ("by_work_at_risk",)
    known = view.memo.get(key)
    if known is None:
        placed = view.snapshot.placed
        known = view.memo[key] = sorted(placed, key=lambda j: (work_at_risk(j, view), j.job_id))
    return known  # type: ignore[return-value]


_protection = Kept[tuple[float, list[float]]]()


def protection_ends(view: View) -> float | None:
    """The earliest time a running job, too young to preempt now, no longer is: of the
    placed jobs, or of those this plan launches (`View.launching`)."""
    placed = view.snapshot.placed
    min_run = view.settings.min_run_s
    known = _protection.get(placed)
    if known is None or known[0] != min_run:
        ends = sorted(
            j.started_at + min_run
            for j in placed
            if j.started_at is not None and j.stoppable and holds_gpus(j)
        )
        known = _protection.put((min_run, ends), placed)
    ends = known[1]
    i = bisect.bisect_right(ends, view.now)
    earliest = ends[i] if i < len(ends) else None
    if view.launching and min_run > 0:  # all start now: they come of age together
        mine = view.now + min_run
        if earliest is None or mine < earliest:
            earliest = mine
    return earliest


def known_to_fail(view: View, key: tuple[object, ...], rank: float) -> bool:
    """Whether a job of this `rank` (lower runs first) finds no victims: one ranked no
    worse found none under `key` earlier in the cycle, and a worse rank has fewer
    candidates (capacity only shrinks as the plan goes on)."""
    failed = view.memo.get(key)
    return isinstance(failed, int | float) and rank >= failed


def remember_failure(view: View, key: tuple[object, ...], rank: float) -> None:
    """A job of this `rank` found no victims under `key` (`known_to_fail`)."""
    failed = view.memo.get(key)
    view.memo[key] = min(rank, failed) if isinstance(failed, int | float) else rank


def fewest_victims(
    job: PendingJob, view: View, ranked: Sequence[PlacedJob], place: PlaceFn
) -> tuple[PlacedJob, ...] | None:
    """The shortest prefix of `ranked` (less protected jobs) whose release lets `job`
    fit, less those on nodes the job would not use (their release would not help it);
    None if no prefix does."""
    free_total = view.free_gpu_count()
    # Jobs already on their way out free their GPUs soon: if that is enough, wait for
    # them (no new victims) rather than preempt more.
    leaving = leaving_jobs(view)
    if leaving and isinstance(_place_without(job, view, leaving, place), Placement):
        return ()
    eligible = unprotected(ranked, view)
    # A longer prefix frees more, so a fit found at k holds at every k after it. The
    # first k at which GPU counts alone allow a fit is a lower bound, and usually the
    # answer: one placement confirms it; otherwise a binary search above it finds the
    # first fit in a few placements instead of one per victim.
    lo = _enough_gpus_at(job, view, eligible, leaving, free_total)
    if lo is None:
        return None
    found = _place_without(job, view, leaving + eligible[:lo], place)
    hi = lo
    if not isinstance(found, Placement):
        hi = len(eligible)
        found = _place_without(job, view, leaving + eligible, place)
        if not isinstance(found, Placement):
            return None
        lo += 1
        while lo < hi:
            mid = (lo + hi) // 2
            placed = _place_without(job, view, leaving + eligible[:mid], place)
            if isinstance(placed, Placement):
                hi, found = mid, placed
            else:
                lo = mid + 1
    used = {s.node_id for s in found.shards}
    victims = tuple(v for v in eligible[:hi] if any(s.node_id in used for s in v.shards))
    view.memo[(_ROOM, job.job_id)] = (victims, found)  # for `hold_room`, if it stops them
    return victims


def _enough_gpus_at(
    job: PendingJob,
    view: View,
    eligible: list[PlacedJob],
    leaving: list[PlacedJob],
    free_total: int,
) -> int | None:
    """The shortest prefix of `eligible` after whose release there are enough free GPUs
    for the job, counting GPUs only (`GpuCount`)."""
    count = GpuCount(job, view, leaving, free_total)
    for k, victim in enumerate(eligible, start=1):
        if count.release(victim):
            return k
    return None


class GpuCount:
    """Free GPUs as victims are released one by one, counted, not placed: on each node
    for a job that fits on one, in all for a gang spread over nodes. Jobs already
    leaving are released first."""

    __slots__ = ("free", "freed", "need", "spread", "view")

    def __init__(
        self, job: PendingJob, view: View, leaving: list[PlacedJob], free_total: int
    ) -> None:
        self.view = view
        self.need = job.request.gpus
        self.spread = needs_spreading(job, view)
        self.freed = free_total  # in all, for a gang spread over nodes
        self.free: dict[str, int] = {}  # per node, for a job on one
        for victim in leaving:
            self.release(victim)

    def release(self, victim: PlacedJob) -> bool:
        """Counts the victim's GPUs free; whether the job now has enough."""
        if self.spread:
            self.freed += victim.request.gpus
            return self.freed >= self.need
        enough = False
        free = self.free
        for shard in victim.shards:
            cap = self.view.capacity.get(shard.node_id)
            if cap is None:
                continue  # a node that is away
            count = free.get(shard.node_id, len(cap.free_gpus)) + len(shard.gpu_uuids)
            free[shard.node_id] = count
            enough |= count >= self.need
        return enough


def _place_without(
    job: PendingJob,
    view: View,
    victims: list[PlacedJob],
    place: PlaceFn,
) -> Placement | NoFit:
    """Place `job` as if the victims had gone, then put the view back as it was."""
    undo = []
    for victim in victims:
        for shard, part in zip(
            victim.shards, shard_requests(victim.request, victim.shards), strict=True
        ):
            if shard.node_id not in view.capacity:
                continue  # a node that is away: nothing there to give back
            cap = view.writable(shard.node_id)
            del view.by_free[len(cap.free_gpus)][shard.node_id]
            cap.give_back([view.gpu(u) for u in shard.gpu_uuids], part)
            view.by_free[len(cap.free_gpus)][shard.node_id] = None
            undo.append((shard, part))
    try:
        return place(job, view)
    finally:
        for shard, part in undo:
            cap = view.writable(shard.node_id)
            del view.by_free[len(cap.free_gpus)][shard.node_id]
            cap.take(shard.gpu_uuids, part)
            view.by_free[len(cap.free_gpus)][shard.node_id] = None
