"""The working state of one planning cycle: free capacity, usage, reservations.

Built from an immutable `Snapshot`; the framework updates it as the plan takes
decisions, so that each plugin sees the cluster as the plan so far leaves it. Plugins
read it; only the framework writes it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from schedd.policy.immutable import immutable
from schedd.policy.placed_totals import PlacedTotals, placed_totals
from schedd.policy.queues import QueueSpec, lineage, unconfigured
from schedd.policy.resources import NOTHING, Resources
from schedd.policy.settings import Settings
from schedd.policy.snapshot import (
    FreeCapacity,
    Gpu,
    PendingJob,
    PlacedJob,
    Request,
    Shard,
    Snapshot,
    beyond,
    holds_gpus,
    shard_requests,
)

# A part of a request that holds GPUs only (a pause or resume keeps CPUs and memory).
_GPUS_ONLY = Request(0, 0.0, 0)


@immutable
class Reservation:
    """GPUs held for a blocked job that expects to start at `expected_start`."""

    job_id: str
    expected_start: float
    node_ids: tuple[str, ...]
    # What the job asks, for the CPUs and memory it counts on beside the GPUs, and for a
    # gang the GPUs it counts on taking on each node (in the order of `node_ids`; empty:
    # all of them on its one node).
    request: Request
    gpus_on: tuple[int, ...] = ()


@dataclass(slots=True)
class View:
    snapshot: Snapshot
    now: float
    settings: Settings
    capacity: dict[str, FreeCapacity]
    total: Resources
    queues: dict[str, QueueSpec]
    # Updated in place, never replaced: the fair ranker holds them for a plan.
    allocated: dict[str, Resources]  # per queue, a queue's use counted in its ancestors too
    user_allocated: dict[tuple[str, str], Resources]  # (leaf queue, user)
    # Nodes bucketed by free GPUs, so that a fit is found without scanning every node.
    by_free: list[dict[str, None]]
    reserved: dict[str, Reservation] = field(default_factory=dict)  # GPU uuid ->
    reservations: dict[str, Reservation] = field(default_factory=dict)  # job id ->
    # node -> (reservation, CPUs, memory) of the free CPUs and memory a reservation
    # counts on there: kept from jobs that would still run at its expected start.
    reserved_room: dict[str, tuple[Reservation, float, int]] = field(default_factory=dict)
    # node -> CPUs and memory this plan gave there to jobs that end before the node's
    # reservation starts (they will be free again for it).
    lent: dict[str, tuple[float, int]] = field(default_factory=dict)
    # queue -> what this plan's claimants (jobs that preempt, or wait for jobs on their
    # way out) will hold there, at every level of their lineage, where it is not
    # charged to the queue already (`charge`): reclaim counts it as held.
    claimed: dict[str, Resources] = field(default_factory=dict)
    stopping: set[str] = field(default_factory=set)  # victims chosen in this cycle
    # Jobs this plan paused, resumed, packed or moved: they keep (or take) GPUs, so
    # they are no victims nor leavers, but take no other decision this cycle.
    touched: set[str] = field(default_factory=set)
    # Jobs this plan paused (also touched): their GPUs are free in the view already, so
    # nothing counts them again as freeing when the job would end.
    paused: set[str] = field(default_factory=set)
    # node -> job size -> jobs; the inner dicts are shared with the kept totals until
    # `writable` copies a node's.
    gpu_sizes: dict[str, dict[int, int]] = field(default_factory=dict)
    owned: set[str] = field(default_factory=set)  # nodes whose capacity entry is a copy
    # node -> GPUs an opportunistic or packed job shares (one per GPU); replaced, never
    # changed in place.
    shared: dict[str, frozenset[str]] = field(default_factory=dict)
    # Answers that stay true for the rest of the cycle, keyed by the plugin that found
    # them: capacity only shrinks as the plan goes on, so a request that did not fit (or
    # found no victims) will not later in the same cycle.
    memo: dict[tuple[object, ...], object] = field(default_factory=dict)
    # (shards, expected end, request) of the jobs this plan starts or resumes, for
    # reservations.
    launched: list[tuple[tuple[Shard, ...], float, Request]] = field(default_factory=list)
    # The jobs this plan launches that hold GPUs, and where: a plan's recheck time counts
    # them as running from now, as it counts the placed (they come of age, their
    # service grows).
    launching: list[tuple[PendingJob, tuple[Shard, ...]]] = field(default_factory=list)
    # Bumped by every decision that changes what the view says (take, stop, reserve,
    # suspend, resume, claim, mark):
    # an answer computed at one generation holds for as long as it stays the same.
    generation: int = 0

    @classmethod
    def build(
        cls,
        snapshot: Snapshot,
        now: float,
        settings: Settings,
        totals: PlacedTotals | None = None,
    ) -> View:
        """`totals` of the snapshot's placed jobs where the caller counted them (off the
        planning thread: `placed_totals.counted_afresh`), else the plans' kept ones."""
        if totals is None:
            totals = placed_totals(snapshot)
        capacity = totals.free_capacity()
        allocated: dict[str, Resources] = defaultdict(lambda: NOTHING)
        user_allocated: dict[tuple[str, str], Resources] = defaultdict(lambda: NOTHING)
        for (queue, user), r in totals.held.items():
            user_allocated[(queue, user)] = r
            for q in lineage(queue):
                allocated[q] += r
        most = max((len(n.gpus) for n in snapshot.nodes), default=0)
        by_free: list[dict[str, None]] = [{} for _ in range(most + 1)]
        for node_id, cap in sorted(capacity.items()):
            by_free[len(cap.free_gpus)][node_id] = None
        return cls(
            snapshot=snapshot,
            now=now,
            settings=settings,
            capacity=capacity,
            total=totals.total,
            queues={q.name: q for q in snapshot.queues},
            allocated=allocated,
            user_allocated=user_allocated,
            by_free=by_free,
            gpu_sizes=totals.gpu_sizes(),
            stopping=totals.leaving_ids(),
            shared=totals.shared_gpus(),
        )

    # ---- reading -------------------------------------------------------------

    def queue(self, name: str) -> QueueSpec:
        spec = self.queues.get(name)
        if spec is None:
            spec = self.queues[name] = unconfigured(name)
        return spec

    def estimate(self, job: PendingJob | PlacedJob) -> float:
        return job.estimate_s if job.estimate_s is not None else self.settings.default_estimate_s

    def attained(self, job: PendingJob | PlacedJob) -> float:
        """GPU-seconds of service the job has received by now."""
        if (
            isinstance(job, PlacedJob)
            and job.attained_as_of is not None
            and job.state == "running"
            and self.now > job.attained_as_of
        ):
            return job.attained_s + job.request.gpus * (self.now - job.attained_as_of)
        return job.attained_s

    def ends(self, job: PendingJob | PlacedJob) -> float:
        """When the job would end, started (or going on) now: `remaining` from now."""
        return self.now + self.remaining(job)

    def remaining(self, job: PendingJob | PlacedJob) -> float:
        """Seconds of running left by its estimate (SRTF, deadlines): the estimate less
        the time its attained GPU-seconds stand for. The estimate is of a run on all the
        GPUs it may use: an elastic job on fewer has that work left at its count now."""
        gpus = job.request.gpus
        if not gpus:
            return self.estimate(job)
        most = job.gpu_range[1] if job.gpu_range is not None else gpus
        return max((self.estimate(job) * most - self.attained(job)) / gpus, 0.0)

    def started(self, job: PlacedJob) -> float:
        """When the job's current attempt started (now, if it has not yet)."""
        return job.started_at if job.started_at is not None else self.now

    def may_use(self, reservation: Reservation, job: PendingJob | PlacedJob) -> bool:
        """Whether the job may take what the reservation holds: it is the job it holds
        them for, or it ends before the reservation's start."""
        return reservation.job_id == job.job_id or self.ends(job) <= reservation.expected_start

    def usable_gpus(self, node_id: str, job: PendingJob | PlacedJob) -> list[Gpu]:
        """Free GPUs on the node this job may take: reserved ones only if it ends in time."""
        free = self.capacity[node_id].free_gpus
        if not self.reserved:
            return free
        return [g for g in free if (r := self.reserved.get(g.uuid)) is None or self.may_use(r, job)]

    def on_gpus_out(self, job: PendingJob | PlacedJob) -> bool:
        """Whether the job's GPUs include one out of placement (`Node.out`): nothing may
        be started, resumed or packed onto them."""
        if not isinstance(job, PlacedJob):
            return False
        for shard in job.shards:
            cap = self.capacity.get(shard.node_id)
            if cap is not None and cap.node.out and not cap.node.out.isdisjoint(shard.gpu_uuids):
                return True
        return False

    def gpu(self, uuid: str) -> Gpu:
        index = self.memo.get(("gpus",))
        if index is None:
            index = {g.uuid: g for n in self.snapshot.nodes for g in n.gpus}
            self.memo[("gpus",)] = index
        return index[uuid]  # type: ignore[index,no-any-return]

    def largest_node_gpus(self) -> int:
        """The most GPUs one connected node has (`by_free` has a bucket per count)."""
        return len(self.by_free) - 1

    def free_gpu_count(self) -> int:
        return sum(i * len(bucket) for i, bucket in enumerate(self.by_free))

    # ---- the plan's decisions --------------------------------------------------

    def writable(self, node_id: str) -> FreeCapacity:
        """The node's free capacity (and job sizes), this plan's own to change: the
        entries a view starts with are shared with the kept totals (and other plans),
        so the first change copies them."""
        cap = self.capacity[node_id]
        if node_id not in self.owned:
            cap = self.capacity[node_id] = FreeCapacity(
                cap.node, cap.free_gpus, cap.cpus, cap.memory_mib
            )  # FreeCapacity replaces its list of GPUs on a change, never edits it
            if node_id in self.gpu_sizes:
                self.gpu_sizes[node_id] = dict(self.gpu_sizes[node_id])
            self.owned.add(node_id)
        return cap

    def take(self, job: PendingJob, shards: tuple[Shard, ...]) -> None:
        if not holds_gpus(job):
            # No new generation: a sharer holds no GPU and nothing of its queue's, so no
            # rank, quota or victim changes; the CPUs and memory it takes only shrink
            # what a job that did not fit could find.
            self._share(job, shards)
            return
        self.generation += 1
        for shard, part in zip(shards, shard_requests(job.request, shards), strict=True):
            self._take_on(shard, part, job.request.gpus)
            self._lend(shard.node_id, job, part)
        self._count(job.queue, job.user, job.request.resources(), +1)
        self.launched.append((shards, self.ends(job), job.request))
        self.launching.append((job, shards))

    def _lend(self, node_id: str, job: PendingJob, part: Request) -> None:
        """Count what a job that ends before the node's reservation starts took there."""
        kept = self.reserved_room.get(node_id) if self.reserved_room else None
        if kept is None or kept[0].job_id == job.job_id:
            return
        if self.may_use(kept[0], job):
            cpus, memory = self.lent.get(node_id, (0.0, 0))
            self.lent[node_id] = (cpus + part.cpus, memory + part.memory_mib)

    def _take_on(self, shard: Shard, part: Request, size: int | None) -> None:
        """Take the shard's GPUs, and `part`'s CPUs and memory, on its node, which moves
        among the nodes by free GPUs; count a job of `size` GPUs there (None: none new)."""
        cap = self.writable(shard.node_id)
        del self.by_free[len(cap.free_gpus)][shard.node_id]
        cap.take(shard.gpu_uuids, part)
        self.by_free[len(cap.free_gpus)][shard.node_id] = None
        if size is not None:
            sizes = self.gpu_sizes.setdefault(shard.node_id, {})  # owned: `writable` above
            sizes[size] = sizes.get(size, 0) + 1

    def _share(self, job: PendingJob, shards: tuple[Shard, ...]) -> None:
        """An opportunistic job takes CPUs and memory, and the GPUs' one sharing place;
        the GPUs stay free for guaranteed jobs and it holds nothing of its queue's."""
        for shard, part in zip(shards, shard_requests(job.request, shards), strict=True):
            cap = self.writable(shard.node_id)
            cap.cpus -= part.cpus
            cap.memory_mib -= part.memory_mib
            self._lend(shard.node_id, job, part)
        self.mark_shared(shards)

    def stop(self, job: PlacedJob) -> None:
        """Count a victim's resources as leaving its queue (they free when it exits)."""
        self.generation += 1
        self.stopping.add(job.job_id)
        self._count(job.queue, job.user, job.request.resources(), -1)

    def mark(self, job_id: str) -> None:
        """The plan decided something of the job that changes no capacity (a pack, an
        unpack, a shrink): it takes no other decision this cycle."""
        self.generation += 1
        self.touched.add(job_id)

    def mark_shared(self, shards: tuple[Shard, ...]) -> None:
        """The shards' GPUs take their one sharing place (no opportunistic job joins)."""
        for shard in shards:
            held = self.shared.get(shard.node_id, frozenset())
            self.shared[shard.node_id] = held | frozenset(shard.gpu_uuids)

    def decided(self, job_id: str) -> bool:
        """Whether this plan already stops, pauses, resumes, packs or moves the job."""
        return job_id in self.stopping or job_id in self.touched

    def suspend(self, job: PlacedJob) -> None:
        """A running job paused for another (time-slicing): its GPUs are free in this
        plan at once, it keeps its CPUs and memory, and its queue no longer holds them."""
        self.generation += 1
        self.touched.add(job.job_id)
        self.paused.add(job.job_id)
        for shard in job.shards:
            cap = self.writable(shard.node_id)
            del self.by_free[len(cap.free_gpus)][shard.node_id]
            cap.give_back([self.gpu(u) for u in shard.gpu_uuids], _GPUS_ONLY)
            self.by_free[len(cap.free_gpus)][shard.node_id] = None
            sizes = self.gpu_sizes[shard.node_id]  # owned: `writable` above
            sizes[job.request.gpus] -= 1
            if not sizes[job.request.gpus]:
                del sizes[job.request.gpus]
        self._count(job.queue, job.user, job.request.resources(), -1)

    def resume(self, job: PlacedJob) -> None:
        """A suspended (or packed) job takes its own GPUs again (they are free in this
        plan); it takes no other decision this cycle."""
        self.generation += 1
        self.touched.add(job.job_id)
        for shard in job.shards:
            self._take_on(shard, _GPUS_ONLY, job.request.gpus)
        self._count(job.queue, job.user, job.request.resources(), +1)
        self.launched.append((job.shards, self.ends(job), job.request))

    def claim(self, job: PlacedJob, shards: tuple[Shard, ...]) -> None:
        """A running job's move to `shards` (free in this plan): it takes them now and
        keeps its own until it runs there, still one job of its queue's."""
        self.generation += 1
        self.touched.add(job.job_id)  # moving: no victim, nor moved again, this cycle
        own = dict(
            zip(
                (s.node_id for s in job.shards),
                shard_requests(job.request, job.shards),
                strict=True,
            )
        )
        for shard, part in zip(shards, shard_requests(job.request, shards), strict=True):
            held = own.get(shard.node_id)
            if held is not None:  # some of its CPUs and memory are there already
                part = beyond(held, part, len(shard.gpu_uuids))
            self._take_on(shard, part, None)

    def hold(self, parts: tuple[tuple[Shard, Request], ...]) -> None:
        """Free GPUs, and each part's CPUs and memory on the shard's node, kept out of
        the rest of the plan for a job that waits to use them (with those of jobs on
        their way out): no job, and no queue, holds them."""
        self.generation += 1
        for shard, part in parts:
            self._take_on(shard, part, None)

    def claim_share(self, queue: str, more: Resources) -> None:
        """A claimant of `queue` will hold `more` once its room is free: counted by
        reclaim as its queue's (every level), not by the fair ranks or quotas."""
        for q in lineage(queue):
            self.claimed[q] = self.claimed.get(q, NOTHING) + more

    def charge(self, queue: str, user: str, more: Resources) -> None:
        """A running job's queue (and user) holds `more` from now on: it grows."""
        self.generation += 1
        self._count(queue, user, more, +1)

    def _count(self, queue: str, user: str, r: Resources, sign: int) -> None:
        for q in lineage(queue):
            held = self.allocated.get(q, NOTHING)
            self.allocated[q] = held + r if sign > 0 else held - r
        key = (queue, user)
        held = self.user_allocated.get(key, NOTHING)
        self.user_allocated[key] = held + r if sign > 0 else held - r

    def reserved_for(self, job_id: str) -> Reservation | None:
        return self.reservations.get(job_id)

    def reserve(self, reservation: Reservation) -> None:
        self.generation += 1
        self.reservations[reservation.job_id] = reservation
        request = reservation.request
        # What it asks, where it asks for GPUs (None: hold the free GPUs alone).
        asks = request if request.gpus > 0 else None
        least = request.gpu_memory_mib
        for i, node_id in enumerate(reservation.node_ids):
            cap = self.capacity[node_id]
            # The GPUs it counts on here (all free ones where it says nothing).
            wanted = len(cap.free_gpus)
            if asks is not None:
                wanted = reservation.gpus_on[i] if reservation.gpus_on else asks.gpus
            held = 0
            for g in cap.free_gpus:
                if held >= wanted:
                    break
                if least is not None and g.memory_mib < least:
                    continue  # too small for it: not held
                if self.reserved.setdefault(g.uuid, reservation) is reservation:
                    held += 1
            if asks is None or node_id in self.reserved_room:
                continue
            # Its share of the CPUs and memory for the GPUs it counts on here, of what
            # is free now: what frees before its start may cover part of it, but a job
            # that outlasts the start taking it would leave the reservation short for
            # good.
            share = wanted / asks.gpus
            cpus = min(asks.cpus * share, max(cap.cpus, 0.0))
            memory = min(int(asks.memory_mib * share), max(cap.memory_mib, 0))
            if cpus > 0 or memory > 0:
                self.reserved_room[node_id] = (reservation, cpus, memory)

    def room(self, node_id: str, job: PendingJob | PlacedJob) -> tuple[float, int]:
        """The node's free CPUs and memory this job may take (a job placed here now, or
        moved here): less what a reservation there counts on, unless the job is its
        holder or ends before it starts."""
        cap = self.capacity[node_id]
        kept = self.reserved_room.get(node_id) if self.reserved_room else None
        if kept is None:
            return cap.cpus, cap.memory_mib
        reservation, cpus, memory = kept
        if self.may_use(reservation, job):
            return cap.cpus, cap.memory_mib
        # What jobs that end before its start took of the free CPUs and memory will be
        # free again by then: it is kept of the rest. Never below nothing: a job that
        # asks for none may still come.
        lent_cpus, lent_memory = self.lent.get(node_id, (0.0, 0))
        return (
            max(min(cap.cpus, cap.cpus + lent_cpus - cpus), 0.0),
            max(min(cap.memory_mib, cap.memory_mib + lent_memory - memory), 0),
        )
