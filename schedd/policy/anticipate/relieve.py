"""Migration to end time-slicing where it is no longer needed (Gandiva): when GPUs came
free that no waiting job took, a job taking turns with a suspended one moves there, so
that both run at once instead of in turns.

After the cycle's decisions, for each suspended job (the one paused longest first; at
most `migrate_jobs` moves), the one running job on its GPUs moves to free GPUs of its
size (best fit) if the time the pair would otherwise share (the shorter of the two
remaining run times) exceeds the move's cost, `migrate_cost_s`. The suspended job
resumes once its partner has left (`decide.timeslice`: its GPUs are free then). A
partner too young to move is looked at again when it comes of age (`recheck_at`).
"""

from __future__ import annotations

from schedd.policy import migration
from schedd.policy.actions import Action, Plan
from schedd.policy.snapshot import PlacedJob
from schedd.policy.timeslice import holders, sole_holder, suspended_jobs
from schedd.policy.view import View


def anticipate(view: View, plan: Plan) -> list[Action]:
    waiting = suspended_jobs(view)
    if not waiting or not view.free_gpu_count():
        return []
    settings = view.settings
    holder = holders(view)
    actions: list[Action] = []
    for job in waiting:
        if len(actions) >= settings.migrate_jobs:
            break
        if view.decided(job.job_id):
            continue  # resumed by this plan already
        partner = sole_holder(job, holder)
        if partner is None or not migration.movable(partner, view, False):
            continue
        shared = min(view.remaining(job), view.remaining(partner))
        if shared <= settings.migrate_cost_s:
            continue
        shards = migration.target(partner, view, frozenset(migration.promised(view)))
        if shards is None:
            continue
        reason = (
            f"to GPUs that came free: job {job.job_id}, which takes turns with it, then runs"
            f" at once (about {shared / 60:.0f} min of turns spared)"
        )
        actions.append(migration.move(partner, shards, view, reason))
    return actions


def recheck_at(view: View, plan: Plan) -> float | None:
    """While jobs are suspended: when the running partner of one, too young to move,
    comes of age, if GPUs of its size are free for it now."""
    waiting = suspended_jobs(view)
    if not waiting or not view.free_gpu_count():
        return None
    holder = holders(view)
    partners = {p.job_id for job in waiting if (p := sole_holder(job, holder)) is not None}
    promised = frozenset(migration.promised(view))

    def may_go(job: PlacedJob) -> bool:
        return job.job_id in partners and migration.target(job, view, promised) is not None

    return migration.comes_of_age(view, may_go, alone=False)
