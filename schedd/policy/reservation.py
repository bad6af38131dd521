"""Reservations for a blocked gang: which GPUs it waits for and when they should be free.

Recomputed from the snapshot every cycle (nothing is remembered between cycles): the
earliest time enough GPUs free up, from the placed jobs' estimated ends, on one node
for a job that fits a node, or across the cluster for a larger gang; GPUs count only
with the CPUs and memory to run the job beside them (for a gang, its share per GPU)
and with the GPU memory it asks. The free GPUs of those nodes are then held: a job may
backfill into them only if it is expected to end before that time.
"""

from __future__ import annotations

from collections import defaultdict

from schedd.policy.placement import (
    carried,
    has_room,
    needs_spreading,
    node_can_ever_fit,
    usable_for,
)
from schedd.policy.snapshot import (
    SUSPENDED,
    PendingJob,
    Request,
    Shard,
    holds_gpus,
    shard_requests,
)
from schedd.policy.view import Reservation, View

# (expected time, GPUs of the job's size, CPUs, memory) a node gets back then
Release = tuple[float, int, float, int]


def _releases(view: View, job: PendingJob) -> dict[str, list[Release]]:
    """Per connected node, what placed jobs, and those this plan starts, give back,
    soonest first: the GPUs they hold (counted only where big enough for `job`), and
    their CPUs and memory, which jobs on shared GPUs (opportunistic, packed) hold too.
    A suspended job's CPUs and memory, and those of a job this plan pauses, are held
    until it runs again: not foreseen. Nor are a sharer's this plan starts."""
    least = job.request.gpu_memory_mib

    def usable(shard: Shard) -> int:
        if least is None:
            return len(shard.gpu_uuids)
        return sum(view.gpu(u).memory_mib >= least for u in shard.gpu_uuids)

    ends: list[tuple[tuple[Shard, ...], float, Request, bool]] = []
    for placed in view.snapshot.placed:
        if placed.state == SUSPENDED or placed.job_id in view.paused:
            continue  # its GPUs are free for the job already
        if placed.job_id in view.stopping:
            end = view.now
        else:
            end = max(view.started(placed) + view.estimate(placed), view.now)
        ends.append((placed.shards, end, placed.request, holds_gpus(placed)))
    ends += ((shards, end, request, True) for shards, end, request in view.launched)
    out: dict[str, list[Release]] = defaultdict(list)
    connected = view.capacity
    for shards, end, request, gpus in ends:
        for shard, part in zip(shards, shard_requests(request, shards), strict=True):
            if shard.node_id in connected:  # a node away gives nothing back for now
                freed = usable(shard) if gpus else 0
                out[shard.node_id].append((end, freed, part.cpus, part.memory_mib))
    for releases in out.values():
        releases.sort()
    return out


def reservation_for(job: PendingJob, view: View) -> Reservation | None:
    need = job.request.gpus
    if need == 0:
        return None
    key = ("reservation", job.request)
    if key in view.memo:
        return None  # none could be found for this request earlier in the cycle
    held = _reservation(job, view, need)
    if held is None:
        view.memo[key] = None
    return held


def _reservation(job: PendingJob, view: View, need: int) -> Reservation | None:
    releases = _releases(view, job)
    request = job.request
    if needs_spreading(job, view):
        # Per node: the GPUs it may give the gang, its free CPUs and memory, and how
        # many of those GPUs they carry (`carried`): a gang's share of CPUs and memory
        # goes with each GPU.
        free: dict[str, tuple[int, float, int]] = {
            n: (len(usable_for(view, n, job)), cap.cpus, cap.memory_mib)
            for n, cap in view.capacity.items()
        }
        room = {n: carried(c, m, request, g) for n, (g, c, m) in free.items()}
        count = sum(room.values())
        when = view.now
        events = sorted(
            (t, node_id, g, c, m)
            for node_id, rel in releases.items()
            if node_id in free
            for t, g, c, m in rel
        )
        for t, node_id, g, c, m in events:
            if count >= need:
                break
            gpus, cpus, memory = free[node_id]
            free[node_id] = (gpus + g, cpus + c, memory + m)
            carries = carried(cpus + c, memory + m, request, gpus + g)
            count += carries - room[node_id]
            room[node_id] = carries
            when = t
        if count < need:
            return None
        # Hold only the nodes it needs: those that carry the most of it by then, so
        # that the gang spans as few as it can and the rest of the cluster stays open.
        takes: dict[str, int] = {}
        held = 0
        for node_id, c in sorted(room.items(), key=lambda nc: (-nc[1], nc[0])):
            if held >= need or c <= 0:
                break
            takes[node_id] = min(c, need - held)
            held += c
        chosen = tuple(sorted(takes))
        return Reservation(job.job_id, when, chosen, job.request, tuple(takes[n] for n in chosen))
    best: tuple[float, str] | None = None
    for node in view.snapshot.nodes:
        if node_can_ever_fit(node, request) is not None:
            continue  # too few GPUs (or too small), CPUs or memory, however long it waits
        cap = view.capacity[node.node_id]
        have, cpus, memory = len(usable_for(view, node.node_id, job)), cap.cpus, cap.memory_mib
        when = view.now
        for t, g, c, m in releases.get(node.node_id, ()):
            if have >= need and has_room(cpus, memory, request):
                break
            have, cpus, memory, when = have + g, cpus + c, memory + m, t
        fits = have >= need and has_room(cpus, memory, request)
        if fits and (best is None or (when, node.node_id) < best):
            best = (when, node.node_id)
    if best is None:
        return None
    return Reservation(job.job_id, best[0], (best[1],), job.request)
