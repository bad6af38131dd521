"""Deadline admission (Chronus): which jobs with a deadline can be guaranteed to meet it.

A mixed-integer program, solved by HiGHS, over every job whose deadline is guaranteed
already and every one waiting for an answer. x_j in {0, 1}: job j is guaranteed. For
each deadline D, the GPU-seconds guaranteed jobs must run before D have to fit in what
the cluster delivers by then at a packing efficiency eta (gangs never fill every GPU):

    sum over j of g_j * max(0, r_j - max(0, d_j - D)) * x_j  <=  eta * C * (D - now)

where g_j is the job's GPUs, r_j its remaining run time, d_j its deadline and C the
cluster's GPUs: a job due by D counts whole, one due later the part it could not put
off past D (the demand bound of earliest-deadline-first). A job that could not finish
in time even alone (r_j > d_j - now), or that asks for more GPUs than there are, is
refused outright. Guarantees already given are kept first (each weighs more than every
newcomer together), then as many newcomers as fit are admitted.

The bound is necessary for the deadlines to be met, and close to sufficient while eta
leaves room for fragmentation; guaranteed jobs then run first, least slack first,
preempting others (`order.deadline`, `make_room.deadline`). Above `MAX_ROWS` distinct
deadlines, each job is held to the latest of `MAX_ROWS` checkpoints at or before its
own: stricter, never looser.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from highspy import HighsLp, HighsVarType, MatrixFormat, kHighsInf

# The public `highspy.Highs` enables callbacks in its constructor, which prints HiGHS'
# banner before output can be switched off; the core class waits for its options.
from highspy import _Highs as Highs  # type: ignore[attr-defined]

from schedd.policy.immutable import immutable

# A branch-and-bound node limit rather than a time limit: the answer must not depend
# on how fast the machine is (the simulator replays the very same decisions).
MAX_NODES = 2000
MAX_ROWS = 256


class DeadlineJob(NamedTuple):  # a tuple: one is made per guarantee and plan
    job_id: str
    gpus: int
    remaining_s: float | None  # run time left; None: nothing is known
    deadline: float  # seconds since the epoch, as `now`
    committed: bool  # guaranteed already


@immutable
class Decision:
    admitted: bool
    reason: str


_KEPT = Decision(True, "guarantee kept: it still fits beside the others")
# Unchanged, so never sent: the reason given with the first refusal stands.
_REFUSED_AGAIN = Decision(False, "still refused: guaranteed jobs leave too little")


def decide(
    jobs: Sequence[DeadlineJob], capacity_gpus: int, now: float, efficiency: float
) -> dict[str, Decision]:
    """Whether each job is (still) guaranteed, and why, in words."""
    if jobs and (out := _all_fit(jobs, capacity_gpus, now, efficiency)) is not None:
        return out
    out = {}
    feasible: list[DeadlineJob] = []
    for job in jobs:
        refused = _alone(job, capacity_gpus, now)
        if refused is None:
            feasible.append(job)
        else:
            withdrawn = "guarantee withdrawn: " if job.committed else ""
            out[job.job_id] = Decision(False, withdrawn + refused)
    if not feasible:
        return out
    rate = efficiency * capacity_gpus
    # One order whatever the caller's, so that equal answers are broken the same way.
    feasible.sort(key=lambda j: (j.deadline, j.job_id))
    due, demand = _demand(*_columns(feasible), now)
    chosen = _solve(feasible, due, demand, rate, now)
    # What guaranteed jobs leave by each checkpoint.
    slack = rate * (due - now) - demand[[chosen[j.job_id] for j in feasible]].sum(axis=0)
    for i, job in enumerate(feasible):
        if chosen[job.job_id] and job.committed:
            out[job.job_id] = _KEPT  # unchanged: nobody reads new words for it
            continue
        if chosen[job.job_id]:
            out[job.job_id] = _guaranteed(job, now)
            continue
        # The tightest checkpoint it would load bounds what it could get.
        row = demand[i]
        room = float(np.min(slack[row > 0])) if row.any() else 0.0
        words = (
            f"needs {_hours(_work(job))} GPU-h before its deadline; guaranteed jobs leave"
            f" {_hours(max(room, 0.0))} GPU-h of {capacity_gpus} GPUs x {efficiency:g}"
        )
        if job.committed:
            words = f"guarantee withdrawn: the cluster can no longer meet it ({words})"
        out[job.job_id] = Decision(False, words)
    return out


def decide_again(
    kept: Sequence[DeadlineJob],
    refused: Sequence[DeadlineJob],
    capacity_gpus: int,
    now: float,
    efficiency: float,
) -> dict[str, Decision]:
    """Jobs refused before, each guaranteed now if it fits beside `kept` (the guarantees
    that stand after this decision) by every deadline's demand bound, in the order
    given; a greedy pass, not the program, so that asking again costs a decision
    little when, as mostly, the room has not come. Above `MAX_ROWS` distinct deadlines
    its checkpoints are not the program's: stricter, never looser."""
    out: dict[str, Decision] = {}
    able = []
    for job in refused:
        why = out_of_reach(job, capacity_gpus, now)
        if why is None:
            able.append(job)
        else:
            out[job.job_id] = Decision(False, why)
    if not able:
        return out
    jobs = [*kept, *able]
    due, demand = _demand(*_columns(jobs), now)
    rate = efficiency * capacity_gpus
    slack = rate * (due - now) - demand[: len(kept)].sum(axis=0)
    for i, job in enumerate(able, start=len(kept)):
        if np.all(slack >= demand[i] - 1e-6):
            slack -= demand[i]
            out[job.job_id] = _guaranteed(job, now)
        else:
            out[job.job_id] = _REFUSED_AGAIN
    return out


def out_of_reach(job: DeadlineJob, capacity_gpus: int, now: float) -> str | None:
    """Why a job refused before cannot be guaranteed now, whatever the others hold: it
    could not make it alone, or has outrun its estimate (nothing left by it to count)."""
    why = _alone(job, capacity_gpus, now)
    if why is None and job.remaining_s is not None and job.remaining_s <= 0:
        why = "past its run-time estimate: nothing left by it to guarantee"
    return why


def _all_fit(
    jobs: Sequence[DeadlineJob], capacity_gpus: int, now: float, efficiency: float
) -> dict[str, Decision] | None:
    """The answers when every job could make it alone and all of them fit together
    (nobody to choose between: the common case, found without a job-by-job pass);
    else None."""
    gpus, remaining, deadline = _columns(jobs)
    if not np.all(remaining <= deadline - now) or gpus.max() > capacity_gpus:
        return None  # some job is refused alone (no estimate: NaN compares false)
    due, demand = _demand(gpus, remaining, deadline, now)
    if not _all_within(demand, efficiency * capacity_gpus * (due - now)):
        return None
    return {j.job_id: _KEPT if j.committed else _guaranteed(j, now) for j in jobs}


def _all_within(demand: np.ndarray, capacity: np.ndarray) -> bool:
    """Whether every job's demand together fits what each checkpoint allows."""
    return bool(np.all(demand.sum(axis=0) <= capacity + 1e-6))


def _columns(jobs: Sequence[DeadlineJob]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The jobs' GPUs, remaining seconds (NaN: not known) and deadlines."""
    _, gpus, remaining, deadline, _ = zip(*jobs, strict=True)
    return (
        np.array(gpus, dtype=float),
        np.array(remaining, dtype=float),
        np.array(deadline, dtype=float),
    )


def _guaranteed(job: DeadlineJob, now: float) -> Decision:
    left = (job.deadline - now) / 60
    return Decision(
        True,
        f"guaranteed: {_hours(_work(job))} GPU-h fit before its deadline in"
        f" {left:.0f} min, beside the guarantees already given",
    )


def _alone(job: DeadlineJob, capacity_gpus: int, now: float) -> str | None:
    """Why the job could not meet its deadline even with the cluster to itself."""
    if job.remaining_s is None:
        return "no run-time estimate to guarantee a deadline with (set estimated_runtime_s)"
    if job.gpus > capacity_gpus:
        return f"asks for {job.gpus} GPUs; the cluster has {capacity_gpus}"
    left = job.deadline - now
    if job.remaining_s > left:
        return (
            f"cannot finish in time even alone: needs {job.remaining_s / 60:.0f} min,"
            f" the deadline is in {max(left, 0.0) / 60:.0f} min"
        )
    return None


def _work(job: DeadlineJob) -> float:
    assert job.remaining_s is not None
    return max(job.gpus, 1) * job.remaining_s


def _hours(gpu_s: float) -> str:
    return f"{gpu_s / 3600:.1f}"


def _demand(
    gpus: np.ndarray, remaining: np.ndarray, deadline: np.ndarray, now: float
) -> tuple[np.ndarray, np.ndarray]:
    """The checkpoints D (ascending) and, per job, the GPU-seconds it must run before
    each: whole if due by D, else what it could not put off past D."""
    due = np.unique(deadline)
    if len(due) > MAX_ROWS:
        due = np.unique(np.quantile(due, np.linspace(0, 1, MAX_ROWS), method="lower"))
    gpus = np.maximum(gpus, 1.0)
    remaining = np.nan_to_num(remaining)  # refused alone before it gets here
    # Held to the last checkpoint at or before its deadline (never a later one).
    held_to = due[np.searchsorted(due, deadline, side="right") - 1]
    later = np.maximum(held_to[:, None] - due[None, :], 0.0)
    demand = gpus[:, None] * np.maximum(remaining[:, None] - later, 0.0)
    return due, demand


def _greedy(jobs: Sequence[DeadlineJob], demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """A feasible start for the solver (and the answer when it takes every job):
    guarantees given first, then newcomers by deadline, each while every bound holds."""
    slack = capacity.copy()
    taken = np.zeros(len(jobs))
    for i in sorted(range(len(jobs)), key=lambda i: (not jobs[i].committed, jobs[i].deadline)):
        if np.all(slack >= demand[i] - 1e-6):
            slack -= demand[i]
            taken[i] = 1.0
    return taken


def _solve(
    jobs: Sequence[DeadlineJob], due: np.ndarray, demand: np.ndarray, rate: float, now: float
) -> dict[str, bool]:
    n = len(jobs)
    capacity = rate * (due - now)
    # Every job together fits: the greedy start would take each (its prefixes fit too).
    if _all_within(demand, capacity):
        return {job.job_id: True for job in jobs}
    start = _greedy(jobs, demand, capacity)
    if start.all():
        return {job.job_id: True for job in jobs}  # nothing to choose between
    newcomers = sum(1 for j in jobs if not j.committed)
    # Maximise: HiGHS minimises, so the weights go in negated.
    cost = np.array([-(newcomers + 1.0) if j.committed else -1.0 for j in jobs])
    columns = demand.T  # rows: checkpoints; columns: jobs
    nonzero = columns != 0
    lp = HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(due)
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.full(len(due), -kHighsInf)
    lp.row_upper_ = capacity
    lp.a_matrix_.format_ = MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate(([0], np.cumsum(nonzero.sum(axis=0))))
    lp.a_matrix_.index_ = np.nonzero(nonzero.T)[1].astype(np.int32)
    lp.a_matrix_.value_ = demand[nonzero.T]
    lp.integrality_ = [HighsVarType.kInteger] * n
    solver = Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("threads", 1)
    solver.setOptionValue("mip_max_nodes", MAX_NODES)
    solver.passModel(lp)
    solver.setSolution(_solution(solver, list(start)))
    solver.run()
    best = start
    found = solver.getSolution()
    if found.value_valid:  # optimal, or the best found within the node limit
        values = np.round(np.array(found.col_value))
        fits = np.all(values @ demand <= capacity + 1e-6)
        if fits and float(values @ cost) < float(start @ cost):
            best = values
    return {job.job_id: bool(best[i] > 0.5) for i, job in enumerate(jobs)}


def _solution(solver: Highs, values: list[float]) -> object:
    solution = solver.getSolution()
    solution.col_value = values
    solution.value_valid = True
    return solution
