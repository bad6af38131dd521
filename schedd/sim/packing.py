"""Gandiva's packing in the replay: a suspended job runs at once beside the job that
holds its very GPUs (its partner), instead of taking turns with it.

**The interference model, an assumption** (no trace we replay records how packed jobs
slow each other): two jobs of assumed utilisations u1 and u2 (sharing.py's, per job)
packed on the same GPUs each run at

    min(1, 100 / (u1 + u2)) x (1 - pack_slowdown)

of their speed alone: where the two together ask for more than the GPUs' compute, both
are slowed in proportion, and packing costs a further fixed `SimOptions.pack_slowdown`
(default 0.1: the context switches and the memory bandwidth the two contend for). Jobs
of 30 % and 40 % run at 0.9; of 60 % and 60 %, at 100 / 120 x 0.9 = 0.75. The factor
applies from the pack on (a resume's `suspend_overhead_s` delays the packed job's
progress, not its partner's slowdown) and multiplies the locality speed; on a gang it
is its slowest GPU's. A GPU's compute utilisation is the two jobs' work: (u1 + u2)
times the factor, at most 100 %.

The engine keeps the packed job in a slot of its own per GPU (`Simulation.gpu_packed`,
beside `gpu_owner` and `gpu_sharer`); it holds no GPU as the policy sees it, but a GPU
with a packed job on it counts once as allocated, its queue is charged GPU-seconds and
usage for it, and it gains service as any running job (its view is made again at each
instant, with its service as of then). Its view and its partner's show the factor as
`progress_ratio` (1.0 once alone), which `decide.pack` reads to undo a pack; both views
are made again whenever it changes.

The controls, applied as `Resume` and `Suspend` (controls.py hands them over):
- `pack`: `Resume(beside=partner)` of a suspended job: a new run segment, as a resume.
- `take_over`: `Resume` with no `beside` of a packed job: it becomes its GPUs' holder
  (its partner left), with no pause: the same run segment goes on.
- `unpack`: `Suspend` of a packed job: its work kept, suspended again, and not packed
  again in this attempt (`packable` False in its view until it is launched again).
When the partner finishes, is stopped, preempted, suspended, migrated or resized, the
packed job runs on in its slot at its speed alone; its GPUs are free to the policy,
whose next plan (at that very instant: the partner's end is an event) resumes it as
their holder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedd.policy.actions import Resume
from schedd.policy.snapshot import GUARANTEED
from schedd.sim.controls import _resume_as, _suspend_from
from schedd.sim.jobs import PACKED, RUNNING, SUSPENDED, SimJob

if TYPE_CHECKING:
    from schedd.sim.engine import Simulation


def check_slowdown(slowdown: float) -> None:
    if not 0.0 <= slowdown < 1.0:
        raise ValueError(f"--pack-slowdown: expected 0 <= x < 1, got {slowdown}")


def speed(u1: int, u2: int, slowdown: float) -> float:
    """Each packed job's speed against its speed alone (module docstring)."""
    total = u1 + u2
    crowded = 100 / total if total > 100 else 1.0
    return crowded * (1.0 - slowdown)


def pack(sim: Simulation, action: Resume, now: float) -> bool:
    """The suspended job runs beside `action.beside` on its GPUs. Refused and counted:
    a job that is not suspended or not guaranteed, a partner that is not running or
    does not hold exactly the job's GPUs, GPUs a job is packed on already. Unknown
    jobs stop the replay."""
    job = sim._job(action.job_id, "Resume")
    assert action.beside is not None
    partner = sim.by_id.get(action.beside)
    if partner is None:
        raise sim.policy_error(
            f"Resume of job {job.spec.job_id} beside unknown job {action.beside!r}"
        )
    refusal = _refusal(sim, job, partner)
    if refusal is not None:
        sim.ledger.refused[refusal] += 1
        return False
    job.packs += 1
    # Its partner is timed again at the packing speed, and its view made again with
    # its new progress ratio (`Simulation._retime`).
    _resume_as(sim, job, PACKED, now)
    sim.ledger.actions["Pack"] += 1
    return True


def _refusal(sim: Simulation, job: SimJob, partner: SimJob) -> str | None:
    if job.state != SUSPENDED:
        return f"pack of a {job.state} job"
    if job.kind != GUARANTEED:
        return f"pack of an {job.kind} job"
    if partner.state != RUNNING:
        return f"pack beside a {partner.state} job"
    uuids = sim._uuids(job)
    if set(uuids) != set(sim._uuids(partner)) or any(
        sim.gpu_owner.get(u) is not partner for u in uuids
    ):
        return "pack beside a job that does not hold exactly its GPUs"
    if any(u in sim.gpu_packed for u in uuids):
        return "pack beside a job another job is packed with"
    return None


def take_over(sim: Simulation, job: SimJob, now: float) -> bool:
    """The packed job becomes its GPUs' holder and runs on at its speed alone. Refused
    and counted where a preemption or a move away still frees a GPU; a SimError where
    another job holds one (its partner is still there)."""
    uuids = sim._uuids(job)
    if not sim._gpus_free(job, uuids, "resume"):
        return False
    job.state = RUNNING  # before `gpus_change`, which reads it only as it ends
    sim._move_holders(job, uuids, sim.gpu_packed, sim.gpu_owner, now)
    sim._show(job, state=RUNNING, state_since=now)
    sim.ledger.actions["Resume"] += 1
    return True


def unpack(sim: Simulation, job: SimJob, now: float) -> bool:
    """The packed job is suspended again: its work up to now kept, its GPUs left to its
    partner (timed again alone), not packed again in this attempt."""
    assert job.state == PACKED
    _suspend_from(sim, job, sim.gpu_packed, now)
    sim._show(job, state=SUSPENDED, state_since=now, packable=False)
    sim.ledger.actions["Unpack"] += 1
    return True


def pair_speed(sim: Simulation, uuids: list[str]) -> float:
    """The packing factor of a guaranteed job on `uuids` now: its slowest GPU's, where
    a running holder and a packed job compute together; 1.0 elsewhere."""
    if not sim.gpu_packed:
        return 1.0  # nothing packed anywhere: the common case, found at once
    factor = 1.0
    for uuid in uuids:
        owner, packed = sim.gpu_owner.get(uuid), sim.gpu_packed.get(uuid)
        if owner is None or packed is None or owner.state != RUNNING or packed.state != PACKED:
            continue
        factor = min(
            factor, speed(owner.utilization_pct, packed.utilization_pct, sim.options.pack_slowdown)
        )
    return factor
