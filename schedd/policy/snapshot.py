"""The immutable view of the cluster that a policy plans on.

Built by the live scheduler from PostgreSQL and the agent hub, and by the simulator
from its virtual cluster. Free capacity is derived here from the placements of the
jobs that hold resources, never stored beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter

from schedd.policy.gittins import ServiceHistory
from schedd.policy.immutable import immutable
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources

GUARANTEED = "guaranteed"
# An opportunistic job shares GPUs (AntMan): it goes only where a GPU stays little used,
# one per GPU, and the agent throttles it to keep a guaranteed neighbour at full speed.
# A GPU it holds is still free for a guaranteed job; it holds no share of its queue's.
OPPORTUNISTIC = "opportunistic"
# A time-sliced job paused at a mini-batch boundary (Gandiva): it keeps its process, its
# node's CPUs and memory and the GPUs it resumes on (`shards`), but holds no GPU and no
# share of its queue's until a `Resume`; another job runs on those GPUs meanwhile.
SUSPENDED = "suspended"
# A job packed beside the one that holds its GPUs (Gandiva's packing): a time-sliced job
# that runs at once with its partner instead of in turns, both using little of the GPUs.
# It holds no GPU (they stay its partner's) until the partner leaves.
PACKED = "packed"
# A job moving to other GPUs (Gandiva's migration), or to another GPU count (its grow or
# shrink): it saves a checkpoint and exits where it runs, then resumes on
# `PlacedJob.moving_to`. It holds both sets of GPUs meanwhile (the target's from the
# plan that decided the move), and cannot be stopped or moved.
MIGRATING = "migrating"


_SHARING_STATES = frozenset({SUSPENDED, PACKED})


def holds_gpus(job: PendingJob | PlacedJob) -> bool:
    """Whether the job's GPUs are its own: false for an opportunistic job, and for a
    suspended or packed one (its GPUs are another job's until it resumes alone)."""
    if job.kind == OPPORTUNISTIC:
        return False
    return not isinstance(job, PlacedJob) or job.state not in _SHARING_STATES


@immutable
class Gpu:
    uuid: str
    index: int
    model: str
    memory_mib: int
    utilization_pct: int = 0
    memory_used_mib: int = 0


@immutable
class Node:
    node_id: str
    gpus: tuple[Gpu, ...]
    cpus: float
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)
    # GPUs out of placement (a fault) that a job still holds: never free, never shared,
    # never taken turns on or packed onto; their holder keeps them until it ends. (A
    # faulty GPU nobody holds is simply not among `gpus`.)
    out: frozenset[str] = frozenset()
    # Whether its agent throttles an opportunistic job beside a guaranteed one (its
    # coordinator is on): where not, no opportunistic job is placed on it.
    coordinated: bool = True


def usable(node: Node) -> list[Gpu]:
    """The node's GPUs that may be given to a job, held or not: all but those `out`."""
    return list(node.gpus) if not node.out else [g for g in node.gpus if g.uuid not in node.out]


@immutable
class Request:
    """What one job asks for in all; a job across nodes splits it by its GPUs per node."""

    gpus: int
    cpus: float
    memory_mib: int
    gpu_memory_mib: int | None = None
    # The one node it may use (a migration's target); part of the request so that what
    # a plan learns about one request (it does not fit) is never applied to another.
    node_id: str | None = None
    # Requests key the plan's memo, hashed for every pending job in every cycle: once.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        fields = (self.gpus, self.cpus, self.memory_mib, self.gpu_memory_mib, self.node_id)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Request], tuple[object, ...]]:
        # Built again on unpickling: a str's hash differs from one process to another.
        fields = (self.gpus, self.cpus, self.memory_mib, self.gpu_memory_mib, self.node_id)
        return (Request, fields)

    def resources(self) -> Resources:
        per_gpu = self.gpu_memory_mib
        gpu_memory = self.gpus * per_gpu if per_gpu is not None else 0
        return Resources(self.gpus, self.cpus, self.memory_mib, gpu_memory)


_INTERNED: dict[Request, Request] = {}
_INTERNED_MAX = 4096


def interned(request: Request) -> Request:
    """One object per distinct request: the plan's memo keys on requests, and a key whose
    request is the very object found compares without calling `__eq__` (a shell building
    a snapshot per cycle gives every job a new one otherwise)."""
    known = _INTERNED.get(request)
    if known is not None:
        return known
    if len(_INTERNED) >= _INTERNED_MAX:
        _INTERNED.clear()
    _INTERNED[request] = request
    return request


@immutable
class PendingJob:
    job_id: str
    user: str
    queue: str
    priority: int
    kind: str
    request: Request
    submitted_at: float  # seconds since the epoch (virtual seconds in the simulator)
    name: str = ""
    # Expected run time, from the spec, the history of the user's jobs of this name, or an
    # oracle in the simulator; None when nothing is known (policies use their default).
    estimate_s: float | None = None
    attained_s: float = 0.0  # GPU-seconds of service received in earlier attempts
    deadline: float | None = None
    # Whether the deadline is guaranteed (`AdmitDeadline`); None: not decided yet.
    deadline_admitted: bool | None = None
    # The data the job reads (URLs or paths the agent stages before a launch), and the
    # node a `Prefetch` already copied them to, if any.
    inputs: tuple[str, ...] = ()
    prefetched_to: str | None = None
    # The spec opts out of running opportunistically when it has waited long (AntMan).
    stay_guaranteed: bool = False
    # The kind its spec asked for; `kind` is what it is now (a policy may have made a
    # guaranteed job opportunistic while it waits, and considers it for its guarantee
    # first, every cycle).
    spec_kind: str = GUARANTEED
    # An elastic job (Gandiva's grow/shrink) may run on any GPU count in this range
    # (`request.gpus` is the most); None: exactly `request.gpus`.
    gpu_range: tuple[int, int] | None = None
    # A job requeued to move (a migration or a resize a plan decided): the GPUs chosen
    # for it on `request.node_id`, where it resumes before any other job is placed.
    resume_on: tuple[str, ...] = ()
    # The peak GPU memory the resource estimator predicts, for a job whose spec asks
    # none (`request.gpu_memory_mib` None): what sharing a GPU reads in its place.
    predicted_gpu_memory_mib: int | None = None


_PENDING_FIELDS = tuple(f.name for f in fields(PendingJob))
_pending_values = attrgetter(*_PENDING_FIELDS)
_KIND_AT = _PENDING_FIELDS.index("kind")


def with_kind(job: PendingJob, kind: str) -> PendingJob:
    """`dataclasses.replace(job, kind=kind)` at a third of its cost: a plan makes one for
    each job made opportunistic that it considers as guaranteed again, every cycle."""
    values = list(_pending_values(job))
    values[_KIND_AT] = kind
    return PendingJob(*values)


@immutable
class Shard:
    """The part of a job on one node."""

    node_id: str
    gpu_uuids: tuple[str, ...]


@immutable
class PlacedJob:
    """A job that holds resources: assigned, running, or being stopped."""

    job_id: str
    user: str
    queue: str
    shards: tuple[Shard, ...]
    request: Request
    state: str
    started_at: float | None = None
    priority: int = 0
    kind: str = "guaranteed"
    estimate_s: float | None = None
    attained_s: float = 0.0  # GPU-seconds of service so far, this attempt included
    checkpointed_at: float | None = None  # work before this survives a preemption
    # When `attained_s` was counted, if before the snapshot: a running job has gained
    # GPUs x (now - attained_as_of) since (`View.attained`). A shell that keeps one
    # PlacedJob per attempt (the simulator) sets it to the start; None: as of now.
    attained_as_of: float | None = None
    deadline: float | None = None
    deadline_admitted: bool | None = None
    # How busy it keeps its GPUs (0-100) where the shell knows better than the GPUs'
    # own figures (the simulator's assumed utilisation); None: read the GPUs'.
    utilization_pct: int | None = None
    # When it entered its state: resumed or started (running), or was paused
    # (suspended); None: at `started_at`. Time-slicing reads how long each has had.
    state_since: float | None = None
    # Where a migrating job goes: GPUs it holds already, beside its own `shards`.
    moving_to: tuple[Shard, ...] = ()
    # Whether it can save a checkpoint on request (live: its shim is there), which a
    # move needs; a job without one is never migrated.
    checkpointable: bool = True
    # An elastic job's GPU counts (least, most); `request.gpus` is what it runs on now.
    gpu_range: tuple[int, int] | None = None
    # Its progress rate now against its rate alone (1.0: as fast), where the shell
    # measures it (the mini-batch time); None: not known. Packing reads it.
    progress_ratio: float | None = None
    # False once a pack of it was undone in this attempt: it is not packed again.
    packable: bool = True
    # Suspended by its user: it keeps its GPUs (its memory is on them) but runs no step,
    # so nobody takes turns with it or packs beside it, and it saves no checkpoint to
    # move or resize until its user resumes it. The scheduler's own suspensions are
    # state SUSPENDED instead.
    paused: bool = False

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        if len(self.shards) == 1:  # most jobs: no new tuple (plugins ask in their loops)
            return self.shards[0].gpu_uuids
        return tuple(u for s in self.shards for u in s.gpu_uuids)

    @property
    def stoppable(self) -> bool:
        """Not already on its way out (cancel or preemption in flight)."""
        return self.state in ("assigned", "running")


@immutable
class Usage:
    """Decayed past use, in GPU-seconds, kept by the shell (store or simulator)."""

    queues: dict[str, float] = field(default_factory=dict)
    users: dict[tuple[str, str], float] = field(default_factory=dict)  # (queue, user)


@immutable
class Snapshot:
    nodes: tuple[Node, ...]  # connected nodes only: nothing is placed on a node that is away
    placed: tuple[PlacedJob, ...]
    pending: tuple[PendingJob, ...]  # in submission order
    queues: tuple[QueueSpec, ...] = ()  # configured queues; others are unlimited, weight 1
    usage: Usage = field(default_factory=Usage)
    multi_node: bool = False  # whether the shell can run one job across nodes
    # The GPUs of the largest node that may run jobs here, connected or briefly away (0:
    # the largest connected one). A job that such a node could hold waits for it rather
    # than run across smaller ones that happen to be connected (after a restart, say).
    largest_node_gpus: int = 0
    # GPU-seconds that finished jobs took, for policies that learn the distribution.
    service_history: ServiceHistory | None = None
    # Pending jobs that GPUs on their way out are for (the last plan's `Plan.claimants`,
    # kept by the shell): a plan serves them first.
    claimants: frozenset[str] = frozenset()
    # When the shell's previous plan was made (its `now`); None: none since it started.
    # What happens once a period (Chronus's lease) happens at the first plan past it.
    planned_before: float | None = None


@dataclass(slots=True)
class FreeCapacity:
    """What is left on one node, as a policy works through its pending jobs."""

    node: Node
    free_gpus: list[Gpu]
    cpus: float
    memory_mib: int

    def take(self, gpu_uuids: tuple[str, ...], request: Request) -> None:
        taken = set(gpu_uuids)
        self.free_gpus = [g for g in self.free_gpus if g.uuid not in taken]
        self.cpus -= request.cpus
        self.memory_mib -= request.memory_mib

    def give_back(self, gpus: list[Gpu], request: Request) -> None:
        if self.node.out:  # a faulty GPU is free for nobody, even once its holder ends
            gpus = [g for g in gpus if g.uuid not in self.node.out]
        self.free_gpus = sorted([*self.free_gpus, *gpus], key=lambda g: g.index)
        self.cpus += request.cpus
        self.memory_mib += request.memory_mib


def shard_requests(job_request: Request, shards: tuple[Shard, ...]) -> list[Request]:
    """The request's CPUs and memory split over its shards in proportion to their GPUs."""
    if len(shards) == 1:
        return [job_request]
    total = max(job_request.gpus, 1)
    return [
        Request(
            len(s.gpu_uuids),
            job_request.cpus * len(s.gpu_uuids) / total,
            job_request.memory_mib * len(s.gpu_uuids) // total,
            job_request.gpu_memory_mib,
        )
        for s in shards
    ]


def beyond(held: Request, part: Request, gpus: int) -> Request:
    """What `part` of a move adds on a node where the job holds `held` already (a grow
    in place, a spread job gathered onto one of its nodes): `gpus` new GPUs, and the
    CPUs and memory beyond those it has there."""
    return Request(
        gpus,
        max(part.cpus - held.cpus, 0.0),
        max(part.memory_mib - held.memory_mib, 0),
        part.gpu_memory_mib,
    )


def held_parts(job: PlacedJob) -> list[tuple[Shard, Request]]:
    """What the job holds on each node: its shards, and a moving job's target too (on a
    node where it runs already, only what it does not hold there yet: `beyond`)."""
    parts = list(zip(job.shards, shard_requests(job.request, job.shards), strict=True))
    if not job.moving_to:
        return parts
    own = {s.node_id: (frozenset(s.gpu_uuids), part) for s, part in parts}
    for shard, part in zip(job.moving_to, shard_requests(job.request, job.moving_to), strict=True):
        here = own.get(shard.node_id)
        if here is None:
            parts.append((shard, part))
            continue
        extra = tuple(u for u in shard.gpu_uuids if u not in here[0])
        more = beyond(here[1], part, len(extra))
        if extra or more.cpus or more.memory_mib:
            parts.append((Shard(shard.node_id, extra), more))
    return parts


def free_capacity(snapshot: Snapshot) -> dict[str, FreeCapacity]:
    """Each connected node's capacity less what placed jobs hold on it (an opportunistic,
    suspended or packed job its CPUs and memory, not its GPUs; a moving job its
    target's GPUs too)."""
    used_gpus: set[str] = set()
    used_cpus: dict[str, float] = {}
    used_mem: dict[str, int] = {}
    for job in snapshot.placed:
        for shard, part in held_parts(job):
            if holds_gpus(job):
                used_gpus.update(shard.gpu_uuids)
            used_cpus[shard.node_id] = used_cpus.get(shard.node_id, 0.0) + part.cpus
            used_mem[shard.node_id] = used_mem.get(shard.node_id, 0) + part.memory_mib
    return {
        node.node_id: FreeCapacity(
            node=node,
            free_gpus=[g for g in usable(node) if g.uuid not in used_gpus],
            cpus=node.cpus - used_cpus.get(node.node_id, 0.0),
            memory_mib=node.memory_mib - used_mem.get(node.node_id, 0),
        )
        for node in snapshot.nodes
    }
