"""`GET /v1/queues`: each queue's quota, what it holds and borrows, its share, its waits.

A queue's figures include its sub-queues (`org` counts `org/team`'s jobs), as quotas do.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from schedd.policy import fairness
from schedd.policy.placed_totals import counted_afresh
from schedd.policy.queues import lineage
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.snapshot import Snapshot
from schedd.policy.view import View
from schedd.scheduler import Scheduler, named_gpus
from schedd.store import jobs
from shared.config import QueueConfig


def _resources(r: Resources) -> dict[str, Any]:
    return {
        "gpus": r.gpus,
        "cpus": round(r.cpus, 3),
        "memory_mib": r.memory_mib,
        "gpu_memory_mib": r.gpu_memory_mib,
    }


def _max(q: QueueConfig | None) -> dict[str, Any] | None:
    if q is None:
        return None
    most = {
        "gpus": q.max_gpus,
        "cpus": q.max_cpus,
        "memory_mib": q.max_memory_mib,
        "gpu_memory_mib": q.max_gpu_memory_mib,
    }
    return most if any(v is not None for v in most.values()) else None


def _borrowed(held: Resources, guarantee: Resources) -> Resources:
    return Resources(
        max(held.gpus - guarantee.gpus, 0),
        max(held.cpus - guarantee.cpus, 0.0),
        max(held.memory_mib - guarantee.memory_mib, 0),
        max(held.gpu_memory_mib - guarantee.gpu_memory_mib, 0),
    )


async def report(scheduler: Scheduler) -> dict[str, Any]:
    configured = scheduler.queue_config
    now = time.time()
    placed = await scheduler.placed_now()
    usage = await scheduler.usage()
    pending = await jobs.pending_by_queue(scheduler.pool)
    snapshot = Snapshot(
        nodes=scheduler.nodes(named_gpus(placed)),
        placed=placed,
        pending=(),
        queues=scheduler.queues,
        usage=usage,
    )
    # Counted apart: a large plan may be running in a worker thread meanwhile.
    view = View.build(snapshot, now, scheduler.settings, counted_afresh(snapshot))
    last = scheduler.last
    waiting = last.waiting_by_queue() if last is not None else {}
    pending_total: dict[str, int] = {}
    for queue, n in pending.items():
        for q in lineage(queue):
            pending_total[q] = pending_total.get(q, 0) + n
    names = sorted(set(configured) | set(pending) | {j.queue for j in placed})
    queues = []
    for name in names:
        spec = view.queue(name)
        held = view.allocated.get(name, NOTHING)
        queues.append(
            {
                "name": name,
                "configured": name in configured,
                "guarantee": _resources(spec.guarantee),
                "max": _max(configured.get(name)),
                "weight": spec.weight,
                "user_limit_factor": spec.user_limit_factor,
                "usage": _resources(held),
                "borrowed": _resources(_borrowed(held, spec.guarantee)),
                "fair_share": round(fairness.queue_share(name, view), 6),
                "decayed_usage_gpu_s": round(usage.queues.get(name, 0.0), 1),
                "pending": pending_total.get(name, 0),
                "waiting": dict(waiting.get(name, {})),
            }
        )
    return {
        "policy": scheduler.profile.name,
        "cluster": _resources(view.total),
        "last_cycle": (
            {
                "at": datetime.fromtimestamp(last.at, UTC).isoformat(),
                "considered": len(last.pending),
                "waiting": last.wait_counts(),
            }
            if last is not None
            else None
        ),
        "queues": queues,
    }
