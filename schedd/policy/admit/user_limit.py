"""A user may hold up to `user_limit_factor` times the queue's guarantee (YARN)."""

from __future__ import annotations

from schedd.policy.actions import Wait
from schedd.policy.resources import NOTHING
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def admit(job: PendingJob, view: View) -> Wait | None:
    spec = view.queue(job.queue)
    if spec.user_limit_factor is None or spec.guarantee.gpus <= 0:
        return None
    limit = spec.user_limit_factor * spec.guarantee.gpus
    held = view.user_allocated.get((job.queue, job.user), NOTHING).gpus
    if held + job.request.gpus > limit:
        return Wait(
            "user_limit",
            f"user {job.user} would hold {held + job.request.gpus} GPUs in queue {job.queue};"
            f" the per-user limit is {limit:g}",
        )
    return None
