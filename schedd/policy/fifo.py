"""FIFO with best-fit placement on whole GPUs.

Jobs start in submission order. The first job that cannot start now blocks the ones
behind it (no backfill: that comes with reservations); a job that no node could ever
run is skipped with a reason instead of blocking the queue forever.
"""

from __future__ import annotations

from schedd.policy.actions import Launch, Plan, Wait
from schedd.policy.placement import NoFit, best_fit, node_can_ever_fit
from schedd.policy.snapshot import Request, Snapshot, free_capacity


def never_fits(snapshot: Snapshot, request: Request) -> Wait | None:
    """A Wait when no connected node, even empty, could run the request."""
    if not snapshot.nodes:
        return Wait("no_nodes", "no nodes are connected")
    why = [node_can_ever_fit(n, request) for n in snapshot.nodes]
    if all(why):
        largest = max(len(n.gpus) for n in snapshot.nodes)
        if request.gpus > largest:
            return Wait(
                "too_large",
                f"asks for {request.gpus} GPUs on one node; the largest node has {largest}",
            )
        return Wait(
            "too_large", f"no node could ever run it: {why[0]} (e.g. {snapshot.nodes[0].node_id})"
        )
    return None


def plan(snapshot: Snapshot, now: float) -> Plan:
    result = Plan()
    capacity = free_capacity(snapshot)
    blocker: str | None = None
    for job in snapshot.pending:
        if blocker is not None:
            result.waiting[job.job_id] = Wait("fifo_order", f"queued behind job {blocker} (FIFO)")
            continue
        impossible = never_fits(snapshot, job.request)
        if impossible is not None:
            result.waiting[job.job_id] = impossible
            continue
        placed = best_fit(capacity, job.request)
        if isinstance(placed, NoFit):
            result.waiting[job.job_id] = Wait("no_capacity", placed.describe(job.request))
            blocker = job.job_id
            continue
        capacity[placed.node_id].take(placed.gpu_uuids, job.request)
        result.actions.append(
            Launch(job.job_id, placed.node_id, placed.gpu_uuids, "FIFO, best fit")
        )
    return result
