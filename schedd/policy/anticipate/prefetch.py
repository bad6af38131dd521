"""Liquid's pre-scheduled data transfer: a waiting job's inputs go ahead to the node it
is expected to get, while the jobs there still run.

After the cycle's decisions, the jobs waiting for capacity (in the order the plan
considered them; at most `prefetch_jobs`) are matched with the node where enough GPUs
free up first, by the running jobs' expected ends (their estimates less the time run),
within `prefetch_horizon_s`. Each node's GPUs go to one job at a time, so the next job
looks further. A job whose inputs went to that node already is left alone. The copy
lands in the node's shared cache, where the launch finds it; a job that starts on
another node after all stages its inputs at launch, as it would have anyway. GPUs
reserved for another job count as freeing for this one (a reservation moves each cycle).
"""

from __future__ import annotations

from collections import defaultdict

from schedd.policy.actions import Action, Plan, Prefetch
from schedd.policy.placement import node_can_ever_fit
from schedd.policy.snapshot import PendingJob, PlacedJob, holds_gpus
from schedd.policy.view import View

WAITING_FOR_ROOM = frozenset({"no_capacity", "reserved"})


def anticipate(view: View, plan: Plan) -> list[Action]:
    wanting = _wanting(view, plan)
    if not wanting:
        return []
    horizon = view.now + view.settings.prefetch_horizon_s
    freeing: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for running, ends in _expected_ends(view):
        if ends <= horizon:
            for shard in running.shards:
                if shard.node_id in view.capacity:  # not a node that is away
                    freeing[shard.node_id].append((ends, len(shard.gpu_uuids)))
    claimed: dict[str, int] = defaultdict(int)
    actions: list[Action] = []
    for job in wanting:
        found = _first_to_free(job, view, freeing, claimed)
        if found is None:
            continue
        when, node_id = found
        claimed[node_id] += job.request.gpus
        if job.prefetched_to == node_id:
            continue
        minutes = max(when - view.now, 0.0) / 60
        actions.append(
            Prefetch(
                job.job_id,
                node_id,
                job.inputs,
                f"node {node_id} is expected to free {job.request.gpus} GPU(s) for it in"
                f" about {minutes:.0f} min",
            )
        )
    return actions


def recheck_at(view: View) -> float | None:
    """When a running job comes within the horizon of its expected end, if a job with
    inputs not yet sent anywhere waits: a cycle then could send them."""
    if not any(j.inputs and j.prefetched_to is None for j in view.snapshot.pending):
        return None
    horizon = view.settings.prefetch_horizon_s
    times = [ends - horizon for _, ends in _expected_ends(view) if ends - horizon > view.now]
    return min(times, default=None)


def _expected_ends(view: View) -> list[tuple[PlacedJob, float]]:
    """Running jobs not on their way out nor paused by this plan, with when each is
    expected to end."""
    return [
        (job, view.ends(job))
        for job in view.snapshot.placed
        if job.stoppable
        and job.job_id not in view.stopping
        and job.job_id not in view.paused
        and holds_gpus(job)
    ]


def _wanting(view: View, plan: Plan) -> list[PendingJob]:
    # A job of no GPUs waits for CPUs or memory, which no GPU count here foresees.
    with_inputs = {j.job_id: j for j in view.snapshot.pending if j.inputs and j.request.gpus}
    if not with_inputs:
        return []
    waiting = [
        with_inputs[job_id]
        for job_id, wait in plan.waiting.items()
        if wait.code in WAITING_FOR_ROOM and job_id in with_inputs
    ]
    return waiting[: view.settings.prefetch_jobs]


def _first_to_free(
    job: PendingJob,
    view: View,
    freeing: dict[str, list[tuple[float, int]]],
    claimed: dict[str, int],
) -> tuple[float, str] | None:
    """(when, node): the earliest a node has the job's GPUs free, by expected ends."""
    need = job.request.gpus
    best: tuple[float, str] | None = None
    for node_id, ends in freeing.items():
        cap = view.capacity[node_id]
        if node_can_ever_fit(cap.node, job.request) is not None:
            continue
        have = len(cap.free_gpus) - claimed[node_id]
        for when, gpus in sorted(ends):
            have += gpus
            if have >= need:
                if best is None or (when, node_id) < best:
                    best = (when, node_id)
                break
    return best
