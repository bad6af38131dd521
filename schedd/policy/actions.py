"""What a policy decides: a Plan of typed actions, each with its reason.

The live scheduler makes each action's state change durable and then sends it to the
agent; the simulator applies it to its virtual cluster. Actions beyond Launch and Stop
are the vocabulary of the sharing, time-slicing and migration policies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from schedd.policy.immutable import immutable
from schedd.policy.snapshot import Shard


@immutable
class Launch:
    """Start a pending job on `shards`: its `request.gpus` GPUs, or, for an elastic job,
    any count in its `gpu_range` (it starts smaller where that is all there is)."""

    job_id: str
    shards: tuple[Shard, ...]  # one per node; more than one only where the shell allows
    reason: str

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(u for s in self.shards for u in s.gpu_uuids)


@immutable
class Stop:
    job_id: str
    reason: str


@immutable
class Preempt:
    job_id: str
    reason: str
    requeue: bool = True


@immutable
class Suspend:
    """Pause a running job at its next mini-batch boundary, its GPU memory given up
    (Gandiva's time-slicing): it keeps its process and its GPUs to resume on, and
    becomes a `suspended` PlacedJob that holds no GPU; another job may run there."""

    job_id: str
    reason: str


@immutable
class Resume:
    """Let a suspended job go on where it was, on the GPUs it was paused on. With
    `beside`, it runs at once with that job, which holds those GPUs and keeps running
    (packing): it becomes `packed`. A packed job resumed with no `beside` takes its
    GPUs as their holder (its partner left)."""

    job_id: str
    reason: str
    beside: str | None = None


@immutable
class Migrate:
    """Checkpoint the job and resume it on `node_id`, on `gpu_uuids` (free in the plan's
    view when decided): it becomes a `migrating` PlacedJob that holds its own GPUs and
    those (`moving_to`) until it runs there. A shell that cannot keep the very GPUs
    through the move (the live one requeues the job pinned to the node) may resume it
    on others of that node."""

    job_id: str
    node_id: str
    gpu_uuids: tuple[str, ...]
    reason: str


@immutable
class Resize:
    """Restart an elastic job from its checkpoint on `gpus` GPUs: `gpu_uuids` on
    `node_id` where a plan chose them (free in its view, or the job's own), held as a
    migration's target is (`moving_to`) until it runs there. A shell that cannot keep
    the very GPUs (the live one requeues the job pinned to the node) may take others
    of that node."""

    job_id: str
    gpus: int
    reason: str
    node_id: str | None = None
    gpu_uuids: tuple[str, ...] = ()


@immutable
class SetLimits:
    job_id: str
    reason: str
    # None leaves that limit as it is.
    memory_cap_mib: int | None = None
    compute_share: int | None = None  # 0-100; 0 means suspended


@immutable
class Prefetch:
    job_id: str
    node_id: str
    inputs: tuple[str, ...]
    reason: str


@immutable
class Reserve:
    """GPUs held for a blocked gang until `expected_start`; only shorter jobs backfill them."""

    job_id: str
    node_ids: tuple[str, ...]
    expected_start: float
    reason: str


@immutable
class AdmitDeadline:
    """Whether a job's deadline is guaranteed: decided once (a guarantee is withdrawn
    only when the cluster can no longer keep it); the shell records it on the job."""

    job_id: str
    admitted: bool
    reason: str


@immutable
class SetKind:
    """Make the job guaranteed or opportunistic (AntMan). A waiting job starts as the
    new kind; a running one keeps its GPUs and process, and only the agent's treatment
    of it changes (an upgrade is given only where its GPUs have no guaranteed holder)."""

    job_id: str
    kind: str
    reason: str


Action = (
    Launch
    | Stop
    | Preempt
    | Suspend
    | Resume
    | Migrate
    | Resize
    | SetLimits
    | Prefetch
    | Reserve
    | AdmitDeadline
    | SetKind
)


@immutable
class Wait:
    """Why a pending job was not started: a stable code to count by, and words for people."""

    code: str
    reason: str


class Plan:
    """What one plan() decided: its actions, why each pending job it did not start
    waits, its `claimants`, and `recheck_at`.

    `claimants` are the pending jobs that wait for GPUs on their way out: jobs this
    plan preempted for them, or jobs leaving already whose GPUs they count on. The
    shell keeps the set (`Snapshot.claimants`) until a plan names others, and the next
    plans serve those jobs first: GPUs a job was stopped for go to the job it was
    stopped for, not to whoever the order puts first by the time they are free, who
    would leave the claimant to preempt again.

    `recheck_at` is the earliest time this plan could come out otherwise with no event
    in between (a running job's protection ends, or its attained service crosses a
    threshold), for the shell to plan again then; None: only events change it. A plan
    may leave it to be found when first read (`defer_recheck`): finding it costs as
    much as a fifth of a plan, and a shell that plans again at once (the simulator,
    after a plan that freed GPUs) never reads it. What finds it reads only the plan's
    own view, so the answer is the same whenever it is read."""

    __slots__ = ("_find_recheck", "_recheck_at", "actions", "claimants", "waiting")

    def __init__(
        self,
        actions: list[Action] | None = None,
        waiting: dict[str, Wait] | None = None,
        recheck_at: float | None = None,
        claimants: set[str] | None = None,
    ) -> None:
        self.actions: list[Action] = [] if actions is None else actions
        self.waiting: dict[str, Wait] = {} if waiting is None else waiting
        self.claimants: set[str] = set() if claimants is None else claimants
        self._recheck_at = recheck_at
        self._find_recheck: Callable[[], float | None] | None = None

    @property
    def recheck_at(self) -> float | None:
        find = self._find_recheck
        if find is not None:
            self._recheck_at = find()
            self._find_recheck = None  # after: a find that raised raises again when read
        return self._recheck_at

    @recheck_at.setter
    def recheck_at(self, value: float | None) -> None:
        self._find_recheck = None
        self._recheck_at = value

    def defer_recheck(self, find: Callable[[], float | None]) -> None:
        """`recheck_at` is `find()`, called when it is first read."""
        self._find_recheck = find

    def with_recheck_found(self) -> Plan:
        """This plan, its `recheck_at` found now rather than when first read."""
        self.recheck_at = self.recheck_at
        return self

    def __repr__(self) -> str:
        # Not found for a repr: a log line or a debugger must not run the policy.
        recheck = "<deferred>" if self._find_recheck is not None else repr(self._recheck_at)
        return (
            f"Plan(actions={self.actions!r}, waiting={self.waiting!r},"
            f" claimants={self.claimants!r}, recheck_at={recheck})"
        )

    def wait_counts(self) -> dict[str, int]:
        """Pending jobs counted by the reason they wait, as Nomad counts placement failures."""
        return dict(Counter(w.code for w in self.waiting.values()))
