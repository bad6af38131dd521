"""What Gandiva's migration reads: which running jobs may move, where to, and whether a
move pays for itself. Shared by the plugins that decide moves and restarts
(`anticipate.defragment`, `relieve`, `gather`, `shrink`, `grow`); the plan says
`Migrate` or `Resize`, and the view gives the target GPUs to the job at once
(`View.claim`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from schedd.policy.actions import Migrate, Plan
from schedd.policy.placement import has_room, needs_spreading, node_can_ever_fit, usable_for
from schedd.policy.reservation import reservation_for
from schedd.policy.snapshot import (
    GUARANTEED,
    MIGRATING,
    PendingJob,
    PlacedJob,
    Shard,
    holds_gpus,
)
from schedd.policy.timeslice import group_sizes, since
from schedd.policy.view import View


class Taken:
    """What moves weighed together in this plan take on each node before the view
    knows of them: GPUs, and CPUs and memory."""

    __slots__ = ("gpus", "used")

    def __init__(self) -> None:
        self.gpus: dict[str, set[str]] = {}
        self.used: dict[str, tuple[float, int]] = {}  # node -> (CPUs, memory)


def movable(job: PlacedJob, view: View, alone: bool = True, young: bool = False) -> bool:
    """A running guaranteed job that can save a checkpoint (not paused by its user), has
    run `min_run_s` since it started, resumed or last moved (no moving back and forth;
    `young`: or not yet), and not already chosen by this plan; `alone`: with no job
    taking turns on its GPUs (it would be left behind, waiting for GPUs nobody uses)."""
    return (
        job.state == "running"
        and job.checkpointable
        and not job.paused
        and job.kind == GUARANTEED
        and job.request.gpus > 0
        and not view.decided(job.job_id)
        # The sum, as `comes_of_age` gives it: a plan at that very time finds it of age.
        and (young or view.now >= since(job) + view.settings.min_run_s)
        and all(s.node_id in view.capacity for s in job.shards)
        and not (alone and group_sizes(view)[job.gpu_uuids])
    )


def comes_of_age(
    view: View, wanted: Callable[[PlacedJob], bool], alone: bool = True
) -> float | None:
    """When the first job that `wanted` picks, and that could move but for its age, has
    run `min_run_s`: a move plugin that passed it over for that could act then with no
    event (`Plan.recheck_at`; Gandiva's introspective mode). Live, a job is known to
    save checkpoints once its shim first reports steps, which wakes the scheduler."""
    min_run = view.settings.min_run_s
    return min(
        (
            since(j) + min_run
            for j in view.snapshot.placed
            if since(j) + min_run > view.now and movable(j, view, alone, young=True) and wanted(j)
        ),
        default=None,
    )


def most_work_left(view: View, wanted: Callable[[PlacedJob], bool]) -> list[PlacedJob]:
    """The placed jobs that may move and are `wanted`, those with the most work left
    first (ties by id): whom a cycle's few moves go to first."""
    return sorted(
        (j for j in view.snapshot.placed if wanted(j) and movable(j, view)),
        key=lambda j: (-view.remaining(j), j.job_id),
    )


def placed_on(view: View) -> dict[str, list[PlacedJob]]:
    """node -> the placed jobs with GPUs there (once per cycle)."""
    key = ("placed_on",)
    known = view.memo.get(key)
    if known is None:
        on: dict[str, list[PlacedJob]] = {}
        for job in view.snapshot.placed:
            for shard in job.shards:
                on.setdefault(shard.node_id, []).append(job)
        known = view.memo[key] = on
    return known  # type: ignore[return-value]


def target(
    job: PlacedJob, view: View, avoid: frozenset[str], taken: Taken | None = None
) -> tuple[Shard, ...] | None:
    """The job's GPUs on one node outside `avoid`, best fit (the node left fullest),
    with its CPUs and memory; what is in `taken` is spoken for, and what a reservation
    holds is not the job's unless it ends before the reservation's start."""
    # Not pinned to the node a migration brought it to: it may move on from there.
    request = dataclasses.replace(job.request, node_id=None)
    need = request.gpus
    best: tuple[int, str, tuple[Shard, ...]] | None = None
    for bucket in view.by_free[need:]:
        for node_id in bucket:
            if node_id in avoid:
                continue
            cap = view.capacity[node_id]
            spoken = taken.gpus.get(node_id, set()) if taken else set()
            free = [g for g in usable_for(view, node_id, job) if g.uuid not in spoken]
            if len(free) < need or node_can_ever_fit(cap.node, request) is not None:
                continue
            cpus, memory = taken.used.get(node_id, (0.0, 0)) if taken else (0.0, 0)
            room_cpus, room_memory = view.room(node_id, job)
            if not has_room(room_cpus - cpus, room_memory - memory, request):
                continue
            left = len(free) - need
            if best is None or (left, node_id) < best[:2]:
                shard = Shard(node_id, tuple(g.uuid for g in free[:need]))
                best = (left, node_id, (shard,))
        if best is not None and best[0] == 0:
            break  # nothing fits better than exactly
    return None if best is None else best[2]


_NODES_TRIED = 16


def promised(view: View) -> set[str]:
    """Nodes this plan is freeing for a waiting job (by moves or shrinks): no other
    move of the plan goes there, nor counts on them for another job."""
    known: set[str] = view.memo.setdefault(("promised_nodes",), set())  # type: ignore[assignment]
    return known


def leaving_gpus(view: View, node_id: str, least_mib: int | None = None) -> int:
    """GPUs of the node that moves under way (migrations, shrinks) will free: those
    with at least `least_mib` of memory, where given."""
    freed = 0
    for job in placed_on(view).get(node_id, []):
        if job.state == MIGRATING:
            staying = {u for s in job.moving_to for u in s.gpu_uuids}
            here = (u for s in job.shards if s.node_id == node_id for u in s.gpu_uuids)
            leaving = [u for u in here if u not in staying]
            if least_mib is not None:
                leaving = [u for u in leaving if view.gpu(u).memory_mib >= least_mib]
            freed += len(leaving)
    return freed


def short_nodes(job: PendingJob, view: View, promised: set[str]) -> Iterator[tuple[str, int]]:
    """(node, GPUs missing there) for the nodes that could run a waiting job but lack
    GPUs for it now, even once the moves under way there are done, those with the most
    free first (at most 16 tried), none already promised to another job of the plan:
    where making room for it is weighed."""
    nodes = sorted(
        (
            n
            for n, cap in view.capacity.items()
            if n not in promised and node_can_ever_fit(cap.node, job.request) is None
        ),
        key=lambda n: (-len(usable_for(view, n, job)), n),
    )[:_NODES_TRIED]
    for node_id in nodes:
        missing = job.request.gpus - len(usable_for(view, node_id, job))
        if missing > 0 and missing > leaving_gpus(view, node_id, job.request.gpu_memory_mib):
            # where it fits, or will once moves under way are done, it waits for
            # something more room does not change
            yield node_id, missing


def take(taken: Taken, job: PlacedJob, shards: tuple[Shard, ...]) -> None:
    """`job` is weighed as moving to `shards` (one node, as `target` finds them)."""
    for shard in shards:
        taken.gpus.setdefault(shard.node_id, set()).update(shard.gpu_uuids)
        cpus, memory = taken.used.get(shard.node_id, (0.0, 0))
        taken.used[shard.node_id] = (cpus + job.request.cpus, memory + job.request.memory_mib)


def move(job: PlacedJob, shards: tuple[Shard, ...], view: View, reason: str) -> Migrate:
    """The action, with the view brought up to it."""
    view.claim(job, shards)
    (shard,) = shards
    return Migrate(job.job_id, shard.node_id, shard.gpu_uuids, reason)


def waiting_for_room(view: View, plan: Plan) -> list[PendingJob]:
    """The first `migrate_jobs` jobs waiting for capacity that fit a node."""
    by_id = {j.job_id: j for j in view.snapshot.pending}
    out = []
    for job_id, wait in plan.waiting.items():
        job = by_id.get(job_id)
        if wait.code != "no_capacity" or job is None or not holds_gpus(job):
            continue
        if job.request.gpus <= 0 or needs_spreading(job, view):
            continue
        out.append(job)
        if len(out) >= view.settings.migrate_jobs:
            break
    return out


def expected_wait(job: PendingJob, view: View) -> float:
    """Until enough GPUs free up for it by the running jobs' estimates."""
    held = reservation_for(job, view)
    if held is None:
        return view.settings.default_estimate_s
    return max(held.expected_start - view.now, 0.0)
