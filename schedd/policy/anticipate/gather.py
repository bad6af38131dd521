"""Migration for locality (Gandiva): a running job spread over several nodes moves onto
one node that now has its GPUs free, if the speed it gains over what it has left
(`spread_speed` of full speed when spread, by assumption) is worth more than the move
costs it (`migrate_cost_s`). At most `migrate_jobs` moves a cycle, those with the most
work left first. Only a shell that runs jobs across nodes has such jobs."""

from __future__ import annotations

from schedd.policy import migration
from schedd.policy.actions import Action, Plan
from schedd.policy.placement import needs_spreading
from schedd.policy.view import View


def anticipate(view: View, plan: Plan) -> list[Action]:
    if not view.snapshot.multi_node:
        return []
    spread = migration.most_work_left(
        view, lambda j: len(j.shards) > 1 and not needs_spreading(j, view)
    )
    settings = view.settings
    actions: list[Action] = []
    for job in spread:
        if len(actions) >= settings.migrate_jobs:
            break
        gain = view.remaining(job) * (1.0 - settings.spread_speed)
        if gain <= settings.migrate_cost_s:
            continue
        shards = migration.target(job, view, frozenset(migration.promised(view)))
        if shards is None:
            continue
        nodes = len(job.shards)
        reason = f"onto one node from {nodes}: about {gain / 60:.0f} min of its run to gain"
        actions.append(migration.move(job, shards, view, reason))
    return actions
