"""One simulated job's mutable state, and the states it goes through.

future -> pending -> running -> finished
                      running -> preempting -> pending   (Preempt with an overhead)
                      running -> pending                 (Preempt without one)
                      running -> suspended -> running    (Suspend, then Resume: time-slicing)
                    suspended -> packed -> suspended     (Resume beside its GPUs' holder,
                                                          then Suspend: packing undone)
                                 packed -> running       (Resume: its partner left)
                      running -> migrating -> running    (Migrate: to other GPUs after a while;
                                                          Resize: to another GPU count)
          pending / suspended / packed -> cancelled      (Stop)
                      running -> cancelled               (Stop, or Preempt without requeue)
                      migrating -> cancelled             (Stop: when the move is over)

A suspended job keeps its shards (the GPUs it resumes on) and its place among the jobs
that hold resources, but holds no GPU, makes no progress and is charged no usage; it
loses no work. Each Resume starts a new run segment: `started_at`, the checkpoint clock
and `remaining_at_start` count from it, as they do from a launch.

A migrating job holds both its own GPUs (`shards`) and those it moves to (`moving_to`),
makes no progress, keeps no GPU busy and is charged usage as one job of its GPUs; when
the move is over it runs on `moving_to` from the work saved at the decision, a new run
segment as after a resume.

A packed job (packing.py) runs beside the job that holds its very GPUs, in a slot of
its own (`Simulation.gpu_packed`), both at the packing speed; it is charged and gains
service as a running job does, from a new run segment as after a resume; when its
partner leaves it runs on alone in that slot until the policy resumes it as the holder.

An elastic job (`gpu_range`, elastic.py) may run on fewer GPUs than its trace's: `gpus`
is the count it runs on (or last ran on), and `remaining_s` is its work left in seconds
on that many GPUs at full speed (the work is GPU-seconds: it scales linearly). A Resize
is a move whose target has another count: when it is over the job runs on that many.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schedd.policy.snapshot import GUARANTEED, PendingJob, PlacedJob, Request, Shard
from schedd.policy.snapshot import MIGRATING as MIGRATING  # the PlacedJob states' words
from schedd.policy.snapshot import PACKED as PACKED
from schedd.policy.snapshot import SUSPENDED as SUSPENDED
from schedd.sim.traces import TraceJob

FUTURE = "future"
PENDING = "pending"
RUNNING = "running"
PREEMPTING = "preempting"
FINISHED = "finished"
CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class SimJob:
    seq: int  # position in submission order: the pending queue's order
    spec: TraceJob
    request: Request
    remaining_s: float  # work left, in seconds at full speed on `gpus` GPUs
    # The GPUs it runs on (or last ran on, or its trace's before it starts): the trace's
    # count but for an elastic job started smaller or resized.
    gpus: int
    state: str = FUTURE
    # Grows at every start, preemption and migration: stale events are ignored.
    attempt: int = 0
    started_at: float | None = None  # start of the current run segment (launch or resume)
    held_since: float | None = None  # when it took the GPUs it holds now (None: holds none)
    first_started_at: float | None = None
    finished_at: float | None = None
    ended_at: float | None = None  # finished or cancelled
    attained_gpu_s: float = 0.0  # GPU-seconds of service in run segments already over
    run_time_s: float = 0.0  # wall-clock seconds run in run segments already over
    speed: float = 1.0  # now: locality x sharing x packing
    locality_speed: float = 1.0  # of its current placement
    share_speed: float = 1.0  # as the GPUs' other holder leaves it (sharing.py)
    pack_speed: float = 1.0  # packed with another job on its GPUs, or not (packing.py)
    # Seconds of its run segments lost against running alone on one node: to its GPUs'
    # spread (locality) and to sharing or packing, counted at each change of speed.
    slowed_by_locality_s: float = 0.0
    slowed_by_sharing_s: float = 0.0
    # When remaining_s was last brought up to date; after a resume with an overhead, when
    # progress begins again (later than now until the overhead is over).
    progress_at: float | None = None
    remaining_at_start: float = 0.0  # of the current run segment
    # (time, remaining_s then) at the segment's last checkpoint before `progress_at`,
    # found when the speed changed after it: what a preemption falls back to.
    checkpoint_remaining: tuple[float, float] | None = None
    timing: int = 0  # grows whenever the completion is planned again: stale ones ignored
    kind: str = GUARANTEED
    utilization_pct: int = 100  # of its GPUs, assumed (sharing.py)
    shards: tuple[Shard, ...] = ()
    moving_to: tuple[Shard, ...] = ()  # a migrating job's target, held beside `shards`
    preemptions: int = 0
    suspensions: int = 0
    migrations: int = 0
    resizes: int = 0
    packs: int = 0
    gpu_range: tuple[int, int] | None = None  # an elastic job's (least, most) GPUs
    cancel_when_freed: bool = False  # stopped while its preemption or move was under way
    deadline_admitted: bool | None = None  # the policy's AdmitDeadline, if any
    # Views handed to the policy, rebuilt only when something in them changed.
    pending_view: PendingJob | None = None
    pending_view_version: int = -1
    # What the policy's PlacedJob says that does not change during an attempt.
    placed_fields: dict[str, Any] = field(default_factory=dict)
    placed_view: PlacedJob | None = None

    def progress_to(self, now: float) -> None:
        """Bring `remaining_s` up to now at the current speed (nothing done while
        `progress_at` still lies ahead, before a resume's overhead is over)."""
        assert self.progress_at is not None
        self.count_slowdown(now)
        done = max(0.0, now - self.progress_at) * self.speed
        self.remaining_s = max(0.0, self.remaining_s - done)

    def count_slowdown(self, now: float) -> None:
        """Count the run since `progress_at` (none before it), at the current speed
        (locality x sharing x packing): each second lost `1 - locality` to the spread,
        and `locality x (1 - sharing x packing)` to the GPUs' other jobs; the two add up
        to `1 - speed`. Called where the speed changes or the run segment ends."""
        assert self.progress_at is not None
        ran = max(0.0, now - self.progress_at)
        self.slowed_by_locality_s += ran * (1.0 - self.locality_speed)
        others = 1.0 - self.share_speed * self.pack_speed
        self.slowed_by_sharing_s += ran * self.locality_speed * others

    def count_run(self, now: float) -> None:
        """Count the run segment up to now as service and run time."""
        assert self.started_at is not None
        ran = now - self.started_at
        self.attained_gpu_s += self.gpus * ran
        self.run_time_s += ran
