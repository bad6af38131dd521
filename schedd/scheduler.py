"""The event loop around the pure policy: wake on an event, snapshot, plan, act.

Events (a submission, an exit, a cancel, a node joining or leaving) call `wake()`;
wakes that arrive while a cycle runs fold into one more cycle. A profile with `tick_s`
also plans that often while jobs are pending or running (its order changes with time).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import asyncpg

from schedd import job_controls, policy_config
from schedd.cached_read import CachedRead
from schedd.collector import collector_paused
from schedd.estimator.examples import example
from schedd.estimator.features import of_row
from schedd.estimator.forest import TRAIN_ON_JOBS, Estimator, memory_mib
from schedd.executor import Executor
from schedd.hub import Hub
from schedd.policy.actions import (
    Action,
    AdmitDeadline,
    Launch,
    Migrate,
    Plan,
    Preempt,
    Reserve,
    Resize,
    Resume,
    SetKind,
    Suspend,
    Wait,
)
from schedd.policy.framework import NO_NODES, NO_SHAREABLE_GPU
from schedd.policy.gittins import ServiceHistory
from schedd.policy.kept import forget_all
from schedd.policy.queues import lineage
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    MIGRATING,
    PACKED,
    SUSPENDED,
    Gpu,
    Node,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
    Usage,
    interned,
)
from schedd.store import jobs
from shared import logging
from shared.config import SchedConfig
from shared.model import JobKind, JobState

log = logging.get("scheduler")

# Above this many pending jobs the plan runs in a worker thread, so that a long plan
# does not hold the event loop (websocket pings, API requests) for its whole length.
PLAN_IN_THREAD_ABOVE = 2000
DB_PAUSE_S = 1.0  # after a cycle the database failed: it is back soon, or the next one fails
# After a cycle that failed by a fault of the scheduler's own: doubled while it lasts.
FAULT_PAUSE_FIRST_S = 1.0
FAULT_PAUSE_MOST_S = 60.0
PREDICT_IN_THREAD_ABOVE = 100  # about 2 ms of the forest's time
USAGE_CACHE_S = 5.0  # decayed usage moves slowly: read it again at most this often
RUNS_PRUNE_EVERY_S = 3600.0  # the runs past the usage horizon are deleted this often
# The distribution of run times the Gittins policies learn: it moves as jobs end.
SERVICE_CACHE_S = 30.0
ESTIMATE_CACHE_S = 30.0  # history estimates change only as jobs of that name succeed
ESTIMATE_CACHE_MAX = 100_000
# GPU samples wake a profile that packs at most this often while jobs take turns.
PACK_SAMPLE_WAKE_S = 30.0
# A plan's recheck time is never sooner than this from now: no busy loop on a clock edge.
RECHECK_FLOOR_S = 0.05


@dataclass(frozen=True, slots=True)
class Cycle:
    """What the last planning cycle saw and decided, for the API."""

    at: float
    pending: tuple[PendingJob, ...]
    plan: Plan
    # The plan's waits, and those of the jobs whose launch was skipped (`not_started`).
    waiting: dict[str, Wait]

    def wait_counts(self) -> dict[str, int]:
        """Pending jobs counted by the reason they wait, as Nomad counts placement failures."""
        return dict(Counter(w.code for w in self.waiting.values()))

    def waiting_by_queue(self) -> dict[str, Counter[str]]:
        """Wait codes counted per queue, a job counting in its queue's ancestors too."""
        queue_of = {j.job_id: j.queue for j in self.pending}
        out: dict[str, Counter[str]] = {}
        for job_id, wait in self.waiting.items():
            queue = queue_of.get(job_id)
            if queue is not None:
                for q in lineage(queue):
                    out.setdefault(q, Counter())[wait.code] += 1
        return out


class Scheduler:
    def __init__(
        self, pool: asyncpg.Pool, hub: Hub, executor: Executor, config: SchedConfig
    ) -> None:
        self.pool = pool
        self.hub = hub
        self.executor = executor
        self.profile = policy_config.active_profile(config)
        self.settings = self.profile.spec.settings if self.profile.spec else Settings()
        self.queues = policy_config.queue_specs(config)
        self.queue_config = dict(config.queues)
        self.half_life_s = config.usage_half_life_s
        self._wakeup = asyncio.Event()
        self.waiting: dict[str, Wait] = {}
        self.reservations: dict[str, Reserve] = {}
        self.last: Cycle | None = None
        self._beyond: Wait | None = NO_NODES  # why a job the last cycle did not read waits
        self._busy = False  # jobs pending or placed at the last cycle: the tick applies
        self._recheck_at: float | None = None  # the last plan's Plan.recheck_at
        self._planned_before: float | None = None  # the `now` of the last plan
        self._young_until: float | None = None  # when the snapshot's first young holder ages
        # Jobs take turns on GPUs (time-slicing): a job's start begins its turn, which a
        # plan made while it was only assigned could not time.
        self._slicing = False
        self._sample_wake_at = 0.0  # monotonic: a GPU sample wakes a packing plan after it
        tasks = hub.supervisor
        self._usage = CachedRead("decayed usage", self._read_usage, USAGE_CACHE_S, tasks)
        self._service = CachedRead("service history", self._read_service, SERVICE_CACHE_S, tasks)
        self._estimates: dict[tuple[str, str], tuple[float, float | None]] = {}
        self._deadline_waiters: dict[str, asyncio.Future[None]] = {}
        self.estimator: Estimator | None = None
        self.estimator_trained_at: float | None = None
        self._estimator_seen: tuple[int, str | None] = (0, None)
        self._training = asyncio.Lock()
        self.estimator_retrain_s = config.estimator_retrain_s
        self._predicted: dict[str, tuple[Estimator, float]] = {}  # job id -> run time
        # job id -> GPU utilisation (%) predicted, for packing jobs never measured alone
        self._predicted_util: dict[str, tuple[Estimator, float]] = {}
        # job id -> peak GPU memory (MiB) predicted, for pending jobs whose spec asks none
        self._predicted_memory: dict[str, tuple[Estimator, float]] = {}
        self.cycles = 0

    def wake(self) -> None:
        self._wakeup.set()

    def job_started(self) -> None:
        """A job started: plan again if jobs take turns, so that the new job's turn is
        timed from its start (a plan's recheck time needs it running)."""
        if self._slicing:
            self.wake()

    def gpus_sampled(self) -> None:
        """New GPU figures: plan again if an opportunistic job waits for a GPU that
        stays little used (samples come only when a figure moves past the agent's
        threshold, so this is not every second)."""
        if any(w.code == NO_SHAREABLE_GPU for w in self.waiting.values()):
            self.wake()
            return
        # Under a profile that packs, a job taking turns becomes packable once its
        # partner's utilisation alone is known, which a sample tells: plan again, at
        # most every PACK_SAMPLE_WAKE_S, while jobs take turns.
        if self._packs and self._slicing and time.monotonic() >= self._sample_wake_at:
            self._sample_wake_at = time.monotonic() + PACK_SAMPLE_WAKE_S
            self.wake()

    @property
    def decides_deadlines(self) -> bool:
        """Whether the active profile guarantees deadlines (Chronus's admission)."""
        return self.profile.spec is not None and "deadlines" in self.profile.spec.decide

    @contextlib.asynccontextmanager
    async def deadline_answer(self, job_id: str) -> AsyncIterator[asyncio.Future[None]]:
        """A future set when a cycle has decided the job's deadline. Registered before
        the caller reads the job again, so that a decision between the two is not missed;
        dropped when the caller is done (answered, timed out or gone)."""
        waiter = self._deadline_waiters.get(job_id)
        if waiter is None:
            waiter = self._deadline_waiters[job_id] = asyncio.get_running_loop().create_future()
        self.wake()
        try:
            yield waiter
        finally:
            if self._deadline_waiters.get(job_id) is waiter:
                del self._deadline_waiters[job_id]

    def why_pending(self, job_id: str) -> Wait:
        wait = self.waiting.get(job_id) or self._beyond
        return wait or Wait("not_considered", "not yet considered by the scheduler")

    async def train_estimator(self) -> Estimator | None:
        """Train the resource estimator on the latest succeeded jobs, if any finished
        since the last training (in a thread: it is CPU work)."""
        async with self._training:  # one training at a time; a second caller waits
            seen = await jobs.succeeded_mark(self.pool)
            if seen == self._estimator_seen:
                return self.estimator  # nothing finished since: no 5,000 rows to read
            rows = await jobs.finished_for_estimates(self.pool, TRAIN_ON_JOBS)
            trained = await asyncio.to_thread(lambda: Estimator.train([example(r) for r in rows]))
            self.estimator, self.estimator_trained_at = trained, time.time()
            self._estimator_seen = seen
        log.info(
            "resource estimator trained",
            jobs=len(rows),
            targets=sorted(trained.models),
        )
        return trained

    async def _retrain(self) -> None:
        while True:
            try:
                await self.train_estimator()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bad batch must not end retraining for good
                log.warning("training the resource estimator failed", error=str(exc))
            await asyncio.sleep(self.estimator_retrain_s)

    async def _prune_runs(self) -> None:
        """Delete the runs past the usage horizon, at start and every RUNS_PRUNE_EVERY_S,
        beside the cycles (a first prune of a large table must not hold one up)."""
        while True:
            try:
                pruned = await jobs.prune_runs(self.pool, self.half_life_s)
            except (asyncpg.PostgresError, OSError) as exc:
                log.warning("pruning job runs failed", error=str(exc))
            else:
                if pruned:
                    horizon = jobs.USAGE_HORIZON_HALF_LIVES
                    log.info("job runs pruned", runs=pruned, half_lives=horizon)
            await asyncio.sleep(RUNS_PRUNE_EVERY_S)

    async def run(self) -> None:
        self.hub.supervisor.spawn(self._prune_runs(), name="job runs pruner")
        if self.estimator_retrain_s > 0:
            self.hub.supervisor.spawn(self._retrain(), name="resource estimator")
        fault_pause = FAULT_PAUSE_FIRST_S
        while True:
            timeout = self._timeout()
            if timeout is None:
                await self._wakeup.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
            self._wakeup.clear()
            try:
                await self.cycle()
            except (asyncpg.PostgresError, OSError) as exc:
                # The database is away (restart, failover): try again on the next event
                # or after a short pause, never crash the daemon.
                log.error("scheduling cycle failed", error=str(exc))
                pause = DB_PAUSE_S
            except Exception:
                # A fault of the scheduler's own (a bug the cycle's state brought out):
                # logged with its traceback and tried again, less often while it lasts,
                # so that the API stays up (a job that brings it out can be cancelled)
                # and scheduling resumes once the state that caused it has gone.
                log.exception("scheduling cycle failed unexpectedly", retry_in_s=fault_pause)
                forget_all()  # what the policy keeps between plans may be half mended
                pause, fault_pause = fault_pause, min(2 * fault_pause, FAULT_PAUSE_MOST_S)
            else:
                fault_pause = FAULT_PAUSE_FIRST_S
                continue
            await asyncio.sleep(pause)
            self._wakeup.set()

    def _skipped(
        self, action: Action, placed: dict[str, PlacedJob], unfreed: set[str]
    ) -> tuple[str, str] | None:
        """(log event, why in a wait's words) where `action` must not go out now, else
        None. The next event plans again."""
        lands_on = _lands_on(action, placed)
        if unfreed and not unfreed.isdisjoint(lands_on):
            # Its GPUs were to be freed by a suspend just before it (time-slicing),
            # which did not happen: the job there runs on.
            return "action skipped: its GPUs were not freed", "the job on its GPUs was not paused"
        if not self.hub.out_of_placement().isdisjoint(lands_on):
            # A GPU faulted (or stopped answering), or its node was drained, while this
            # plan was carried out.
            return (
                "action skipped: a GPU of it is out of placement",
                "a GPU of it went out of placement meanwhile",
            )
        return None

    def _plan(self, snapshot: Snapshot, now: float) -> Plan:
        with collector_paused():
            # Its recheck found here, with the plan (in the worker thread where a big plan
            # runs in one), under the collector's pause: not later on the event loop.
            return self.profile.plan(snapshot, now).with_recheck_found()

    def _timeout(self) -> float | None:
        """How long to wait for an event before planning anyway: the profile's tick while
        jobs wait or run, or until the last plan said its answer could change."""
        waits = []
        if self._busy and self.profile.tick_s is not None:
            waits.append(self.profile.tick_s)
        if self._recheck_at is not None:
            waits.append(max(self._recheck_at - time.time(), RECHECK_FLOOR_S))
        return min(waits, default=None)

    async def cycle(self) -> Plan:
        started = time.perf_counter()
        window = self.profile.pending_window
        snapshot = await self.snapshot(window)
        if not snapshot.nodes:
            # Nothing can start anywhere: say so without reading the queue.
            self.waiting, self._beyond, self.reservations = {}, NO_NODES, {}
            self.last, self._busy, self._recheck_at = None, False, None
            return Plan()
        now = time.time()
        # Deadline admission solves a MILP: never on the event loop.
        if len(snapshot.pending) > PLAN_IN_THREAD_ABOVE or self.decides_deadlines:
            plan = await asyncio.to_thread(self._plan, snapshot, now)
        else:
            plan = self._plan(snapshot, now)
        planned = time.perf_counter()
        launched = preempted = suspended = resumed = migrated = resized = packed = 0
        kinds_changed = False
        reservations: dict[str, Reserve] = {}
        placed = {j.job_id: j for j in snapshot.placed}
        unfreed: set[str] = set()  # GPUs of the plan's suspends that were not carried out
        unlaunched: dict[str, str] = {}  # job -> why its Launch was skipped
        for action in plan.actions:
            if isinstance(action, Reserve):
                reservations[action.job_id] = action  # nothing to send: the plan holds it
            elif (skipped := self._skipped(action, placed, unfreed)) is not None:
                event, why = skipped
                log.info(event, job_id=action.job_id, action=type(action).__name__)
                if isinstance(action, Launch):
                    unlaunched[action.job_id] = why
            elif await self.executor.execute(action):
                launched += isinstance(action, Launch)
                preempted += isinstance(action, Preempt)
                kinds_changed |= isinstance(action, SetKind)
                suspended += isinstance(action, Suspend)
                resumed += isinstance(action, Resume)
                migrated += isinstance(action, Migrate)
                resized += isinstance(action, Resize)
                packed += isinstance(action, Resume) and action.beside is not None
                if isinstance(action, AdmitDeadline):
                    waiter = self._deadline_waiters.pop(action.job_id, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
            elif isinstance(action, Suspend) and action.job_id in placed:
                unfreed.update(placed[action.job_id].gpu_uuids)
        full = len(snapshot.pending) >= window  # claimants behind it come beside it
        self.waiting, self.reservations = plan.waiting, reservations
        if unlaunched:  # it waits again, though the plan gave it no wait
            self.waiting = {
                **plan.waiting,
                **{
                    job_id: Wait("not_started", f"planned to start, but {why}; planned again")
                    for job_id, why in unlaunched.items()
                },
            }
        self.last = Cycle(now, snapshot.pending, plan, self.waiting)
        self._beyond = (
            Wait("queued", f"queued behind the {window} oldest pending jobs") if full else None
        )
        self._busy = bool(snapshot.pending or snapshot.placed)
        self._recheck_at = plan.recheck_at
        # Once its actions are carried out: a cycle that failed before plans its lease
        # decisions again.
        self._planned_before = now
        # A claimant whose launch was skipped still waits for what it claimed.
        claimants = plan.claimants | (snapshot.claimants & unlaunched.keys())
        if claimants != snapshot.claimants:
            await self._keep_claimants(claimants)
        if any(w.code == NO_SHAREABLE_GPU for w in plan.waiting.values()):
            # A busy sample stops counting only when it leaves the window: no event says so.
            aged = now + self.hub.gpu_window.window_s
            if self._young_until is not None:
                aged = min(aged, self._young_until)
            self._recheck_at = min(aged, self._recheck_at or aged)
        if full and launched:
            self.wake()  # the window moved on: the jobs behind it may start too
        if kinds_changed:
            self.wake()  # a job's kind decides where it may go: plan with the new one
        # Jobs that were suspended or resumed are timed from now on: the next plan's
        # recheck time (the end of the new turns) needs a snapshot that shows them so.
        turns_changed = bool(suspended or resumed)
        self._slicing = turns_changed or any(j.state == SUSPENDED for j in snapshot.placed)
        if turns_changed:
            self.wake()
        self.cycles += 1
        log.info(
            "scheduling cycle",
            policy=self.profile.name,
            nodes=len(snapshot.nodes),
            pending=len(snapshot.pending),
            actions=len(plan.actions),
            done=launched + preempted,
            launched=launched,
            preempted=preempted,
            suspended=suspended,
            resumed=resumed,
            migrated=migrated,
            resized=resized,
            packed=packed,
            reserved=len(reservations),
            waiting=self.last.wait_counts(),
            plan_ms=round((planned - started) * 1000, 2),
            cycle_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return plan

    # ---- the snapshot ------------------------------------------------------------

    def nodes(self, held: frozenset[str] = frozenset()) -> tuple[Node, ...]:
        """Connected, reconciled nodes: nothing is placed on a node that is away. Each
        GPU's utilisation and memory used are its highest over the last `gpu_window_s`.
        A faulty or unreadable GPU is left out, so that nothing is placed on it; one
        that a placed job names (`held`: its GPUs, or a move's target) stays, marked
        `out`, so that the job keeps it until it ends and nobody else gets it."""
        now = time.time()
        out = self.hub.out_of_placement()
        return tuple(
            Node(
                node_id=link.node_id,
                gpus=tuple(
                    Gpu(
                        uuid=g.uuid,
                        index=g.index,
                        model=g.model,
                        memory_mib=g.memory_mib,
                        utilization_pct=peak[0],
                        memory_used_mib=peak[1],
                    )
                    for g in link.hello.inventory.gpus
                    if g.uuid not in out or g.uuid in held
                    for peak in (self.hub.gpu_window.peak(g.uuid, now),)
                ),
                cpus=link.hello.inventory.cpus,
                memory_mib=link.hello.inventory.memory_mib,
                labels=dict(link.hello.inventory.labels),
                out=frozenset(
                    g.uuid for g in link.hello.inventory.gpus if g.uuid in out and g.uuid in held
                ),
                coordinated=link.hello.inventory.coordinator,
            )
            for link in self.hub.links.values()
            if link.ready
        )

    async def _keep_claimants(self, claimants: set[str]) -> None:
        """Keep the plan's claimants for the next plans, which serve them first."""
        for job_id in await jobs.keep_claimants(self.pool, claimants):
            first = job_id in claimants
            log.info(
                "job served first: it waits for gpus on their way out"
                if first
                else "job served in order again",
                job_id=job_id,
            )

    async def snapshot(self, pending_window: int) -> Snapshot:
        if not any(link.ready for link in self.hub.links.values()):
            return Snapshot(nodes=(), placed=(), pending=(), queues=self.queues)
        placed_rows = await jobs.placed(self.pool)
        pending_rows = await jobs.pending(self.pool, pending_window)
        usage = await self.usage()
        service = await self._service.get()
        estimates = await self._history([*placed_rows, *pending_rows])
        await self._predict([*placed_rows, *pending_rows])
        predicted = self._predicted
        memory = await self._memory(pending_rows)
        now = time.time()
        turns = _turn_gpus(placed_rows) if self._packs else set()
        young = (
            _young_holders(placed_rows, now, self.settings.share_after_s)
            if any(r["kind"] == JobKind.OPPORTUNISTIC for r in pending_rows)
            else {}
        )
        # Once of age, a holder's own figure gives way to its GPU's window.
        self._young_until = min(young.values(), default=None)
        utilisation = (
            await self._utilisation(placed_rows, turns, young) if self._packs or young else None
        )
        placed = _placed_jobs(
            placed_rows,
            now,
            lambda r: _estimate(r, estimates, predicted),
            utilisation,
            turns,
            young,
        )
        pending = tuple(
            PendingJob(
                job_id=r["id"],
                user=r["user_name"],
                queue=r["queue"],
                priority=r["priority"],
                kind=r["kind"],
                request=_request(r),
                submitted_at=r["submitted_s"],
                name=r["name"],
                estimate_s=_estimate(r, estimates, predicted),
                attained_s=r["attained_gpu_s"],
                deadline=r["deadline_s"],
                deadline_admitted=r["deadline_admitted"],
                inputs=tuple(r["inputs"] or ()),
                prefetched_to=r["prefetched_to"],
                stay_guaranteed=r["stay_guaranteed"],
                spec_kind=r["spec_kind"],
                gpu_range=_gpu_range(r),
                resume_on=tuple(r["migrate_gpu_uuids"] or ()) if r["pin_node_id"] else (),
                predicted_gpu_memory_mib=memory.get(r["id"]),
            )
            for r in pending_rows
        )
        return Snapshot(
            nodes=self.nodes(named_gpus(placed)),
            placed=placed,
            pending=pending,
            queues=self.queues,
            usage=usage,
            multi_node=True,  # a job larger than any node runs as a gang (schedd.gangs)
            largest_node_gpus=self.hub.largest_node_gpus(),
            service_history=service,
            claimants=frozenset(r["id"] for r in pending_rows if r["claimant"]),
            planned_before=self._planned_before,
        )

    async def placed_now(self) -> tuple[PlacedJob, ...]:
        now = time.time()
        rows = await jobs.placed(self.pool)
        predicted_util: dict[str, float] | None = {} if self._packs else None
        turns = _turn_gpus(rows) if self._packs else set()
        return _placed_jobs(rows, now, lambda r: None, predicted_util, turns, {})

    @property
    def _packs(self) -> bool:
        """Whether the active profile packs jobs (Gandiva), which reads their utilisation."""
        return self.profile.spec is not None and "pack" in self.profile.spec.decide

    async def _utilisation(
        self, rows: list[asyncpg.Record], turns: set[str], young: dict[str, float]
    ) -> dict[str, float]:
        """What the resource estimator predicts of the GPU utilisation of the placed jobs
        on GPUs taken in turns (`turns`) or holding GPUs too young to share (`young`),
        never sampled running alone (`util_alone` is NULL), each once per training, in
        one batch; the measured figure is read from the row (`_placed`)."""
        cache = self._predicted_util
        if not await self._predict_into(
            cache,
            "gpu_util_pct",
            rows,
            lambda r: r["util_alone"] is None and _reads_util(r, turns, young),
        ):
            return {}
        return {r["id"]: cache[r["id"]][1] for r in rows if r["id"] in cache}

    async def _memory(self, rows: list[asyncpg.Record]) -> dict[str, int]:
        """What the resource estimator predicts of the peak GPU memory of the pending
        jobs whose spec asks none, in MiB rounded up: where they may share a GPU
        (`place.share`). Each once per training, in one batch."""
        cache = self._predicted_memory
        if not await self._predict_into(
            cache, "gpu_memory_peak_mib", rows, lambda r: r["gpu_memory_mib"] is None
        ):
            return {}
        return {r["id"]: memory_mib(cache[r["id"]][1]) for r in rows if r["id"] in cache}

    async def usage(self) -> Usage:
        """Decayed GPU-seconds per queue (its sub-queues included) and per (queue, user),
        read at most every USAGE_CACHE_S (it reads every run of the last 5 half-lives)."""
        return await self._usage.get()

    async def _read_usage(self) -> Usage:
        queues: dict[str, float] = {}
        users: dict[tuple[str, str], float] = {}
        for r in await jobs.decayed_usage(self.pool, self.half_life_s):
            gpu_s = float(r["gpu_s"] or 0.0)
            users[(r["queue"], r["user_name"])] = gpu_s
            for q in lineage(r["queue"]):
                queues[q] = queues.get(q, 0.0) + gpu_s
        return Usage(queues=queues, users=users)

    async def _read_service(self) -> ServiceHistory:
        rows = await jobs.service_taken(self.pool)
        return ServiceHistory.of(
            (r["gpu_s"] for r in rows if r["finished"]),
            (r["gpu_s"] for r in rows if not r["finished"]),
        )

    async def _predict(self, rows: list[asyncpg.Record]) -> None:
        """Run times predicted for the jobs without a spec estimate, each once per
        training (a spec never changes), in one batch; a big one in a thread."""
        await self._predict_into(
            self._predicted, "run_time_s", rows, lambda r: r["estimated_runtime_s"] is None
        )

    async def _predict_into(
        self,
        cache: dict[str, tuple[Estimator, float]],
        target: str,
        rows: list[asyncpg.Record],
        wanted: Callable[[asyncpg.Record], bool],
    ) -> bool:
        """The resource estimator's `target` for the `wanted` rows, into `cache` by job
        id: each once per training, in one batch, a big one in a thread. False where the
        estimator does not predict `target` (none trained, or too few jobs report it)."""
        forest = self.estimator
        if forest is None or target not in forest.models:
            return False
        if len(cache) + len(rows) > ESTIMATE_CACHE_MAX:
            cache.clear()  # before choosing what to predict: none is lost
        todo = [
            r
            for r in rows
            if wanted(r) and ((hit := cache.get(r["id"])) is None or hit[0] is not forest)
        ]
        if not todo:
            return True
        if len(todo) > PREDICT_IN_THREAD_ABOVE:
            values = await asyncio.to_thread(
                lambda: forest.values(target, [of_row(r) for r in todo])
            )
        else:
            values = forest.values(target, [of_row(r) for r in todo])
        for row, value in zip(todo, values or (), strict=False):
            cache[row["id"]] = (forest, value)
        return True

    async def _history(self, rows: list[asyncpg.Record]) -> dict[tuple[str, str], float | None]:
        """Mean run times of earlier jobs of the same user and name, for jobs with no estimate."""
        now = time.monotonic()
        keys = {(r["user_name"], r["name"]) for r in rows if r["estimated_runtime_s"] is None}
        cache = self._estimates
        stale = [
            k for k in keys if (hit := cache.get(k)) is None or now - hit[0] > ESTIMATE_CACHE_S
        ]
        if stale:
            if len(cache) + len(stale) > ESTIMATE_CACHE_MAX:
                cache.clear()
            for key, mean in (await jobs.mean_runtimes(self.pool, stale)).items():
                cache[key] = (now, mean)
        return {k: cache[k][1] for k in keys if k in cache}


def _estimate(
    row: asyncpg.Record,
    history: dict[tuple[str, str], float | None],
    predicted: dict[str, tuple[Estimator, float]],
) -> float | None:
    """The spec's estimate, else the resource estimator's, else the user's history."""
    given: float | None = row["estimated_runtime_s"]
    if given is not None:
        return given
    forest = predicted.get(row["id"])
    if forest is not None:
        return forest[1]
    return history.get((row["user_name"], row["name"]))


def _lands_on(action: Action, placed: dict[str, PlacedJob]) -> tuple[str, ...]:
    """The GPUs a launch, a resume or a move puts its job on."""
    if isinstance(action, Launch):
        return action.gpu_uuids
    if isinstance(action, Resume) and action.job_id in placed:
        return placed[action.job_id].gpu_uuids
    if isinstance(action, Migrate | Resize):
        return action.gpu_uuids or ()
    return ()


def _placed_jobs(
    rows: list[asyncpg.Record],
    now: float,
    estimate: Callable[[asyncpg.Record], float | None],
    predicted_util: dict[str, float] | None,
    turns: set[str],
    young: dict[str, float],
) -> tuple[PlacedJob, ...]:
    """The placed jobs as the policy sees them. A packed job and its partner are each
    measured against their rate alone from the pack's start (`_progress_ratio`).

    `predicted_util` (None: nobody reads utilisation) is the estimator's utilisation for
    jobs never measured alone. The jobs taking turns (suspended or packed, and those on
    their GPUs: `turns`, empty unless the profile packs) get their utilisation alone as
    `utilization_pct`: what packing reads. So do the `young` holders
    (`_young_holders`): with a figure of their own, `place.share` need not wait for
    their GPUs' window to see them run. The others keep None, so that `place.share`
    sees the GPUs' own figures, as before."""
    pack_since: dict[str, float] = {}  # job in a pack -> when the pack began
    for row in rows:
        partner = job_controls.packed_beside(row)
        if row["state"] == JobState.RUNNING and partner is not None:
            since = row["resumed_s"] if row["resumed_s"] is not None else now
            pack_since[row["id"]] = since
            pack_since[partner] = max(pack_since.get(partner, since), since)
    return tuple(
        _placed(
            r,
            now,
            estimate(r),
            pack_since.get(r["id"]),
            util=predicted_util is not None and _reads_util(r, turns, young),
            predicted_util=(predicted_util or {}).get(r["id"]),
        )
        for r in rows
    )


def _reads_util(row: asyncpg.Record, turns: set[str], young: dict[str, float]) -> bool:
    """Whether the policy reads the job's utilisation alone (`_placed_jobs`)."""
    return row["id"] in young or not turns.isdisjoint(row["gpu_uuids"])


def _young_holders(
    rows: list[asyncpg.Record], now: float, share_after_s: float
) -> dict[str, float]:
    """Running guaranteed jobs that started less than `share_after_s` ago, each with when
    it comes of age: `place.share` shares their GPUs only then, unless their utilisation
    is known (and then reads that figure until then)."""
    return {
        r["id"]: of_age
        for r in rows
        if r["state"] == JobState.RUNNING
        and r["kind"] != JobKind.OPPORTUNISTIC
        and r["started_at"] is not None
        and (of_age := r["started_at"].timestamp() + share_after_s) > now
    }


def _turn_gpus(rows: list[asyncpg.Record]) -> set[str]:
    """The GPUs that running jobs take turns on (time-sliced or packed jobs' GPUs)."""
    return {
        uuid
        for row in rows
        if row["state"] == JobState.RUNNING
        and (job_controls.time_sliced(row) or job_controls.packed_beside(row) is not None)
        for uuid in row["gpu_uuids"]
    }


def _placed(
    row: asyncpg.Record,
    now: float,
    estimate: float | None,
    packed_since: float | None = None,
    *,
    util: bool = False,
    predicted_util: float | None = None,
) -> PlacedJob:
    started = row["started_at"].timestamp() if row["started_at"] else None
    paused_at = row["suspended_s"]
    # Service is the time it ran: its suspensions (time-slicing's or a user's) are not.
    until = now if paused_at is None else min(paused_at, now)
    running_s = max(until - started - row["paused_s"], 0.0) if started is not None else 0.0
    running = row["state"] == JobState.RUNNING
    controls = job_controls.controls_of(row)
    # Suspended for time-slicing: its GPUs are another job's until its turn (a job that
    # a user suspended keeps them). Packed: it runs beside the job that holds its GPUs.
    sliced = running and job_controls.time_sliced(row)
    packed = running and job_controls.packed_beside(row) is not None
    # Migrating: it saves a checkpoint to move, or to restart on another GPU count (a
    # resize), and holds the GPUs a plan chose for it there beside its own until it runs
    # there (a user's migration or resize names no GPUs). Its checkpointed exit requeues
    # it, pinned to that node for a plan's (job_controls).
    moving = not sliced and not packed and running and job_controls.moving(row)
    target = tuple(row["migrate_gpu_uuids"] or ()) if moving else ()
    state = SUSPENDED if sliced else PACKED if packed else MIGRATING if moving else row["state"]
    measured = row["util_alone"]
    utilisation = None if not util else measured if measured is not None else predicted_util
    return PlacedJob(
        job_id=row["id"],
        user=row["user_name"],
        queue=row["queue"],
        shards=_shards(row),
        request=_request(row),
        state=state,
        started_at=started,
        priority=row["priority"],
        kind=row["kind"],
        estimate_s=estimate,
        attained_s=row["attained_gpu_s"] + row["gpus"] * running_s,
        deadline=row["deadline_s"],
        deadline_admitted=row["deadline_admitted"],
        utilization_pct=None if utilisation is None else round(utilisation),
        state_since=paused_at if sliced else row["resumed_s"],
        moving_to=(Shard(row["migrate_to"], target),) if target and row["migrate_to"] else (),
        # Its shim reports mini-batches and no checkpoint of this attempt failed. A gang
        # never is: a control acts through one node's shim (job_controls), so no plan
        # moves or resizes it only to see that refused, cycle after cycle.
        checkpointable=row["checkpointable"] is True and not row["parts"],
        gpu_range=_gpu_range(row),
        progress_ratio=_progress_ratio(row, packed_since),
        packable=controls.get("packable", True) is not False,
        paused=running and not sliced and bool(controls["suspended"]),
    )


def named_gpus(placed: tuple[PlacedJob, ...]) -> frozenset[str]:
    """The GPUs placed jobs name: their own and a move's target."""
    return frozenset(u for j in placed for s in (*j.shards, *j.moving_to) for u in s.gpu_uuids)


def _shards(row: asyncpg.Record) -> tuple[Shard, ...]:
    """Where a placed job is: its one node, or a gang's parts by rank."""
    if row["parts"]:
        return tuple(Shard(node_id, tuple(uuids)) for node_id, uuids in row["parts"])
    return (Shard(row["node_id"], tuple(row["gpu_uuids"])),)


def _progress_ratio(row: asyncpg.Record, packed_since: float | None) -> float | None:
    """A job in a pack: its rate now against its rate alone, as the median of its step
    times alone this attempt over the step time of its shim's latest report, if that
    came after the pack began; None for a job in no pack, or where either is not known."""
    if packed_since is None or not row["step_alone_s"]:
        return None
    latest, at = row["step_wall_s"], row["progress_s"]
    if latest is None or at is None or at <= packed_since or float(latest) <= 0:
        return None
    return float(statistics.median(row["step_alone_s"])) / float(latest)


def _gpu_range(row: asyncpg.Record) -> tuple[int, int] | None:
    """An elastic job's (least, most) GPUs; None for any other."""
    least, most = row["min_gpus"], row["max_gpus"]
    return None if least is None else (least, most)


def _request(row: asyncpg.Record) -> Request:
    return interned(
        Request(
            row["gpus"],
            row["cpus"],
            row["memory_mib"],
            row["gpu_memory_mib"],
            node_id=row.get("pin_node_id"),
        )
    )
