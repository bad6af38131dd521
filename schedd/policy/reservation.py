"""Reservations for a blocked gang: which GPUs it waits for and when they should be free.

Recomputed from the snapshot every cycle (nothing is remembered between cycles): the
earliest time enough GPUs free up, from the placed jobs' estimated ends, on one node
for a job that fits a node, or across the cluster for a larger gang. The free GPUs of
those nodes are then held: a job may backfill into them only if it is expected to end
before that time.
"""

from __future__ import annotations

from collections import defaultdict

from schedd.policy.placement import needs_spreading, node_can_ever_fit, usable_for
from schedd.policy.snapshot import PendingJob, holds_gpus
from schedd.policy.view import Reservation, View


def _releases(view: View) -> dict[str, list[tuple[float, int]]]:
    """Per node, (expected time, GPUs) that placed jobs, and those this plan starts, give
    back, soonest first."""
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for job in view.snapshot.placed:
        if not holds_gpus(job) or job.job_id in view.paused:
            continue  # its GPUs are free for the gang already
        if job.job_id in view.stopping:
            end = view.now
        else:
            end = max(view.started(job) + view.estimate(job), view.now)
        for shard in job.shards:
            out[shard.node_id].append((end, len(shard.gpu_uuids)))
    for shards, end in view.launched:
        for shard in shards:
            out[shard.node_id].append((end, len(shard.gpu_uuids)))
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
    releases = _releases(view)
    if needs_spreading(job, view):
        events = sorted((t, n, node_id) for node_id, rel in releases.items() for t, n in rel)
        per_node = {n: len(view.usable_gpus(n, job)) for n in view.capacity}
        count = sum(per_node.values())
        when = view.now
        for t, n, node_id in events:
            if count >= need:
                break
            count += n
            per_node[node_id] += n
            when = t
        if count < need:
            return None
        # Hold only the nodes it needs: those with the most GPUs by then, so that the
        # gang spans as few as it can and the rest of the cluster stays open.
        chosen, held = [], 0
        for node_id, c in sorted(per_node.items(), key=lambda nc: (-nc[1], nc[0])):
            if held >= need or c <= 0:
                break
            chosen.append(node_id)
            held += c
        return Reservation(job.job_id, when, tuple(sorted(chosen)))
    best: tuple[float, str] | None = None
    for node in view.snapshot.nodes:
        if node_can_ever_fit(node, job.request) is not None:
            continue  # too few GPUs (or too small), CPUs or memory, however long it waits
        have = len(usable_for(view, node.node_id, job))
        when = view.now
        for t, n in releases.get(node.node_id, ()):
            if have >= need:
                break
            have += n
            when = t
        if have >= need and (best is None or (when, node.node_id) < best):
            best = (when, node.node_id)
    if best is None:
        return None
    return Reservation(job.job_id, best[0], (best[1],))
