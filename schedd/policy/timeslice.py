"""What time-slicing (Gandiva) reads of the cluster: groups of jobs taking turns on the
same GPUs, packs, and when a running job's turn is over. Shared by the plugins that
form the groups (`make_room.timeslice`), rotate and pack them (`decide.timeslice`,
`decide.pack`), and those that move jobs (`migration`, `anticipate.relieve`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from schedd.policy.queues import lineage
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.snapshot import GUARANTEED, PACKED, SUSPENDED, PlacedJob, holds_gpus
from schedd.policy.view import View


def since(job: PlacedJob) -> float:
    """When the job entered its state (its turn began, or it was paused)."""
    if job.state_since is not None:
        return job.state_since
    return job.started_at if job.started_at is not None else 0.0


# Turns that end within this share of a turn of each other are over together: the
# groups that rotate at one plan stay in step after it, so that the shell plans once
# for many of them instead of once for each (a turn is at most this much shorter).
TURN_SLACK = 0.1


def turn_over(job: PlacedJob, view: View) -> bool:
    """Whether the running job has had its turn (or all but the slack of it)."""
    return view.now >= turn_over_at(job, view)


def turn_over_at(job: PlacedJob, view: View) -> float:
    """When its turn counts as over: its end, less the slack."""
    return turn_ends(job, view) - TURN_SLACK * turn_length(job.queue, view)


def turn_length(queue: str, view: View) -> float:
    """`timeslice_s` times the queue's weight (weighted round-robin)."""
    return view.settings.timeslice_s * view.queue(queue).weight


def turn_ends(job: PlacedJob, view: View) -> float:
    """When a running job's turn is over: a turn after it started or resumed."""
    return since(job) + turn_length(job.queue, view)


_BEGUN = ("turns_begun",)


def turn_begins(queue: str, view: View) -> None:
    """A job of `queue` starts a turn in this plan (a newcomer beside a paused partner,
    or a resume): the plan is to be made again when that turn ends."""
    ends: list[float] = view.memo.setdefault(_BEGUN, [])  # type: ignore[assignment]
    ends.append(view.now + turn_length(queue, view))


def turns_begun_end(view: View) -> float | None:
    """When the first turn this plan began ends, if it began any."""
    ends: list[float] = view.memo.get(_BEGUN, [])  # type: ignore[assignment]
    return min(ends, default=None)


def suspended_jobs(view: View) -> list[PlacedJob]:
    """Suspended jobs that may be resumed, the one paused longest first: on connected
    nodes, and on no GPU out of placement (there, it stays paused: no resume, no pack,
    no partner moved away for it)."""
    key = ("timeslice_suspended",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = sorted(
            (
                j
                for j in view.snapshot.placed
                if j.state == SUSPENDED
                and all(s.node_id in view.capacity for s in j.shards)
                and not view.on_gpus_out(j)
            ),
            key=lambda j: (since(j), j.job_id),
        )
    return known  # type: ignore[return-value]


def holders(view: View) -> dict[str, PlacedJob]:
    """GPU uuid -> the job that holds it, as the snapshot shows (found once per cycle;
    a new dict each call: a plugin brings its copy up to its own decisions)."""
    key = ("timeslice_holders",)
    known = view.memo.get(key)
    if not isinstance(known, dict):
        known = view.memo[key] = {
            u: j for j in view.snapshot.placed if holds_gpus(j) for u in j.gpu_uuids
        }
    return dict(known)


def sole_holder(job: PlacedJob, holder: dict[str, PlacedJob]) -> PlacedJob | None:
    """The one job holding the job's very GPUs (its partner in turns or in a pack)."""
    on = {holder[u].job_id: holder[u] for u in job.gpu_uuids if u in holder}
    if len(on) != 1:
        return None
    (partner,) = on.values()
    return partner if partner.gpu_uuids == job.gpu_uuids else None


def packed_jobs(view: View) -> list[PlacedJob]:
    """Jobs packed beside the holder of their GPUs (once per cycle)."""
    key = ("timeslice_packed_jobs",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = [j for j in view.snapshot.placed if j.state == PACKED]
    return known  # type: ignore[return-value]


def free_uuids(job: PlacedJob, view: View) -> set[str]:
    """The GPUs free in the view on the nodes the job is on."""
    return {g.uuid for s in job.shards for g in view.capacity[s.node_id].free_gpus}


def may_take_turns(job: PlacedJob) -> bool:
    """A running guaranteed job on one node, not paused by its user: the kind that can
    be paused for another."""
    return (
        job.state == "running"
        and not job.paused
        and job.kind == GUARANTEED
        and holds_gpus(job)
        and len(job.shards) == 1
        and job.request.gpus > 0
    )


def group_sizes(view: View) -> Counter[tuple[str, ...]]:
    """Jobs per set of GPUs among the time-sliced ones, beside the one holding them: the
    suspended and packed jobs on each set."""
    key = ("timeslice_groups",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = Counter(j.gpu_uuids for j in suspended_jobs(view))
        known.update(j.gpu_uuids for j in packed_jobs(view))
    return known  # type: ignore[return-value]


def packed_sets(view: View) -> frozenset[tuple[str, ...]]:
    """The GPU sets a packed job runs on beside their holder: neither a third job nor a
    turn goes there while the pack lasts."""
    key = ("timeslice_packed",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = frozenset(j.gpu_uuids for j in packed_jobs(view))
    return known  # type: ignore[return-value]


def packed_gpus(view: View) -> frozenset[str]:
    """Every GPU a packed job runs on: no turn begins there while it does, its partner
    gone or not (once per cycle)."""
    key = ("timeslice_packed_gpus",)
    known = view.memo.get(key)
    if known is None:
        known = view.memo[key] = frozenset(u for s in packed_sets(view) for u in s)
    return known  # type: ignore[return-value]


def keeps_guarantees(queue: str, paused: Iterable[PlacedJob], view: View) -> bool:
    """Whether pausing `paused` for a job of `queue` leaves every queue of their
    lineages at or above its guarantee (of CPUs, memory and GPU memory too, where set),
    but those the job counts in too (a turn inside a queue keeps its total): a borrower
    takes no turns from a queue within its guarantee."""
    own = lineage(queue)
    given: dict[str, Resources] = {}
    for job in paused:
        for level in lineage(job.queue):
            if level not in own:
                given[level] = given.get(level, NOTHING) + job.request.resources()
    return all(
        (view.allocated.get(level, NOTHING) - out).keeps(view.queue(level).guarantee)
        for level, out in given.items()
    )
