"""Migration for locality (Gandiva): a running job spread over several nodes moves onto
one node that now has its GPUs free, if the speed it gains over what it has left
(`spread_speed` of full speed when spread, by assumption) is worth more than the move
costs it (`migrate_cost_s`). At most `migrate_jobs` moves a cycle, those with the most
work left first. Only a shell that runs jobs across nodes has such jobs. A spread job
too young to move is looked at again when it comes of age (`recheck_at`), whether or
not jobs wait."""

from __future__ import annotations

from schedd.policy import migration
from schedd.policy.actions import Action, Plan
from schedd.policy.placement import needs_spreading
from schedd.policy.snapshot import PlacedJob
from schedd.policy.view import View


def anticipate(view: View, plan: Plan) -> list[Action]:
    if not view.snapshot.multi_node:
        return []
    spread = migration.most_work_left(view, lambda j: _gatherable(j, view))
    settings = view.settings
    actions: list[Action] = []
    for job in spread:
        if len(actions) >= settings.migrate_jobs:
            break
        gain = _gain(job, view)
        if gain <= settings.migrate_cost_s:
            continue
        shards = migration.target(job, view, frozenset(migration.promised(view)))
        if shards is None:
            continue
        nodes = len(job.shards)
        reason = f"onto one node from {nodes}: about {gain / 60:.0f} min of its run to gain"
        actions.append(migration.move(job, shards, view, reason))
    return actions


def recheck_at(view: View, plan: Plan) -> float | None:
    """When a spread job that was too young to gather comes of age, if a node has its
    GPUs free now and the gain would be worth the move."""
    if not view.snapshot.multi_node:
        return None
    promised = frozenset(migration.promised(view))

    def worth(job: PlacedJob) -> bool:
        return (
            _gatherable(job, view)
            and _gain(job, view) > view.settings.migrate_cost_s
            and migration.target(job, view, promised) is not None
        )

    return migration.comes_of_age(view, worth)


def _gain(job: PlacedJob, view: View) -> float:
    """The run time a spread job saves on one node (`spread_speed` when spread)."""
    return view.remaining(job) * (1.0 - view.settings.spread_speed)


def _gatherable(job: PlacedJob, view: View) -> bool:
    return len(job.shards) > 1 and not needs_spreading(job, view)
