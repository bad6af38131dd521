"""Packing (Gandiva): two jobs taking turns on the same GPUs, each keeping them little
busy, run at once instead; the pack is undone when their measured progress shows it
hurts.

Once per cycle, after the turns (`decide.timeslice`):
- a packed job whose partner is gone (its GPUs are free) takes them as their holder
  (`Resume`, no `beside`); where they are not all free yet, it runs on, packed, and
  no turn begins on its GPUs meanwhile (`decide.timeslice`);
- a packed pair whose progress rates (each against its rate alone, as the shell measures
  them, read `pack_check_s` after the pack) add up to less than `pack_min_progress` is
  unpacked: the packed job is suspended
  and the turns go on; the shell records that it is not to be packed again this attempt
  (`packable`);
- a suspended job and the one job running on its very GPUs, neither unpacked before,
  whose utilisations (`utilization_pct`, the shell's figure; a job without one is not
  packed) add up to at most `pack_below_pct`, are packed: the suspended job resumes
  beside the running one (`Resume` with `beside`), unless an opportunistic job shares
  those GPUs.
A plan that packs asks to be made again `pack_check_s` later, when the rates are known.
"""

from __future__ import annotations

from schedd.policy.actions import Action, Resume, Suspend
from schedd.policy.snapshot import PlacedJob
from schedd.policy.timeslice import (
    free_uuids,
    holders,
    may_take_turns,
    packed_jobs,
    packed_sets,
    sole_holder,
    suspended_jobs,
)
from schedd.policy.view import View

_PACKED_NOW = ("packed_now",)


def decide(view: View) -> list[Action]:
    packed = packed_jobs(view)
    waiting = [j for j in suspended_jobs(view) if not view.decided(j.job_id)]
    if not packed and not waiting:
        return []
    holder = holders(view)
    check = view.settings.pack_check_s
    actions: list[Action] = []
    for job in packed:
        partner = _partner(job, holder)
        if partner is None:
            if free_uuids(job, view).issuperset(job.gpu_uuids):
                view.resume(job)
                actions.append(Resume(job.job_id, "its packed partner left: its GPUs are its own"))
            # Else its partner is on its way out, or paused by its user, or one of the
            # GPUs is out of placement: it runs on, packed, and no turn begins there.
            continue
        rates = (job.progress_ratio, partner.progress_ratio)
        measured = job.state_since is None or view.now >= job.state_since + check
        if measured and None not in rates and sum(rates) < view.settings.pack_min_progress:  # type: ignore[arg-type]
            view.mark(job.job_id)
            actions.append(
                Suspend(
                    job.job_id,
                    f"packed with job {partner.job_id}, the two ran at {rates[0]:.2f} and"
                    f" {rates[1]:.2f} of their speed alone: worse than taking turns",
                )
            )
    for job in waiting:
        partner = _partner(job, holder)
        if partner is None or not _packable(job, partner, view):
            continue
        view.mark(job.job_id)  # one pack each, this cycle
        view.mark(partner.job_id)
        view.mark_shared(job.shards)  # no opportunistic job joins them (place.share)
        view.memo[_PACKED_NOW] = True
        actions.append(
            Resume(
                job.job_id,
                f"packed beside job {partner.job_id}: together they use about"
                f" {job.utilization_pct + partner.utilization_pct}% of the GPUs",  # type: ignore[operator]
                beside=partner.job_id,
            )
        )
    return actions


def _partner(job: PlacedJob, holder: dict[str, PlacedJob]) -> PlacedJob | None:
    """The one job that holds the job's very GPUs, if it is running and may share."""
    partner = sole_holder(job, holder)
    return partner if partner is not None and may_take_turns(partner) else None


def _packable(job: PlacedJob, partner: PlacedJob, view: View) -> bool:
    if not (job.packable and partner.packable) or view.decided(partner.job_id):
        return False
    if partner.gpu_uuids in packed_sets(view):
        return False  # one job packed beside a holder at most
    shared = {u for s in partner.shards for u in view.shared.get(s.node_id, ())}
    if not shared.isdisjoint(partner.gpu_uuids):
        return False  # an opportunistic job shares them: no third
    if job.utilization_pct is None or partner.utilization_pct is None:
        return False
    return job.utilization_pct + partner.utilization_pct <= view.settings.pack_below_pct


def recheck_at(view: View) -> float | None:
    """The soonest of: `pack_check_s` after the pack this plan made, if it made one, and
    after each earlier pack still to be judged."""
    check = view.settings.pack_check_s
    times = [
        j.state_since + check
        for j in packed_jobs(view)
        if j.state_since is not None and j.state_since + check > view.now
    ]
    if view.memo.get(_PACKED_NOW):
        times.append(view.now + check)
    return min(times, default=None)
