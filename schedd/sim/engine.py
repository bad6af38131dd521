"""The event-driven replay: a virtual clock, simulated nodes, and the profile's own `plan`.

At each instant (an arrival, a completion, the end of a preemption or of a move, or the
profile's periodic tick while jobs are pending or running, or the time the last plan said
it could come out otherwise: `Plan.recheck_at`) the engine takes every event due then,
builds a Snapshot exactly as the live scheduler would (the oldest `pending_window`
pending jobs in submission order), calls `plan`, and applies the Plan. A plan whose
changes its own view did not show (GPUs freed by a stop or a preemption, a kind
changed), or that launched from a full pending window, is followed by another at the
same instant, until one changes nothing (at most `max_rounds`). Gandiva's job controls
(Suspend, Resume, Migrate, Resize) are applied by controls.py, and its packing (a
`Resume` beside another job, a `Suspend` or `Resume` of a packed job) by packing.py;
which jobs are elastic, and how their work scales with their GPUs, is elastic.py's.

Views handed to the policy are kept between instants and rebuilt only where something
in them changed; the cost per instant is the policy's plus the jobs that hold GPUs.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import islice

from schedd.policy import Profile
from schedd.policy.actions import (
    AdmitDeadline,
    Launch,
    Migrate,
    Plan,
    Preempt,
    Reserve,
    Resize,
    Resume,
    SetKind,
    Stop,
    Suspend,
)
from schedd.policy.queues import QueueSpec
from schedd.policy.snapshot import (
    GUARANTEED,
    OPPORTUNISTIC,
    Node,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
)
from schedd.sim import controls, packing
from schedd.sim.cluster import build_nodes
from schedd.sim.elastic import check_fraction, gpu_range, rescaled
from schedd.sim.estimates import Estimates
from schedd.sim.jobs import (
    CANCELLED,
    FINISHED,
    MIGRATING,
    PACKED,
    PENDING,
    PREEMPTING,
    RUNNING,
    SUSPENDED,
    SimJob,
)
from schedd.sim.ledger import Ledger
from schedd.sim.locality import LocalityModel
from schedd.sim.outcome import SimResult, outcome_of
from schedd.sim.service_book import ServiceBook
from schedd.sim.shape import ClusterShape
from schedd.sim.sharing import SharingModel
from schedd.sim.traces import Trace
from schedd.sim.usage import DAY_S, UsageBook

# Holders that compute nothing: one moving, one stopped for the rest of its preemption.
_IDLE_HOLDERS = frozenset({MIGRATING, PREEMPTING})
_FINISH = 0
_PREEMPT_END = 1  # then controls.MIGRATE_END = 2: the order of events at one instant
# (time, kind, seq, job seq, token): the job's `timing` for a completion, its `attempt`
# for the end of a preemption or a move; an event whose token is no longer the job's is
# ignored.
Event = tuple[float, int, int, int, int]


class SimError(Exception):
    """The policy asked for something impossible (a GPU given twice, an unknown job)."""


@dataclass(frozen=True, slots=True)
class SimOptions:
    preempt_overhead_s: float = 0.0  # a preempted job holds its GPUs this long, idle
    checkpoint_interval_s: float | None = None  # None: a preemption loses no work
    half_life_s: float = DAY_S
    queues: tuple[QueueSpec, ...] = ()
    max_rounds: int = 64  # plans at one instant, at most
    suspend_overhead_s: float = 0.0  # a resumed job makes no progress this long
    # How long a move takes end to end (checkpoint, copy, restore), without progress,
    # both GPU sets held: an assumption (Gandiva's moves took seconds to under a minute).
    migrate_overhead_s: float = 30.0
    # How long a Resize (grow or shrink) takes: the restart from a checkpoint on the new
    # GPU set, without progress, both sets held; the same assumption as a move's.
    resize_overhead_s: float = 30.0
    sharing: SharingModel = field(default_factory=SharingModel)
    # The fraction of the jobs of more than one GPU that are elastic (elastic.py).
    elastic: float = 0.0
    # What packing two jobs on the same GPUs costs each beyond their compute (packing.py).
    pack_slowdown: float = 0.1

    def __post_init__(self) -> None:
        check_fraction(self.elastic)
        packing.check_slowdown(self.pack_slowdown)


class Simulation:
    def __init__(
        self,
        trace: Trace,
        shape: ClusterShape,
        profile: Profile,
        options: SimOptions | None = None,
        locality: LocalityModel | None = None,
    ) -> None:
        self.trace, self.shape, self.profile = trace, shape, profile
        self.options = options or SimOptions()
        self.locality = locality or LocalityModel()
        self.nodes = build_nodes(shape)
        self._rack = {n.node_id: n.labels.get("rack", "") for n in self.nodes}
        self._node: dict[str | None, Node] = {n.node_id: n for n in self.nodes}
        self._requests: dict[int, Request] = {}  # `request`
        sharing, elastic = self.options.sharing, self.options.elastic
        self.jobs = [
            SimJob(
                i,
                spec,
                self.request(spec.gpus),
                spec.duration_s,
                spec.gpus,
                utilization_pct=sharing.utilization(i),
                gpu_range=gpu_range(i, spec.gpus, elastic),
            )
            for i, spec in enumerate(trace.jobs)
        ]
        self.by_id = {job.spec.job_id: job for job in self.jobs}
        start = trace.jobs[0].submit_s if trace.jobs else 0.0
        self.ledger = Ledger(start, self.options.queues)
        self.usage = UsageBook(self.options.half_life_s)
        self.estimates = Estimates(profile.estimates)
        self.service = ServiceBook()
        self.gpu_owner: dict[str, SimJob] = {}  # the guaranteed holder
        self.gpu_sharer: dict[str, SimJob] = {}  # the opportunistic one
        self.gpu_packed: dict[str, SimJob] = {}  # a job packed beside the holder (packing.py)
        self.pending: dict[int, SimJob] = {}  # by seq; sorted by seq when `_unsorted`
        # Running, preempting, suspended, migrating or packed.
        self.holding: dict[int, SimJob] = {}
        self.events: list[Event] = []
        self._event_seq = 0
        self._next_arrival = 0
        self._unsorted = False
        self._pending_view: tuple[PendingJob, ...] | None = None
        self._placed_view: tuple[float, tuple[PlacedJob, ...]] | None = None
        self._tick_origin = start
        self._recheck_at: float | None = None  # the last plan's Plan.recheck_at
        self._changed = False  # whether the last instant's plans changed anything
        self._claimants: frozenset[str] = frozenset()  # the last plan's Plan.claimants
        self._planned_before: float | None = None  # the instant of the last plan
        # Actions whose effect a plan at the same instant already saw (_worth_replanning):
        # deadline answers were already in the plan's view, and so were the GPUs its
        # suspensions freed (a policy's view frees them at once, unlike a preemption's)
        # and its moves took; a move frees its GPUs at its end, an event (at once: new).
        settled: tuple[type, ...] = (Launch, Reserve, AdmitDeadline, Suspend, Resume)
        if self.options.migrate_overhead_s > 0:
            settled = (*settled, Migrate)
        if self.options.resize_overhead_s > 0:  # a shrink frees GPUs at its end, an event
            settled = (*settled, Resize)
        self._settled = settled

    # ---- the loop -----------------------------------------------------------------

    def run(self) -> SimResult:
        began = time.perf_counter()
        tick: float | None = None
        while True:
            now = self._next_instant(tick)
            if now is None:
                break
            self.ledger.advance(now)
            self._take_events(now)
            self._take_arrivals(now)
            self._plan_until_quiet(now)
            self.ledger.close_instant()
            tick = self._next_tick(now)
        end = self.ledger.now
        for job in list(self.holding.values()):  # only if the run was cut short
            self._release(job, end)
        return SimResult(
            policy=self.profile.name,
            shape=self.shape,
            trace=self.trace,
            start_s=self.ledger.start_s,
            end_s=end,
            jobs=tuple(outcome_of(job) for job in self.jobs),
            ledger=self.ledger,
            queue_specs=self.options.queues,
            wall_s=time.perf_counter() - began,
        )

    def _next_instant(self, tick: float | None) -> float | None:
        self._drop_superseded()
        candidates = []
        if self.events:
            candidates.append(self.events[0][0])
        if self._next_arrival < len(self.jobs):
            candidates.append(self.jobs[self._next_arrival].spec.submit_s)
        if not candidates and not self._changed:
            # Nothing runs and nothing arrives: what is left starts only where a plan
            # decides so with time alone (a suspended job resumed, a wait over). The
            # policy is asked again when its last plan asked to be (`recheck_at`), or
            # at its tick, while its last instant changed anything (with a job
            # suspended, at `recheck_at` in any case): not again and again on nothing.
            if not self._any_suspended():
                return None
            tick = None
        if tick is not None:
            candidates.append(tick)
        if self._recheck_at is not None:
            candidates.append(self._recheck_at)
        return min(candidates) if candidates else None

    def _drop_superseded(self) -> None:
        """Drop the events at the head of the queue that no longer happen: a completion
        planned again since (the job stopped, or sped up or slowed down), or the end of
        a preemption or move of an earlier attempt. No event reaches the live scheduler
        at their time, so no plan is made there: a replay plans when the live system
        would, and an instant with nothing in it would cost a plan for nothing."""
        events = self.events
        while events and not self._still_due(events[0]):
            heapq.heappop(events)

    def _still_due(self, event: Event) -> bool:
        """Whether the event still happens: a completion not planned again since (the
        job neither stopped nor sped up or slowed), the end of the job's attempt now."""
        _, kind, _, seq, token = event
        job = self.jobs[seq]
        return (job.timing if kind == _FINISH else job.attempt) == token

    def _any_suspended(self) -> bool:
        return any(job.state == SUSPENDED for job in self.holding.values())

    def _next_tick(self, now: float) -> float | None:
        every = self.profile.tick_s
        if not every or not (self.pending or self.holding):
            return None
        passed = math.floor((now - self._tick_origin) / every) + 1
        return self._tick_origin + passed * every

    def _take_events(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            event = heapq.heappop(self.events)
            if not self._still_due(event):  # superseded by an event earlier this instant
                continue
            _, kind, _, seq, _ = event
            job = self.jobs[seq]
            if kind == _FINISH:
                self._finish(job, now)
            elif kind == _PREEMPT_END:
                self._end_preemption(job, now)
            else:
                controls.end_migration(self, job, now)

    def _take_arrivals(self, now: float) -> None:
        jobs = self.jobs
        while self._next_arrival < len(jobs) and jobs[self._next_arrival].spec.submit_s <= now:
            self._enqueue(jobs[self._next_arrival])
            self._next_arrival += 1

    def _plan_until_quiet(self, now: float) -> None:
        plan = Plan()
        self._changed = False
        for _ in range(self.options.max_rounds):
            snapshot = self.snapshot(now)
            plan = self.profile.plan(snapshot, now)
            self._planned_before = now
            self.ledger.plan_calls += 1
            changed = self._apply(plan, now)
            self._changed |= changed
            if not changed or not self._worth_replanning(plan, snapshot):
                break
        else:
            self.ledger.replan_cap_hits += 1
        self.ledger.planned(plan)
        recheck = plan.recheck_at
        self._recheck_at = recheck if recheck is not None and recheck > now else None

    def _worth_replanning(self, plan: Plan, snapshot: Snapshot) -> bool:
        """Whether a plan at the same instant could decide more. A plan that only
        launched (suspended or resumed) already filled what its view offered, and its
        view was the cluster as it now is; GPUs freed by stops or preemptions, jobs
        behind a full pending window, or a packed job whose partner the plan suspended
        (its GPUs are its own to take), are new to the next one."""
        if len(snapshot.pending) >= self.profile.pending_window:
            return True
        if any(u not in self.gpu_owner for u in self.gpu_packed):
            return True  # a packed job's partner left: it may take its GPUs now
        settled = self._settled  # made in __init__, from the options
        return any(not isinstance(a, settled) for a in plan.actions)

    # ---- what the policy sees -------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        return Snapshot(
            nodes=self.nodes,
            placed=self._placed(now),
            pending=self._pending_window(),
            queues=self.options.queues,
            usage=self.usage.at(now),
            multi_node=True,
            service_history=self.service.history,
            claimants=self._claimants,
            planned_before=self._planned_before,
        )

    def _pending_window(self) -> tuple[PendingJob, ...]:
        if self._pending_view is None:
            if self._unsorted:
                self.pending = dict(sorted(self.pending.items()))
                self._unsorted = False
            window = self.profile.pending_window
            view = [self._pending_job(job) for job in islice(self.pending.values(), window)]
            if self._claimants and len(self.pending) > window:
                view += [self._pending_job(job) for job in self._claimants_beyond(view)]
            self._pending_view = tuple(view)
        return self._pending_view

    def _claimants_beyond(self, window: list[PendingJob]) -> list[SimJob]:
        """The claimants still pending behind the window, in submission order: the
        GPUs on their way out are theirs, whatever requeued jobs came before them."""
        inside = {j.job_id for j in window}
        beyond = (self.by_id[c] for c in self._claimants if c not in inside)
        return sorted((j for j in beyond if j.state == PENDING), key=lambda j: j.seq)

    def _pending_job(self, job: SimJob) -> PendingJob:
        version = self.estimates.version(job.spec)
        if job.pending_view is None or job.pending_view_version != version:
            spec = job.spec
            job.pending_view = PendingJob(
                job_id=spec.job_id,
                user=spec.user,
                queue=spec.queue,
                priority=0,
                kind=job.kind,
                request=job.request,
                submitted_at=spec.submit_s,
                name=spec.name,
                estimate_s=self.estimates.of(spec),
                attained_s=job.attained_gpu_s,
                deadline=spec.deadline_s,
                deadline_admitted=job.deadline_admitted,
                gpu_range=job.gpu_range,
            )
            job.pending_view_version = version
        return job.pending_view

    def _placed(self, now: float) -> tuple[PlacedJob, ...]:
        """The jobs that hold GPUs, as the policy sees them. Their service is counted as
        of the attempt's start (`PlacedJob.attained_as_of`), so the tuple stays the same
        object from one instant to the next until a job starts or stops (and the
        policy's work on it can be reused), unless checkpoints are modelled: then each
        running job's last checkpoint moves with time. A packed job's view is made
        again at each instant (the policy counts service since `attained_as_of` for
        running jobs only)."""
        every = self.options.checkpoint_interval_s
        cached = self._placed_view
        if cached is not None and (cached[0] == now or (every is None and not self.gpu_packed)):
            return cached[1]
        views = []
        for job in self.holding.values():
            view = job.placed_view
            if view is None or job.state == PACKED or (every is not None and job.state == RUNNING):
                view = self._placed_job(job, now, every)
            views.append(view)
        placed = tuple(views)
        self._placed_view = (now, placed)
        return placed

    def _placed_job(self, job: SimJob, now: float, every: float | None) -> PlacedJob:
        """The job as the policy sees it at `now`. A running job's service is given as
        of the start of its run segment (its launch or last resume); a preempting or
        suspended job's figures are final.

        Without checkpoints modelled, `checkpointed_at` is None, as the live scheduler
        says it (the policy then counts the work since the start as at risk), although
        the simulated preemption loses nothing. With them, a run segment starts from a
        saved state (a suspension's is counted as saved), and a suspended or migrating
        job's is its suspension or the start of its move.

        A packed job's service is given as of now (its view is made at each instant),
        its checkpoints as a running job's. A running or packed job's `progress_ratio`
        is its speed against its speed alone, locality aside (sharing and packing); any
        other job's is None."""
        started = job.started_at
        assert started is not None
        checkpoint, as_of, ratio = None, None, None
        attained = job.attained_gpu_s
        if job.state in (RUNNING, PACKED):
            ratio = job.share_speed * job.pack_speed
            if job.state == RUNNING:
                as_of = started
            else:
                attained += job.gpus * (now - started)
            if every is not None:
                checkpoint = started + math.floor((now - started) / every) * every
        elif job.state in (SUSPENDED, MIGRATING) and every is not None:
            checkpoint = job.placed_fields["state_since"]
        view = PlacedJob(
            **job.placed_fields,
            attained_s=attained,
            checkpointed_at=checkpoint,
            attained_as_of=as_of,
            progress_ratio=ratio,
        )
        job.placed_view = view
        return view

    def _views_changed(self) -> None:
        self._pending_view = None

    def _show(self, job: SimJob, **fields: object) -> None:
        """The policy's view of the job changes."""
        job.placed_fields = {**job.placed_fields, **fields}
        job.placed_view = None
        self._placed_view = None

    # ---- applying a plan -------------------------------------------------------------

    def _apply(self, plan: Plan, now: float) -> bool:
        """Apply stops, preemptions, suspensions, migrations and resizes first (they free
        GPUs, or take the ones their plan saw free), then resumes, then launches; True
        when anything changed."""
        changed = False
        resumes: list[Resume] = []
        launches: list[Launch] = []
        for action in plan.actions:
            if isinstance(action, Launch):
                launches.append(action)
            elif isinstance(action, Resume):
                resumes.append(action)
            elif isinstance(action, Preempt):
                changed |= self._preempt(action, now)
            elif isinstance(action, Stop):
                changed |= self._stop(action, now)
            elif isinstance(action, Suspend):
                changed |= self._suspend(action, now)
            elif isinstance(action, Migrate):
                changed |= controls.migrate(self, action, now)
            elif isinstance(action, Resize):
                changed |= controls.resize(self, action, now)
            elif isinstance(action, Reserve):
                self.ledger.actions["Reserve"] += 1
            elif isinstance(action, AdmitDeadline):
                changed |= self._admit_deadline(action)
            elif isinstance(action, SetKind):
                changed |= self._set_kind(action, now)
            else:
                self.ledger.unsupported[type(action).__name__] += 1
        for resume in resumes:
            changed |= self._resume(resume, now)
        for launch in launches:
            changed |= self._launch(launch, now)
        # Kept for the next plans, in place of the last plan's (a plan names all it
        # holds). They move no GPU: not a change to plan again for.
        if plan.claimants != self._claimants:
            self._claimants = frozenset(plan.claimants)
            if len(self.pending) > self.profile.pending_window:
                self._views_changed()  # a claimant may be behind the window
        return changed

    def _suspend(self, action: Suspend, now: float) -> bool:
        job = self._job(action.job_id, "Suspend")
        if job.state == PACKED:
            return packing.unpack(self, job, now)
        return controls.suspend(self, action, now)

    def _resume(self, action: Resume, now: float) -> bool:
        if action.beside is not None:
            return packing.pack(self, action, now)
        job = self._job(action.job_id, "Resume")
        if job.state == PACKED:
            return packing.take_over(self, job, now)
        return controls.resume(self, action, now)

    def _job(self, job_id: str, action: str) -> SimJob:
        job = self.by_id.get(job_id)
        if job is None:
            raise self.policy_error(f"{action} of unknown job {job_id!r}")
        return job

    def policy_error(self, message: str) -> SimError:
        return SimError(f"policy {self.profile.name}: {message}")

    def node(self, node_id: str | None) -> Node | None:
        return self._node.get(node_id)

    def request(self, gpus: int) -> Request:
        """One Request object per GPU count (the policy's memo keys on requests)."""
        known = self._requests.get(gpus)
        if known is None:
            known = self._requests[gpus] = Request(gpus, 0.0, 0)
        return known

    def _launch(self, launch: Launch, now: float) -> bool:
        job = self._job(launch.job_id, "Launch")
        if job.state != PENDING:
            raise self.policy_error(f"Launch of job {job.spec.job_id}, which is {job.state}")
        uuids = launch.gpu_uuids
        gpus = len(uuids)
        least, most = job.gpu_range or (job.spec.gpus, job.spec.gpus)
        if not least <= gpus <= most or len(set(uuids)) != gpus:
            asks = f"{least} to {most}" if least < most else f"{most}"
            raise self.policy_error(
                f"Launch of job {job.spec.job_id} names {gpus} GPUs "
                f"({len(set(uuids))} distinct); it asks for {asks}"
            )
        if not self._gpus_free(job, uuids, "launch"):
            return False
        self._dequeue(job)
        job.state = RUNNING
        job.shards = launch.shards
        job.remaining_s = rescaled(job.remaining_s, job.gpus, gpus)  # the work is GPU-s
        job.gpus = gpus
        job.started_at = job.held_since = job.progress_at = now
        job.remaining_at_start = job.remaining_s
        job.checkpoint_remaining = None
        if job.first_started_at is None:
            job.first_started_at = now
        job.attempt += 1
        job.locality_speed = self._locality_speed(job, launch.shards, gpus)
        job.placed_fields = {
            "job_id": job.spec.job_id,
            "user": job.spec.user,
            "queue": job.spec.queue,
            "shards": job.shards,
            "request": self.request(gpus),
            "state": RUNNING,
            "started_at": now,
            "estimate_s": self.estimates.of(job.spec),
            "deadline": job.spec.deadline_s,
            "deadline_admitted": job.deadline_admitted,
            "kind": job.kind,
            "utilization_pct": job.utilization_pct,
            "gpu_range": job.gpu_range,
        }
        self._hold(job, now)
        self.ledger.actions["Launch"] += 1
        return True

    def _locality_speed(self, job: SimJob, shards: tuple[Shard, ...], gpus: int) -> float:
        """The job's speed on `gpus` GPUs across `shards`, as their nodes and racks span."""
        nodes = {s.node_id for s in shards}
        racks = {self._rack[n] for n in nodes}
        return self.locality.speed(job.spec.name, gpus, len(nodes), len(racks))

    def _gpus_free(self, job: SimJob, uuids: tuple[str, ...] | list[str], verb: str) -> bool:
        """Whether `job` may take `uuids` as their holder of its kind: False (refused and
        counted) where a preemption or a move away still frees one; a SimError where
        another job holds one (the policy gave a GPU twice), or where a guaranteed job
        would take GPUs another job runs on packed (its partner gone: the policy
        resumes it as their holder before it launches anything)."""
        holders = self._holders(job.kind)
        for uuid in uuids:
            holder = holders.get(uuid)
            if holder is None:
                packed = self.gpu_packed.get(uuid)
                if packed is not None and packed is not job and job.kind != OPPORTUNISTIC:
                    raise self.policy_error(
                        f"{verb.capitalize()} of job {job.spec.job_id} on GPU {uuid}, where"
                        f" job {packed.spec.job_id} runs packed (its partner gone, it is to"
                        " be resumed as their holder first)"
                    )
                continue
            if holder.state == PREEMPTING or (
                holder.state == MIGRATING and all(uuid not in s.gpu_uuids for s in holder.moving_to)
            ):
                # Room made by a preemption or a move still under way: free later.
                self.ledger.refused[f"{verb} on GPUs still being freed"] += 1
                return False
            raise self.policy_error(
                f"{verb.capitalize()} of {job.kind} job {job.spec.job_id} on GPU {uuid},"
                f" which {holder.kind} job {holder.spec.job_id} holds"
            )
        return True

    def _preempt(self, preempt: Preempt, now: float) -> bool:
        job = self._job(preempt.job_id, "Preempt")
        if job.state != RUNNING:
            self.ledger.refused[f"preempt of a {job.state} job"] += 1
            return False
        # Stopped, it computes nothing more, though it holds its GPUs for the overhead:
        # those beside it on them (a sharer, a packed job) speed up, and the GPUs count
        # as idle.
        with self.gpus_change(self._uuids(job), now):
            self._stop_running(job, now)
        job.preemptions += 1
        self.ledger.actions["Preempt"] += 1
        if not preempt.requeue:
            self._release(job, now)
            self._end(job, CANCELLED, now)
            return True
        overhead = self.options.preempt_overhead_s
        if overhead > 0:
            job.state = PREEMPTING
            self._show(job, state=PREEMPTING)
            self._at(now + overhead, _PREEMPT_END, job)
        else:
            self._release(job, now)
            self._enqueue(job)
        return True

    def _admit_deadline(self, admit: AdmitDeadline) -> bool:
        job = self._job(admit.job_id, "AdmitDeadline")
        if job.spec.deadline_s is None:
            raise self.policy_error(
                f"AdmitDeadline of job {job.spec.job_id}, which has no deadline"
            )
        if job.deadline_admitted == admit.admitted:
            return False
        job.deadline_admitted = admit.admitted
        self.ledger.actions["AdmitDeadline" if admit.admitted else "RefuseDeadline"] += 1
        # Both views of the job carry the answer: build them again.
        job.pending_view = None
        self._pending_view = None
        if job.placed_fields:
            self._show(job, deadline_admitted=admit.admitted)
        return True

    def _stop(self, stop: Stop, now: float) -> bool:
        job = self._job(stop.job_id, "Stop")
        if job.state == PENDING:
            self._dequeue(job)
            self._end(job, CANCELLED, now)
        elif job.state in (RUNNING, PACKED):
            with self._packing_changes(job, now):
                self._stop_running(job, now)
            self._release(job, now)
            self._end(job, CANCELLED, now)
        elif job.state == SUSPENDED:
            self._release(job, now)
            self._end(job, CANCELLED, now)
        elif job.state in (PREEMPTING, MIGRATING) and not job.cancel_when_freed:
            job.cancel_when_freed = True
        else:
            self.ledger.refused[f"stop of a {job.state} job"] += 1
            return False
        self.ledger.actions["Stop"] += 1
        return True

    # ---- state changes -------------------------------------------------------------

    def _at(self, when: float, kind: int, job: SimJob) -> None:
        self._event_seq += 1
        token = job.timing if kind == _FINISH else job.attempt
        heapq.heappush(self.events, (when, kind, self._event_seq, job.seq, token))

    def _enqueue(self, job: SimJob) -> None:
        job.state = PENDING
        if self.pending and job.seq < next(reversed(self.pending)):
            self._unsorted = True  # a requeued job goes back to its place in the queue
        self.pending[job.seq] = job
        self.ledger.pending_changed(job, +1)
        self._views_changed()

    def _dequeue(self, job: SimJob) -> None:
        del self.pending[job.seq]
        self.ledger.pending_changed(job, -1)
        self._views_changed()

    def _hold(self, job: SimJob, now: float) -> None:
        """The launched or resumed job takes its GPUs (as their holder of its kind, or,
        packed, in the packed slot) and starts its clock; a job it now shares GPUs with
        changes speed."""
        uuids = self._uuids(job)
        with self.gpus_change(uuids, now):
            holders = self.gpu_packed if job.state == PACKED else self._holders(job.kind)
            for uuid in uuids:
                holders[uuid] = job
        self.holding[job.seq] = job
        self._placed_view = None
        self.ledger.hold(job)
        self.usage.change(job.spec.queue, job.spec.user, job.gpus, now)

    def _release(self, job: SimJob, now: float) -> None:
        """The job gives up what it holds, for good (a migrating job both GPU sets)."""
        if job.state == SUSPENDED:
            job.shards = ()  # its GPUs, their ledger and its usage went at the suspension
        else:
            uuids = self._uuids(job)
            with self.gpus_change(uuids, now):
                packed = bool(uuids) and self.gpu_packed.get(uuids[0]) is job
                holders = self.gpu_packed if packed else self._holders(job.kind)
                for uuid in uuids:
                    del holders[uuid]
                job.shards, job.moving_to = (), ()
            self.ledger.release(job, now)
            if job.state in (RUNNING, MIGRATING, PACKED):  # a preempted job's usage ended
                self.usage.change(job.spec.queue, job.spec.user, -job.gpus, now)
        del self.holding[job.seq]
        self._placed_view = None
        job.held_since, job.placed_view = None, None

    def _stop_running(self, job: SimJob, now: float) -> None:
        """Close the current attempt: count its service (of its run segment since its
        launch or last resume), keep the work that survives."""
        assert job.started_at is not None and job.progress_at is not None
        ran = now - job.started_at  # the segment's length, counted by `count_run`
        kept = ran
        every = self.options.checkpoint_interval_s
        if every is not None:
            kept = math.floor(ran / every) * every  # work since the last checkpoint is lost
        saved = job.started_at + kept  # the work done up to here survives
        if saved >= job.progress_at:
            # Exact where the speed never changed: progress_at - started_at is 0 then.
            job.remaining_s -= (kept - (job.progress_at - job.started_at)) * job.speed
        elif kept > 0 and job.checkpoint_remaining and job.checkpoint_remaining[0] == saved:
            # The checkpoint came before the last change of speed: as it was then.
            job.remaining_s = job.checkpoint_remaining[1]
        else:  # no checkpoint kept (or its time rounded otherwise): from the start
            job.remaining_s = job.remaining_at_start
        job.remaining_s = max(0.0, job.remaining_s)
        job.count_slowdown(now)  # lost work or not, it ran so
        job.progress_at = None
        job.count_run(now)
        job.attempt += 1  # its completion event is void now
        job.timing += 1
        job.pending_view = None
        self.usage.change(job.spec.queue, job.spec.user, -job.gpus, now)
        job.state = PREEMPTING  # not RUNNING: _release must not charge usage again
        job.pack_speed = 1.0  # computes nothing more: not packed with anyone (`_busy`)

    def _packing_changes(self, job: SimJob, now: float) -> AbstractContextManager[None]:
        """Around a change of the job's state where a job is packed on its GPUs (or it
        is packed itself): the pair's speeds and utilisation change with it, though
        nobody leaves the GPUs yet (a preemption's overhead)."""
        uuids = self._uuids(job)
        if any(u in self.gpu_packed for u in uuids):
            return self.gpus_change(uuids, now)
        return nullcontext()

    def _finish(self, job: SimJob, now: float) -> None:
        if job.progress_at is not None:
            job.count_slowdown(now)
        job.count_run(now)
        job.remaining_s = 0.0
        self._release(job, now)
        self._end(job, FINISHED, now)
        self.estimates.finished(job.spec, job.run_time_s)
        self.service.finished(job.attained_gpu_s, lambda: self._service_so_far(now))
        if self.estimates.changes_over_time:
            self._views_changed()

    def _service_so_far(self, now: float) -> Iterator[float]:
        """GPU-seconds received by every job that holds GPUs (or is suspended), or
        waits after a preemption."""
        for job in self.holding.values():
            running = job.state in (RUNNING, PACKED) and job.started_at is not None
            ran = now - job.started_at if running else 0.0  # type: ignore[operator]
            yield job.attained_gpu_s + job.gpus * ran
        for job in self.pending.values():
            yield job.attained_gpu_s

    def _end_preemption(self, job: SimJob, now: float) -> None:
        self._release(job, now)
        if job.cancel_when_freed:
            self._end(job, CANCELLED, now)
        else:
            self._enqueue(job)

    def _end(self, job: SimJob, state: str, now: float) -> None:
        job.state = state
        job.ended_at = now
        if state == FINISHED:
            job.finished_at = now

    # ---- GPU sharing (sharing.py) --------------------------------------------------

    def _holders(self, kind: str) -> dict[str, SimJob]:
        return self.gpu_sharer if kind == OPPORTUNISTIC else self.gpu_owner

    def _move_holders(
        self,
        job: SimJob,
        uuids: list[str],
        src: dict[str, SimJob],
        dst: dict[str, SimJob],
        now: float,
    ) -> None:
        """The job holds `uuids` in the `dst` slot instead of `src` (a change of kind, a
        packed job that takes its GPUs over)."""
        with self.gpus_change(uuids, now):
            for uuid in uuids:
                del src[uuid]
                dst[uuid] = job

    @staticmethod
    def _uuids(job: SimJob) -> list[str]:
        """The GPUs the job holds (or, suspended, resumes on): a migrating job's both sets
        (a resizing one's own GPUs once, those it keeps among them)."""
        uuids = [u for s in job.shards for u in s.gpu_uuids]
        if job.moving_to:
            own = set(uuids)
            uuids += [u for s in job.moving_to for u in s.gpu_uuids if u not in own]
        return uuids

    @contextmanager
    def gpus_change(self, uuids: list[str], now: float) -> Iterator[None]:
        """Around a change of holders on `uuids`: every running (or packed) job there
        (the one that comes included) is timed again at its new speed, and the GPUs
        allocated and their compute utilisation are counted again. Every change of what
        `_busy` reads (holders, a migrating state, speeds) happens inside one: the
        ledger's figure is the difference."""
        jobs = self._on(uuids)
        touched = {*uuids, *(u for j in jobs for u in self._uuids(j))}
        busy_before, held_before = self._busy(touched), self._held(uuids)
        yield
        jobs |= self._on(uuids)
        for job in jobs:
            if job.state in (RUNNING, PACKED) and job.shards:  # not the one leaving
                self._retime(job, now)
        self.ledger.occupy(self._held(uuids) - held_before, self._busy(touched) - busy_before)

    def _held(self, uuids: list[str]) -> int:
        """GPUs held by anyone (a GPU two or three jobs share counts once)."""
        owner, sharer, packed = self.gpu_owner, self.gpu_sharer, self.gpu_packed
        return sum(1 for u in uuids if u in owner or u in sharer or u in packed)

    def _on(self, uuids: list[str]) -> set[SimJob]:
        owner, sharer, packed = self.gpu_owner, self.gpu_sharer, self.gpu_packed
        return {j for u in uuids for j in (owner.get(u), sharer.get(u), packed.get(u)) if j}

    def _busy(self, uuids: set[str]) -> float:
        """The GPUs' compute utilisation summed, in percent; a migrating job uses none;
        a packed pair the two jobs' work (each utilisation times its packing speed)."""
        total = 0.0
        for uuid in uuids:
            owner, sharer = self._computing(uuid)
            pct = owner.utilization_pct * owner.pack_speed if owner is not None else 0.0
            packed = self.gpu_packed.get(uuid)
            if packed is not None:
                pct += packed.utilization_pct * packed.pack_speed
            if sharer is not None:
                pct += sharer.utilization_pct * sharer.share_speed
            total += min(pct, 100.0)
        return total

    def _used_beside(self, uuid: str) -> int | None:
        """What an opportunistic job finds used of the GPU by the guaranteed jobs that
        compute there (its holder, and a job packed beside it), at most 100 %; None:
        none does."""
        owner = self._computing(uuid)[0]
        packed = self.gpu_packed.get(uuid)
        if packed is not None and packed.state != PACKED:
            packed = None
        if owner is None and packed is None:
            return None
        used = sum(j.utilization_pct for j in (owner, packed) if j is not None)
        return min(used, 100)

    def _computing(self, uuid: str) -> tuple[SimJob | None, SimJob | None]:
        """The GPU's guaranteed and opportunistic holders, but for one that is moving or
        being preempted (it runs nothing meanwhile: nobody is slowed by it)."""
        owner, sharer = self.gpu_owner.get(uuid), self.gpu_sharer.get(uuid)
        if owner is not None and owner.state in _IDLE_HOLDERS:
            owner = None
        if sharer is not None and sharer.state in _IDLE_HOLDERS:
            sharer = None
        return owner, sharer

    def _retime(self, job: SimJob, now: float) -> None:
        """Bring the job's remaining work up to now at its old speed, and plan its
        completion at its new one (none while it makes no progress). Before a resume's
        overhead is over, `progress_at` lies ahead: no work done yet, and the completion
        counts from then."""
        assert job.progress_at is not None and job.started_at is not None
        every = self.options.checkpoint_interval_s
        if every is not None:  # keep the last checkpoint since the last change
            at = job.started_at + math.floor((now - job.started_at) / every) * every
            if at > job.progress_at:
                left = job.remaining_s - (at - job.progress_at) * job.speed
                job.checkpoint_remaining = (at, max(0.0, left))
        job.progress_to(now)
        job.progress_at = max(now, job.progress_at)
        model = self.options.sharing
        uuids = self._uuids(job)
        ratio = job.share_speed * job.pack_speed
        if job.kind == OPPORTUNISTIC:
            owners = [used for u in uuids if (used := self._used_beside(u)) is not None]
            job.share_speed = model.opportunistic_speed(max(owners) if owners else None)
        else:
            sharers = (self.gpu_sharer.get(u) for u in uuids)
            shared = any(o is not None and o.state not in _IDLE_HOLDERS for o in sharers)
            job.share_speed = model.guaranteed_speed(shared)
            job.pack_speed = packing.pair_speed(self, uuids)
        job.speed = job.locality_speed * job.share_speed * job.pack_speed
        if job.share_speed * job.pack_speed != ratio:  # its view's progress_ratio
            job.placed_view = None
            self._placed_view = None
        job.timing += 1
        if job.speed > 0:
            self._at(job.progress_at + job.remaining_s / job.speed, _FINISH, job)

    def _set_kind(self, action: SetKind, now: float) -> bool:
        job = self._job(action.job_id, "SetKind")
        if action.kind not in (GUARANTEED, OPPORTUNISTIC):
            raise self.policy_error(f"SetKind to {action.kind!r}")
        if job.kind == action.kind:
            return False
        if job.state == PENDING:
            job.kind = action.kind
            job.pending_view = None
            self._views_changed()
        elif job.state == RUNNING and action.kind == GUARANTEED:
            uuids = self._uuids(job)
            if any(u in self.gpu_owner for u in uuids):
                self.ledger.refused["upgrade on GPUs a guaranteed job holds"] += 1
                return False
            job.kind = GUARANTEED  # before `gpus_change`, which reads it only as it ends
            self._move_holders(job, uuids, self.gpu_sharer, self.gpu_owner, now)
            self._show(job, kind=GUARANTEED)
        else:
            self.ledger.refused[f"SetKind {action.kind} of a {job.state} {job.kind} job"] += 1
            return False
        self.ledger.actions[f"SetKind {action.kind}"] += 1
        return True
