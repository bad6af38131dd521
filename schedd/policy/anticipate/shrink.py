"""Shrink (Gandiva): elastic jobs give GPUs back to make room on one node for a job that
waits, where its GPUs x its expected wait exceed what the restarts cost.

After the cycle's decisions, for the first `migrate_jobs` jobs waiting for capacity that
fit a node: on each node that could run the job (the 16 with the most free GPUs), the
running elastic jobs there (`migration.movable`) shrink toward the least of their range,
those with the most to give first, until the GPUs missing there are covered; the node
whose shrinks restart the fewest GPUs wins if the waiting job's GPUs x its expected wait
exceed those GPUs x `migrate_cost_s`. Each shrunk job keeps the first of its GPUs and
restarts on them from its checkpoint (`Resize`); the waiting job starts once they have.
While jobs wait, an elastic job too young to shrink is looked at again when it comes
of age (`recheck_at`).
"""

from __future__ import annotations

from schedd.policy import migration
from schedd.policy.actions import Action, Plan, Resize
from schedd.policy.placement import has_room
from schedd.policy.snapshot import PendingJob, PlacedJob
from schedd.policy.view import View

Shrinks = list[tuple[PlacedJob, int]]  # (job, GPUs it keeps)


def anticipate(view: View, plan: Plan) -> list[Action]:
    actions: list[Action] = []
    promised = migration.promised(view)
    for job in migration.waiting_for_room(view, plan):
        found = _cheapest(job, view, promised)
        if found is None:
            continue
        node_id, shrinks = found
        restarted = sum(j.request.gpus for j, _ in shrinks)
        wait = migration.expected_wait(job, view)
        if job.request.gpus * wait <= restarted * view.settings.migrate_cost_s:
            continue
        promised.add(node_id)
        for shrunk, keep in shrinks:
            (shard,) = shrunk.shards
            kept = shard.gpu_uuids[:keep]
            view.mark(shrunk.job_id)
            actions.append(
                Resize(
                    shrunk.job_id,
                    keep,
                    f"shrinks to {keep} GPU(s) to make room on node {node_id} for job"
                    f" {job.job_id}, which would wait about {wait / 60:.0f} min otherwise",
                    node_id,
                    kept,
                )
            )
    return actions


def _cheapest(job: PendingJob, view: View, promised: set[str]) -> tuple[str, Shrinks] | None:
    best: tuple[int, str, Shrinks] | None = None
    for node_id, missing in migration.short_nodes(job, view, promised):
        cap = view.capacity[node_id]
        if not has_room(cap.cpus, cap.memory_mib, job.request):
            continue  # a shrunk job keeps its CPUs and memory
        shrinks = _shrinks_on(node_id, missing, view)
        if shrinks is None:
            continue
        restarted = sum(j.request.gpus for j, _ in shrinks)
        if best is None or (restarted, node_id) < best[:2]:
            best = (restarted, node_id, shrinks)
    return None if best is None else (best[1], best[2])


def recheck_at(view: View, plan: Plan) -> float | None:
    """While a job waits for capacity: when an elastic job that could give GPUs back
    but was too young to comes of age."""
    if not migration.waiting_for_room(view, plan):
        return None
    return migration.comes_of_age(view, _can_give)


def _can_give(job: PlacedJob) -> bool:
    return (
        job.gpu_range is not None and len(job.shards) == 1 and job.request.gpus > job.gpu_range[0]
    )


def _shrinks_on(node_id: str, missing: int, view: View) -> Shrinks | None:
    elastic = sorted(
        (
            j
            for j in migration.placed_on(view).get(node_id, [])
            if _can_give(j) and migration.movable(j, view)
        ),
        key=lambda j: (-(j.request.gpus - j.gpu_range[0]), j.job_id),  # type: ignore[index]
    )
    shrinks: Shrinks = []
    for job in elastic:
        assert job.gpu_range is not None
        give = min(job.request.gpus - job.gpu_range[0], missing)
        shrinks.append((job, job.request.gpus - give))
        missing -= give
        if missing <= 0:
            return shrinks
    return None
