"""Which deadlines are guaranteed (Chronus's admission), decided at each arrival and
each lease.

A decision is made when a pending job with a deadline has no answer yet, and at the
first plan of each lease (`deadline_lease_s`: the clock cut into leases, the plan
before this one made in an earlier lease, or none made since the shell started) while
any job has a deadline. Every undecided job is decided together with the jobs already
guaranteed, by `deadline_admission` (a MILP); the answers go out as `AdmitDeadline`
actions for the shell to record, and into the view for this cycle's order and
make-room plugins (`admitted`). A guarantee the cluster can no longer keep (a node
gone, a job that waited too long) is withdrawn so. A job refused earlier (or whose
guarantee was withdrawn), waiting or running as best-effort, that could still finish
in time alone is decided again after the newcomers, earliest deadline first, in what
the guarantees then standing leave (room its refusal lacked may have come since: a
guaranteed job ended early, or was cancelled). A greedy pass, not the program, so
that asking again costs little; re-decisions share `deadline_decisions` with the
newcomers, who come first. Between decisions, guarantees and refusals stand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

from schedd.policy.actions import Action, AdmitDeadline
from schedd.policy.deadline_admission import DeadlineJob, decide_again, out_of_reach
from schedd.policy.deadline_admission import decide as solve
from schedd.policy.kept import Kept
from schedd.policy.snapshot import PendingJob, PlacedJob, Snapshot
from schedd.policy.view import View

_KEY = ("deadline_admitted",)

J = TypeVar("J", PendingJob, PlacedJob)
# The guaranteed jobs of the last snapshot's placed and pending tuples: a plan for the
# next arrival often sees the same ones.
_placed = Kept[list[PlacedJob]]()
_pending = Kept[list[PendingJob]]()


def _committed(jobs: tuple[J, ...], kept: Kept[list[J]]) -> list[J]:
    known = kept.get(jobs)
    if known is None:
        known = kept.put([j for j in jobs if j.deadline_admitted and j.deadline is not None], jobs)
    return known


def admitted(job: PendingJob | PlacedJob, view: View) -> bool:
    """Whether the job's deadline is guaranteed, this cycle's decisions included."""
    if job.deadline is None:
        return False
    decided: dict[str, bool] = view.memo.get(_KEY, {})  # type: ignore[assignment]
    return decided.get(job.job_id, job.deadline_admitted) is True


def decide(view: View) -> list[Action]:
    snapshot = view.snapshot
    most = view.settings.deadline_decisions
    undecided = [
        j for j in snapshot.pending if j.deadline is not None and j.deadline_admitted is None
    ][:most]
    if not undecided and not (_lease_began(view) and _any_deadline(snapshot)):
        return []
    committed: list[PendingJob | PlacedJob] = [
        *_committed(snapshot.placed, _placed),
        *_committed(snapshot.pending, _pending),
    ]
    jobs = _deadline_jobs(committed, view, committed=True)
    jobs += _deadline_jobs(undecided, view, committed=False)
    gpus, now, efficiency = view.total.gpus, view.now, view.settings.deadline_efficiency
    decisions = solve(jobs, gpus, now, efficiency)
    again = _refused_in_reach(view)[: most - len(undecided)]
    if again:
        kept = [j for j in jobs if decisions[j.job_id].admitted]
        decisions.update(decide_again(kept, again, gpus, now, efficiency))
    answered = [(j.job_id, j.deadline_admitted) for j in (*committed, *undecided)]
    answered += [(j.job_id, False) for j in again]  # each refused before
    actions: list[Action] = []
    record: dict[str, bool] = {}
    for job_id, before in answered:
        decision = decisions[job_id]
        if decision.admitted != before:
            actions.append(AdmitDeadline(job_id, decision.admitted, decision.reason))
            record[job_id] = decision.admitted
    view.memo[_KEY] = record
    return actions


def recheck_at(view: View) -> float | None:
    """The start of the next lease, while any job has a deadline: it is decided again
    then, arrivals or not."""
    if not _any_deadline(view.snapshot):
        return None
    return _next_lease(view.now, view.settings.deadline_lease_s)


def _lease_began(view: View) -> bool:
    """Whether this is the first plan of a lease: the next lease after the plan before
    began by now (found as `recheck_at` finds it, so that the plan it asked for is one,
    whatever a float division rounds to)."""
    before = view.snapshot.planned_before
    return before is None or view.now >= _next_lease(before, view.settings.deadline_lease_s)


def _next_lease(after: float, lease: float) -> float:
    """The first lease boundary after `after`: the least multiple of `lease` above it
    (a float division may floor one off either way)."""
    k = math.floor(after / lease) + 1
    while k * lease <= after:
        k += 1
    while (k - 1) * lease > after:
        k -= 1
    return k * lease


def _any_deadline(snapshot: Snapshot) -> bool:
    return any(j.deadline is not None for jobs in (snapshot.pending, snapshot.placed) for j in jobs)


def _refused_in_reach(view: View) -> list[DeadlineJob]:
    """Jobs refused a guarantee, waiting or running as best-effort, that are not out of
    reach (`out_of_reach`), the earliest deadline first; the rest would only take the
    cycle's budget to be refused again."""
    refused = [
        j
        for jobs in (view.snapshot.pending, view.snapshot.placed)
        for j in jobs
        if j.deadline_admitted is False and j.deadline is not None
    ]
    gpus, now = view.total.gpus, view.now
    found = [
        j
        for j in _deadline_jobs(refused, view, committed=False)
        if out_of_reach(j, gpus, now) is None
    ]
    found.sort(key=lambda j: (j.deadline, j.job_id))
    return found


def _deadline_jobs(
    jobs: Sequence[PendingJob | PlacedJob], view: View, committed: bool
) -> list[DeadlineJob]:
    remaining = view.remaining
    return [
        DeadlineJob(
            j.job_id,
            j.request.gpus,
            remaining(j) if j.estimate_s is not None else None,
            j.deadline,  # type: ignore[arg-type]  # every job here has one
            committed,
        )
        for j in jobs
    ]
