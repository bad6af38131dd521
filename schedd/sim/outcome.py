"""What one simulation run leaves behind: each job's fate and the engine's ledger."""

from __future__ import annotations

from dataclasses import dataclass

from schedd.policy.queues import QueueSpec
from schedd.sim.jobs import SimJob
from schedd.sim.ledger import Ledger
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import Trace


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job_id: str
    queue: str
    gpus: int  # the trace's (an elastic job may have run on fewer)
    submit_s: float
    state: str  # finished, cancelled, or where it was left (pending: it never got to run)
    first_start_s: float | None
    finish_s: float | None  # suspended time included: a JCT counts it as any other wait
    deadline_s: float | None
    preemptions: int
    suspensions: int
    migrations: int
    resizes: int
    packs: int  # Resumes beside another job applied (packing)
    # Seconds of its runs lost to its GPUs' spread, and to sharing or packing them.
    slowed_by_locality_s: float = 0.0
    slowed_by_sharing_s: float = 0.0

    @property
    def jct_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.submit_s

    @property
    def queueing_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.submit_s


def outcome_of(job: SimJob) -> JobOutcome:
    spec = job.spec
    return JobOutcome(
        job_id=spec.job_id,
        queue=spec.queue,
        gpus=spec.gpus,
        submit_s=spec.submit_s,
        state=job.state,
        first_start_s=job.first_started_at,
        finish_s=job.finished_at,
        deadline_s=spec.deadline_s,
        preemptions=job.preemptions,
        suspensions=job.suspensions,
        migrations=job.migrations,
        resizes=job.resizes,
        packs=job.packs,
        slowed_by_locality_s=job.slowed_by_locality_s,
        slowed_by_sharing_s=job.slowed_by_sharing_s,
    )


@dataclass(frozen=True, slots=True)
class SimResult:
    policy: str
    shape: ClusterShape
    trace: Trace
    start_s: float  # the first submission
    end_s: float  # the last event
    jobs: tuple[JobOutcome, ...]
    ledger: Ledger
    queue_specs: tuple[QueueSpec, ...]
    wall_s: float  # how long the replay took here (a figure, never a test)
