"""The plan loop that runs a profile's stages: decide, order, admit, place, make room,
reserve, anticipate.

Each stage is a plugin, a plain function with a typed result:

- decide(view) -> actions taken once per cycle before any job is considered (which
  deadlines are guaranteed, say); the plugin keeps what later stages read in the view;
- order(pending, view) -> the pending jobs in the order they are considered (a lazy
  iterator: it may look at the view again after each job, as DRF does);
- admit(job, view) -> a Wait saying why the job may not start now, or None, from the
  job's queue, user and request and the view alone;
- place(job, view) -> a Placement, or a NoFit counting nodes by why they did not fit;
- make_room(job, view, place) -> an Eviction (victims to preempt), or None;
- anticipate(view, plan) -> actions that prepare for the jobs still waiting, once the
  cycle's decisions are made (copy a job's inputs to the node it will likely get).

When nothing fits and no room is made, the profile's `blocking` says what follows:
"strict" holds every job behind the first one that did not fit (FIFO), "backfill"
reserves GPUs for it and lets others start only where they do not delay it, "skip"
goes on with the next job.

An elastic job (`gpu_range`) that does not fit whole starts on fewer GPUs, the most
of its range that fit. Under "skip" it first takes turns at its full count where it
can; one that would only borrow beyond its queue's guarantee then starts smaller only
on the GPUs left once every other pending job has been considered (`_entitled`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Literal, cast

from schedd.policy.actions import Action, Launch, Plan, Preempt, Reserve, SetKind, Suspend, Wait
from schedd.policy.immutable import immutable
from schedd.policy.kept import Kept
from schedd.policy.make_room.victims import Eviction, PlaceFn, await_leavers, hold_room
from schedd.policy.place import share
from schedd.policy.placement import (
    NoFit,
    Placement,
    big_enough,
    carried,
    has_room,
    needs_spreading,
    node_can_ever_fit,
)
from schedd.policy.queues import lineage
from schedd.policy.reservation import reservation_for
from schedd.policy.resources import NOTHING
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    GUARANTEED,
    OPPORTUNISTIC,
    Node,
    PendingJob,
    Request,
    Shard,
    Snapshot,
    holds_gpus,
    interned,
    usable,
    with_kind,
)
from schedd.policy.view import View

OrderFn = Callable[[Sequence[PendingJob], View], Iterator[PendingJob]]
AdmitFn = Callable[[PendingJob, View], Wait | None]
MakeRoomFn = Callable[[PendingJob, View, PlaceFn], Eviction | None]
RecheckFn = Callable[[View], float | None]
# A make-room plugin's rank of pending jobs by their attained service, for the plan (see
# `Stages.waits_alike`).
RankFn = Callable[[View], Callable[[PendingJob], float]]
DecideFn = Callable[[View], list[Action]]
AnticipateFn = Callable[[View, Plan], list[Action]]
AnticipateRecheckFn = Callable[[View, Plan], float | None]
Blocking = Literal["strict", "backfill", "skip"]

NO_NODES = Wait("no_nodes", "no nodes are connected")
GUARANTEE_BACK = "its guarantee is there again: it starts guaranteed"
NO_SHAREABLE_GPU = "no_shareable_gpu"


@immutable
class Stages:
    order: OrderFn
    admit: tuple[AdmitFn, ...]
    place: PlaceFn
    make_room: tuple[MakeRoomFn, ...]
    blocking: Blocking
    settings: Settings
    label: str  # why a job was launched, in words: "FIFO, best fit"
    # When the make-room plugins' answers could change with time alone (Plan.recheck_at).
    recheck: tuple[RecheckFn, ...] = ()
    decide: tuple[DecideFn, ...] = ()
    anticipate: tuple[AnticipateFn, ...] = ()
    # When the decide plugins could act with no event, whether or not jobs wait.
    recheck_always: tuple[RecheckFn, ...] = ()
    # When the anticipate plugins could act with no event, each asked with the plan
    # (whether jobs wait for room, what they wait for).
    anticipate_recheck: tuple[AnticipateRecheckFn, ...] = ()
    # Set where a job that waits tells how every later job of its queue, user, request
    # and GPU range waits until the view changes, if their rank is no better: each
    # make-room plugin finds victims only among jobs ranked below the waiting one, by
    # this rank or by none (reclaim). Most pending jobs of a busy cluster wait so, and
    # are answered without asking the stages again.
    waits_alike: RankFn | None = None
    # Make-room plugins that act for a job its queue's max or its user's limit holds
    # back, by stopping jobs that count against the same limit (`make_room.priority`).
    over_limit: tuple[MakeRoomFn, ...] = ()


def never_fits(view: View, job: PendingJob) -> Wait | None:
    """A Wait when no connected node (or, for a gang, the whole cluster) could run it."""
    request = job.request
    nodes = view.snapshot.nodes
    connected = max(len(n.gpus) for n in nodes)
    if needs_spreading(job, view):
        if request.gpus > view.total.gpus:
            return Wait(
                "too_large",
                f"asks for {request.gpus} GPUs; the cluster has {view.total.gpus}",
            )
        ever = sum(carried(n.cpus, n.memory_mib, request, big_enough(n, request)) for n in nodes)
        if ever < request.gpus:
            each = "" if request.gpu_memory_mib is None else f" of {request.gpu_memory_mib} MiB"
            return Wait(
                "too_large",
                f"asks for {request.gpus} GPUs{each}, {request.cpus:g} CPUs and"
                f" {request.memory_mib} MiB of memory: split by GPU, the nodes could only"
                f" ever run {ever} of them",
            )
        return None
    why = [node_can_ever_fit(n, request) for n in nodes]
    if not all(why):
        return None
    if request.gpus > connected:
        away = view.snapshot.largest_node_gpus
        if request.gpus <= away:
            across = " rather than run across nodes" if view.snapshot.multi_node else ""
            return Wait(
                "node_away",
                f"asks for {request.gpus} GPUs: the largest connected node has {connected},"
                f" and it waits for a node of {away} that is away or drained{across}",
            )
        return Wait(
            "too_large",
            f"asks for {request.gpus} GPUs on one node; the largest node has {connected}",
        )
    return Wait("too_large", f"no node could ever run it: {why[0]} (e.g. {nodes[0].node_id})")


def _served(
    stages: Stages,
    pending: Sequence[PendingJob],
    view: View,
    first: frozenset[str],
    again: set[str],
) -> Iterator[PendingJob]:
    """The pending jobs in the order's order, the claimants (`first`: `Plan.claimants`
    kept by the shell) before the rest: the stops were made for them, and a job the
    order puts first now would take the GPUs and leave them to preempt again. A
    claimant that claims nothing this time (`again`, filled as the claimants are
    served) comes again in its place in the order, where it may block or reserve as any
    job there."""
    if not first:
        return stages.order(pending, view)  # most plans: no layer between

    def claimants_first() -> Iterator[PendingJob]:
        yield from stages.order([j for j in pending if j.job_id in first], view)
        # The whole sequence again, not a copy without the claimants: orders may keep
        # their sort by the sequence's identity from plan to plan.
        for job in stages.order(pending, view):
            if job.job_id not in first or job.job_id in again:
                yield job

    return claimants_first()


def plan(stages: Stages, snapshot: Snapshot, now: float) -> Plan:
    result = Plan()
    if not snapshot.nodes:
        result.waiting = {j.job_id: NO_NODES for j in snapshot.pending}
        return result
    view = View.build(snapshot, now, stages.settings)
    for decide in stages.decide:
        result.actions.extend(decide(view))
    resumed = _resume_moves(view, result)
    blocker: str | None = None
    reservations = 0
    alike = _WaitsAlike(stages, view)
    # Elastic jobs looked at again once the order is through, to start smaller on what
    # is left (`_entitled`); `chain` reaches them only then.
    deferred: dict[str, PendingJob] = {}
    # Claimants served first that claimed nothing: served again in the order's place.
    first, again = snapshot.claimants, set[str]()
    served = _served(stages, snapshot.pending, view, first, again)
    for pending in chain(served, deferred.values()):
        if pending.request.node_id is not None:
            pending = _unpinned(pending, view)
        claiming = bool(first) and pending.job_id in first and pending.job_id not in again
        if resumed and pending.job_id in resumed:
            continue
        holds = holds_gpus(pending)
        if blocker is None and (known := alike.wait(pending)) is not None:
            if holds:
                result.waiting[pending.job_id] = known
            else:  # made opportunistic: as guaranteed it would wait, so it shares
                _place_opportunistic(pending, view, result)
            continue
        if not holds and pending.spec_kind == OPPORTUNISTIC:
            _place_opportunistic(pending, view, result)  # it holds nobody back: no FIFO
            continue
        if blocker is not None:
            result.waiting[pending.job_id] = Wait(
                "fifo_order", f"queued behind job {blocker} (FIFO)"
            )
            continue
        if not holds and alike.no_room(pending):  # as guaranteed it would wait: it shares
            _place_opportunistic(pending, view, result)
            continue
        # A job made opportunistic while it waited is considered as guaranteed first:
        # where its guarantee is there again (room, or a reclaim) it gets it back.
        converted = not holds
        job = with_kind(pending, GUARANTEED) if converted else pending
        if job.gpu_range is not None:
            job = _runnable(view, job)
        refused = _never_fits(view, job) or _refused(stages, job, view)
        if refused is not None and job.gpu_range is not None and refused.code in _LIMITS:
            admitted = _admitted_smaller(stages, job, view)
            if admitted is not None:
                job, refused = admitted, None
        if refused is not None and refused.code in _LIMITS and stages.over_limit:
            over = _make_room(stages, job, view, stages.over_limit)
            if over is not None:
                _preempt(job, over, view, stages, result, converted)
                continue
        if refused is not None:
            if converted:
                alike.waits(job, refused)
                _place_opportunistic(pending, view, result)
            else:
                result.waiting[job.job_id] = alike.waits(job, refused)
            continue
        placed = _place(stages, job, view)
        label = stages.label
        eviction: Eviction | None = None
        room_for = job  # the job as room is made for it
        if not isinstance(placed, Placement) and job.gpu_range is not None:
            first_look = stages.blocking == "skip" and pending.job_id not in deferred
            if first_look:
                eviction = _take_turns(stages, job, view)
            entitled = _entitled(job, view)
            # A claimant is not put off to the end: the jobs before it there would take
            # what is on its way out for it.
            if eviction is None and first_look and entitled is None and not claiming:
                # A job made opportunistic shares in its place where it can.
                if not (converted and _place_opportunistic(pending, view, result, False)):
                    deferred[pending.job_id] = pending
                continue
            if eviction is None:
                most = job.gpu_range[1]  # its range's, where it was planned at fewer
                smaller = _place_smaller(stages, job, view)
                if smaller is not None:
                    job, placed = smaller
                    label = f"{label}; elastic, on {job.request.gpus} of its {most} GPUs"
                elif entitled is not None:
                    room_for = entitled  # a reclaim takes back no more than the guarantee
        if eviction is None and not isinstance(placed, Placement):
            eviction = _make_room(stages, room_for, view)
        if eviction is not None and eviction.launch_on is not None:  # time-slicing
            job = room_for
            for victim in eviction.victims:
                view.suspend(victim)
                result.actions.append(Suspend(victim.job_id, eviction.reason))
            placed = Placement(eviction.launch_on)
            label = f"{label}, taking turns with {', '.join(v.job_id for v in eviction.victims)}"
            eviction = None
        if isinstance(placed, Placement):
            view.take(job, placed.shards)
            if converted:
                result.actions.append(SetKind(job.job_id, GUARANTEED, GUARANTEE_BACK))
            result.actions.append(Launch(job.job_id, placed.shards, label))
            continue
        if eviction is not None:
            if not eviction.victims:
                result.waiting[job.job_id] = await_leavers(job, view, stages.place)
                result.claimants.add(job.job_id)
                _charge_if_limited(job, view)
                continue
            _preempt(room_for, eviction, view, stages, result, converted)
            continue
        if converted:  # no room as guaranteed: it shares, as what it is now
            if alike.remembers:  # and so would its twins (`_blocked` reserves nothing here)
                alike.waits(job, _blocked(stages, job, view, placed, reservations), no_room=True)
            _place_opportunistic(pending, view, result)
            continue
        if claiming:  # it waits for nothing on its way out: its turn comes in the order
            again.add(pending.job_id)
            continue
        wait = _blocked(stages, job, view, placed, reservations)
        if wait.code == "no_capacity":
            wait = alike.waits(job, wait, no_room=True)
        result.waiting[job.job_id] = wait
        if stages.blocking == "strict":
            blocker = job.job_id
        elif result.waiting[job.job_id].code == "reserved":
            reservations += 1
            held = view.reserved_for(job.job_id)
            assert held is not None
            result.actions.append(
                Reserve(job.job_id, held.node_ids, held.expected_start, "head of the queue")
            )
    for anticipate in stages.anticipate:
        result.actions.extend(anticipate(view, result))
    rechecks = list(stages.recheck) if result.waiting else []
    if any(w.code == NO_SHAREABLE_GPU for w in result.waiting.values()):
        rechecks.append(share.recheck_at)
    rechecks += stages.recheck_always  # they may act with no job pending
    rechecks += [_with_plan(r, result) for r in stages.anticipate_recheck]
    if rechecks:
        result.defer_recheck(lambda: _earliest(rechecks, view))
    return result


def _with_plan(recheck: AnticipateRecheckFn, plan: Plan) -> RecheckFn:
    return lambda view: recheck(view, plan)


def _earliest(rechecks: list[RecheckFn], view: View) -> float | None:
    return min((t for recheck in rechecks if (t := recheck(view)) is not None), default=None)


class _WaitsAlike:
    """The waits of one plan by (queue, user, request, GPU range): the view's generation
    and the best rank that waited so (`Stages.waits_alike`), and the Wait. Only where a
    job that waits holds nobody back ("skip"): a reservation depends on more of the job
    (its estimate and age), and under "strict" the first job with no room blocks the
    rest, which a twin answered from its wait would not."""

    __slots__ = ("known", "last", "last_known", "rank", "roomless", "view")

    def __init__(self, stages: Stages, view: View) -> None:
        rank_of = stages.waits_alike
        self.rank = rank_of(view) if rank_of is not None and stages.blocking == "skip" else None
        self.view = view
        # key -> (generation, rank, attained service, wait)
        self.known: dict[tuple[object, ...], tuple[int, float, float, Wait]] = {}
        # The last job looked up and what was known for its key: twins come in runs
        # (the order hands out one group's jobs together), so most need no key at all.
        self.last: PendingJob | None = None
        self.last_known: tuple[int, float, float, Wait] | None = None
        # (queue, request) -> (generation, rank, attained service) of a job without a
        # GPU range that was admitted and found no room: `no_room`.
        self.roomless: dict[tuple[object, ...], tuple[int, float, float]] = {}

    def wait(self, job: PendingJob) -> Wait | None:
        """The wait of an earlier twin of `job` that holds for it as guaranteed (for a
        job made opportunistic: that it would wait as guaranteed), if there is one."""
        if self.rank is None or job.spec_kind != GUARANTEED:
            return None
        last = self.last
        if (
            last is not None
            and job.request is last.request
            and job.user == last.user
            and job.queue == last.queue
            and job.gpu_range == last.gpu_range
        ):
            earlier = self.last_known
        else:
            earlier = self.known.get((job.queue, job.user, job.request, job.gpu_range))
            self.last, self.last_known = job, earlier
        # Written out, as in `no_room`: a helper for both cost 2% of a backlog plan.
        if earlier is None or earlier[0] != self.view.generation or self.view.reservations:
            return None
        if job.attained_s == earlier[2] or self.rank(job) >= earlier[1]:
            return earlier[3]
        return None

    def no_room(self, job: PendingJob) -> bool:
        """Whether `job`, made opportunistic, would find no room as guaranteed: a job of
        its queue and request (neither elastic), ranked no worse, was admitted and found
        none at this generation. Whoever's it was: the user counts only in admission,
        which can but refuse it, and a job refused as guaranteed shares all the same."""
        if self.rank is None or job.spec_kind != GUARANTEED or job.gpu_range is not None:
            return False
        earlier = self.roomless.get((job.queue, job.request))
        if earlier is None or earlier[0] != self.view.generation or self.view.reservations:
            return False
        return job.attained_s == earlier[2] or self.rank(job) >= earlier[1]

    @property
    def remembers(self) -> bool:
        """Whether waits are remembered at all (only under "skip", with a rank)."""
        return self.rank is not None

    def waits(self, job: PendingJob, wait: Wait, no_room: bool = False) -> Wait:
        """`wait`, remembered as how `job` and its twins wait at this generation; with
        `no_room`, the job was admitted and found no room nor made any (`no_room`)."""
        if self.rank is not None and job.kind == GUARANTEED and not self.view.reservations:
            generation, rank = self.view.generation, self.rank(job)
            key = (job.queue, job.user, job.request, job.gpu_range)
            known = (generation, rank, job.attained_s, wait)
            self.known[key] = known
            self.last, self.last_known = job, known
            if no_room and job.gpu_range is None:
                self.roomless[(job.queue, job.request)] = (generation, rank, job.attained_s)
        return wait


def _place_opportunistic(job: PendingJob, view: View, result: Plan, waits: bool = True) -> bool:
    """An opportunistic job holds no share of its queue's and displaces nobody: it
    starts where GPUs stayed little used (True), or waits, never holding others back
    (its wait recorded unless not `waits`)."""
    # A request that found no shareable GPUs finds none later in the plan: its Wait is
    # kept, said once for every job of that request (which passed the checks below);
    # with a reservation, of that request and end (what it keeps is open to a job that
    # ends before it starts); of that GPU memory needed, which may be a prediction.
    ends = view.ends(job) if view.reservations else None
    key = ("no_share", job.request, share.gpu_memory_needed(job), ends)
    wait = view.memo.get(key)
    if not isinstance(wait, Wait):
        wait = _never_fits(view, job)
        largest = view.largest_node_gpus()
        if wait is None and job.request.gpus > largest:
            wait = Wait(
                "too_large",
                f"an opportunistic job runs on one node: it asks for {job.request.gpus} GPUs,"
                f" the largest node has {largest}",
            )
        if wait is None:
            placed = share.place(job, view)
            if isinstance(placed, Placement):
                view.take(job, placed.shards)
                launch = Launch(job.job_id, placed.shards, "opportunistic, little-used GPUs")
                result.actions.append(launch)
                return True
            wait = view.memo[key] = Wait(
                NO_SHAREABLE_GPU,
                f"no node has {job.request.gpus} GPU(s) to share: {placed.describe(job.request)}",
            )
    if waits:
        result.waiting[job.job_id] = wait
    return False


def _resume_moves(view: View, result: Plan) -> set[str]:
    """Jobs requeued to move, launched first on the GPUs a plan chose for them there
    (`PendingJob.resume_on`), where those are still free: they ran a moment ago, and the
    move was decided with those GPUs theirs. Where they are not (taken meanwhile), the
    job waits its turn as any other, pinned; where the node is away, unpinned
    (`_unpinned`)."""
    resumed: set[str] = set()
    for job in view.snapshot.pending:
        if not job.resume_on or job.request.node_id is None:
            continue
        node_id = job.request.node_id
        cap = view.capacity.get(node_id)
        if cap is None or len(job.resume_on) != job.request.gpus:
            continue
        free = {g.uuid for g in cap.free_gpus}
        if not free.issuperset(job.resume_on) or not has_room(
            cap.cpus, cap.memory_mib, job.request
        ):
            continue
        shards = (Shard(node_id, job.resume_on),)
        view.take(job, shards)
        result.actions.append(Launch(job.job_id, shards, "resumes on the GPUs held for its move"))
        resumed.add(job.job_id)
    return resumed


def _preempt(
    job: PendingJob, eviction: Eviction, view: View, stages: Stages, result: Plan, converted: bool
) -> None:
    """Stop the eviction's victims for `job`, which waits for them as a claimant."""
    if converted:
        result.actions.append(SetKind(job.job_id, GUARANTEED, GUARANTEE_BACK))
    for victim in eviction.victims:
        view.stop(victim)
        result.actions.append(Preempt(victim.job_id, eviction.reason))
    hold_room(job, view, stages.place, eviction.victims)
    result.claimants.add(job.job_id)
    _charge_if_limited(job, view)
    result.waiting[job.job_id] = Wait(
        "preempting",
        f"preempting {len(eviction.victims)} job(s) to make room: "
        + ", ".join(v.job_id for v in eviction.victims),
    )


def _charge_if_limited(job: PendingJob, view: View) -> None:
    """A claimant's queue (and user) hold its share for the rest of the plan where a max
    or a per-user limit bounds them: a later job taking what its victims gave back of
    the limit would leave the stops for nothing and the claimant over it. Where nothing
    bounds them the fair orders' ranks stay as the plan found them, and only reclaim
    counts the share (`View.claim_share`)."""
    spec = view.queue(job.queue)
    limited = spec.user_limit_factor is not None or any(
        view.queue(level).max is not None for level in lineage(job.queue)
    )
    if limited:
        view.charge(job.queue, job.user, job.request.resources())
    else:  # reclaim counts it still, or a second job of its queue reclaims past it
        view.claim_share(job.queue, job.request.resources())


def _unpinned(job: PendingJob, view: View) -> PendingJob:
    """A job pinned to a node (requeued to move or resize there) whose node is away or
    drained (or has lost GPUs it needs) runs wherever it fits, as any other: it resumes
    from a checkpoint on storage every node mounts, and the node may not come back. A
    node that is only full keeps it waiting there."""
    cap = view.capacity.get(job.request.node_id or "")
    if cap is not None and node_can_ever_fit(_placeable(cap.node), job.request) is None:
        return job
    request = interned(dataclasses.replace(job.request, node_id=None))
    return dataclasses.replace(job, request=request, resume_on=())


def _placeable(node: Node) -> Node:
    """The node less its GPUs out of placement (a drained node's, a faulty one's)."""
    return node if not node.out else dataclasses.replace(node, gpus=tuple(usable(node)))


# Per request, whether no node could ever run it: kept while the nodes are the same.
_never_fit = Kept[dict[Request, Wait | None]]()
_UNKNOWN = Wait("", "")  # not asked yet (None is an answer)
_NEVER_FIT_KEY = ("never_fit",)


def _never_fits(view: View, job: PendingJob) -> Wait | None:
    # Asked for every job: the answers for these nodes are found once a plan.
    known = cast("dict[Request, Wait | None] | None", view.memo.get(_NEVER_FIT_KEY))
    if known is None:
        snapshot = view.snapshot
        key = (snapshot.nodes, snapshot.multi_node, snapshot.largest_node_gpus)
        known = _never_fit.get(*key)
        if known is None:
            known = _never_fit.put({}, *key)
        view.memo[_NEVER_FIT_KEY] = known
    request = job.request
    wait = known.get(request, _UNKNOWN)
    if wait is _UNKNOWN:
        wait = known[request] = never_fits(view, job)
    return wait


def _runnable(view: View, job: PendingJob) -> PendingJob:
    """An elastic job that no node could ever run whole, as a job of the most GPUs of
    its range that could run (it starts smaller in any case: `_place_smaller`), so
    that it is neither refused as too large nor placed, reserved for or made room for
    at a count that can never be; the job itself where its whole count could run, or
    none could."""
    if _never_fits(view, job) is None:
        return job
    return next((s for s in _smaller(job) if _never_fits(view, s) is None), job)


def _smaller(job: PendingJob) -> Iterator[PendingJob]:
    """An elastic job as a job of each count of its range below its own, largest first."""
    assert job.gpu_range is not None
    r = job.request
    for gpus in range(r.gpus - 1, max(job.gpu_range[0], 1) - 1, -1):
        yield dataclasses.replace(job, request=interned(dataclasses.replace(r, gpus=gpus)))


def _place(stages: Stages, job: PendingJob, view: View) -> Placement | NoFit:
    # Whether reserved GPUs (and CPUs and memory) are open to this job depends on when
    # it would end.
    ends = view.ends(job) if view.reservations else None
    key = ("no_fit", job.request, ends)
    known = view.memo.get(key)
    if isinstance(known, NoFit):
        return known
    placed = stages.place(job, view)
    if isinstance(placed, NoFit):
        view.memo[key] = placed
    return placed


def _entitled(job: PendingJob, view: View) -> PendingJob | None:
    """An elastic job at the most GPUs of its range its queue's guarantee still covers,
    or None where even its least would borrow.

    Where jobs that do not fit are passed over ("skip"), an elastic job that does not
    fit whole first takes turns at its full count where it can (`_take_turns`). Then
    one its guarantee covers starts smaller at once, in its place, or makes room at the
    count covered (the GPUs are its queue's before a borrower's; a reclaim takes back no
    more than the guarantee). One that would only borrow is looked at again once every
    other pending job has been, to start smaller on the GPUs left (`_place_smaller`) or
    make room as any job: started smaller at once, it took the GPUs that smaller jobs
    behind it fit on, at counts (5, 6, 7 of 8) no waiting job takes turns with; on
    cluster03 the rigid jobs lost more than the elastic ones gained (docs/evaluation.md,
    "Grow/shrink on the ITP traces")."""
    assert job.gpu_range is not None
    held = view.allocated.get(job.queue, NOTHING).gpus
    covered = min(view.queue(job.queue).guarantee.gpus - held, job.request.gpus)
    if covered < max(job.gpu_range[0], 1):
        return None
    if covered == job.request.gpus:
        return job
    request = interned(dataclasses.replace(job.request, gpus=covered))
    return dataclasses.replace(job, request=request)


def _take_turns(stages: Stages, job: PendingJob, view: View) -> Eviction | None:
    """The first turn (time-slicing: an Eviction with `launch_on`) a make-room plugin
    offers the job at its full count, or None. A rigid job takes the first answer of
    the make-room plugins, a preemption included; an elastic job takes none here, even
    one offered before the turn: it takes a turn, or starts smaller, before it stops
    anybody (`_entitled`). Taking the first answer, as a rigid job does, cost
    `default-gandiva` 7% of cluster05's average JCT and 1.5% of cluster03's, for 1 to
    3% on two other traces (docs/evaluation.md, "Grow/shrink on the ITP traces")."""
    for make_room in stages.make_room:
        eviction = make_room(job, view, stages.place)
        if eviction is not None and eviction.launch_on is not None:
            return eviction
    return None


def _place_smaller(
    stages: Stages, job: PendingJob, view: View
) -> tuple[PendingJob, Placement] | None:
    """An elastic job that does not fit whole starts on the most GPUs of its range that
    fit (Gandiva's grow/shrink: it may grow later), as a job of that count."""
    for smaller in _smaller(job):
        placed = _place(stages, smaller, view)
        if isinstance(placed, Placement):
            return smaller, placed
    return None


# Admission's answers that a smaller count of an elastic job may not get.
_LIMITS = frozenset({"queue_max", "user_limit"})


def _admitted_smaller(stages: Stages, job: PendingJob, view: View) -> PendingJob | None:
    """An elastic job refused by a limit on what its queue or user may hold, as a job
    of the most GPUs of its range that admission takes (it may grow later), if any."""
    return next((s for s in _smaller(job) if _refused(stages, s, view) is None), None)


def _refused(stages: Stages, job: PendingJob, view: View) -> Wait | None:
    for admit in stages.admit:
        wait = admit(job, view)
        if wait is not None:
            return wait
    return None


def _make_room(
    stages: Stages, job: PendingJob, view: View, plugins: Sequence[MakeRoomFn] | None = None
) -> Eviction | None:
    """The first eviction the make-room plugins (or `plugins`) find for the job."""
    for make_room in stages.make_room if plugins is None else plugins:
        eviction = make_room(job, view, stages.place)
        if eviction is not None:
            return eviction
    return None


def _blocked(stages: Stages, job: PendingJob, view: View, nofit: NoFit, made: int) -> Wait:
    # NoFits are shared through the memo by every job of one request, and so is the
    # Wait that says it (kept with its NoFit, so that the id stays that object's).
    key = ("no_capacity", id(nofit))
    known = view.memo.get(key)
    if known is None:
        if needs_spreading(job, view):
            reason = nofit.describe_gang(job.request, view.free_gpu_count())
        else:
            reason = nofit.describe(job.request)
        known = view.memo[key] = (nofit, Wait("no_capacity", reason))
    wait: Wait = known[1]  # type: ignore[index]
    settings = stages.settings
    if stages.blocking != "backfill" or made >= settings.reservations:
        return wait
    if job.request.gpus < settings.reserve_min_gpus:
        return wait
    if settings.reserve_after_s > 0 and view.now - job.submitted_at < settings.reserve_after_s:
        return wait
    held = reservation_for(job, view)
    if held is None:
        return wait
    view.reserve(held)
    minutes = max(held.expected_start - view.now, 0.0) / 60
    return Wait(
        "reserved",
        f"{wait.reason}; GPUs reserved on {', '.join(held.node_ids[:4])}"
        f"{' and more' if len(held.node_ids) > 4 else ''}, expected to start in about"
        f" {minutes:.0f} min",
    )
