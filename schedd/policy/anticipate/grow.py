"""Grow (Gandiva): an elastic job running on fewer GPUs than it may use grows into GPUs
left idle on its node, when no job waits for GPUs.

After the cycle's decisions, with no job left waiting for capacity, each running elastic
job (one node, `migration.movable`) takes the free GPUs of its node up to the most its
range, its queues' maxes and its user's limit allow (the GPUs, and the GPU memory it
asks on each), if the time it saves (its remaining run time less that time x old / new
GPUs: the work is assumed to scale linearly) exceeds `migrate_cost_s`, the cost of the
restart from its checkpoint. At most `migrate_jobs` a cycle, most work left first. The
plan says `Resize` with the job's GPUs and the new ones; it holds the new ones at once.
An elastic job too young to grow is looked at again when it comes of age
(`recheck_at`), whether or not jobs wait.
"""

from __future__ import annotations

from schedd.policy import migration
from schedd.policy.actions import Action, Plan, Resize
from schedd.policy.admit import quota, user_limit
from schedd.policy.anticipate.prefetch import WAITING_FOR_ROOM
from schedd.policy.resources import Resources
from schedd.policy.snapshot import PlacedJob, Shard
from schedd.policy.view import View

WAITING_FOR_GPUS = WAITING_FOR_ROOM | {"preempting"}


def anticipate(view: View, plan: Plan) -> list[Action]:
    if _jobs_wait_for_gpus(plan):
        return []  # idle GPUs are for the jobs that wait, not for growing
    if not view.free_gpu_count():
        return []
    elastic = migration.most_work_left(view, _may_grow)
    settings = view.settings
    promised = migration.promised(view)  # the plan's set: moves below add to it
    actions: list[Action] = []
    for job in elastic:
        if len(actions) >= settings.migrate_jobs:
            break
        assert job.gpu_range is not None
        (shard,) = job.shards
        if shard.node_id in promised:
            continue  # its idle GPUs are being freed for a waiting job
        free = view.capacity[shard.node_id].free_gpus
        if (asked := job.request.gpu_memory_mib) is not None:  # as large as its own
            free = [g for g in free if g.memory_mib >= asked]
        now = job.request.gpus
        extra = tuple(g.uuid for g in free[: _allowed(job, view, job.gpu_range[1] - now)])
        if not extra:
            continue
        new = now + len(extra)
        saved = view.remaining(job) * (1 - now / new)
        if saved <= settings.migrate_cost_s:
            continue
        gpus = shard.gpu_uuids + extra
        view.claim(job, (Shard(shard.node_id, extra),))
        view.charge(job.queue, job.user, _more(job, len(extra)))
        actions.append(
            Resize(
                job.job_id,
                new,
                f"grows into {len(extra)} idle GPU(s) on its node: about"
                f" {saved / 60:.0f} min sooner done",
                shard.node_id,
                gpus,
            )
        )
    return actions


def recheck_at(view: View, plan: Plan) -> float | None:
    """While GPUs are free and no job waits for them: when an elastic job below the most
    of its range, with free GPUs on its node, that was too young to grow comes of age."""
    if _jobs_wait_for_gpus(plan) or not view.free_gpu_count():
        return None

    def idle_beside(job: PlacedJob) -> bool:
        cap = view.capacity.get(job.shards[0].node_id)  # None: the node is away
        return _may_grow(job) and cap is not None and bool(cap.free_gpus)

    return migration.comes_of_age(view, idle_beside)


def _jobs_wait_for_gpus(plan: Plan) -> bool:
    return any(w.code in WAITING_FOR_GPUS for w in plan.waiting.values())


def _may_grow(job: PlacedJob) -> bool:
    return (
        job.gpu_range is not None and job.request.gpus < job.gpu_range[1] and len(job.shards) == 1
    )


def _more(job: PlacedJob, gpus: int) -> Resources:
    """What `gpus` more GPUs add to the job's queue: the GPUs, and the GPU memory it asks
    on each (its CPUs and memory stay as they are)."""
    return Resources(gpus, gpu_memory_mib=gpus * (job.request.gpu_memory_mib or 0))


def _allowed(job: PlacedJob, view: View, most: int) -> int:
    """The most GPUs, up to `most`, the job may grow by within its queues' maxes and its
    user's limit, as admission counts them."""
    for more in range(most, 0, -1):
        if quota.refusal(job.queue, _more(job, more), view) is None and (
            user_limit.refusal(job.queue, job.user, more, view) is None
        ):
            return more
    return 0
