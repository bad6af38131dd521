"""A user may hold up to `user_limit_factor` times the queue's guarantee (YARN)."""

from __future__ import annotations

from schedd.policy.actions import Wait
from schedd.policy.resources import NOTHING
from schedd.policy.snapshot import PendingJob
from schedd.policy.view import View


def admit(job: PendingJob, view: View) -> Wait | None:
    return refusal(job.queue, job.user, job.request.gpus, view)


def refusal(queue: str, user: str, gpus: int, view: View) -> Wait | None:
    """Why `user` may not hold `gpus` more GPUs in `queue`, or None."""
    spec = view.queue(queue)
    if spec.user_limit_factor is None or spec.guarantee.gpus <= 0:
        return None
    limit = spec.user_limit_factor * spec.guarantee.gpus
    held = view.user_allocated.get((queue, user), NOTHING).gpus
    if held + gpus > limit:
        return Wait(
            "user_limit",
            f"user {user} would hold {held + gpus} GPUs in queue {queue};"
            f" the per-user limit is {limit:g}",
        )
    return None
