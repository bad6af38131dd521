"""The schedd <-> agentd wire protocol: typed, versioned, event-driven messages.

Every message is one JSON text frame tagged by `type`. The agent opens with `Hello`;
schedd answers `Welcome` or closes with `CLOSE_PROTOCOL_MISMATCH`. After that either
side sends events as they happen; nothing is polled (the websocket ping only detects
a dead peer). Job reports carry the job's `attempt` so that a stale report about an
earlier run of a requeued job never touches the current one.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# Agents must match. 2: SetKind; 3: gangs (Launch.gang, Inventory.address);
# 4: Kill.checkpoint_s; 5: Inventory.coordinator; 6: Prefetch.user, ExitAck.final.
PROTOCOL_VERSION = 6
CLOSE_PROTOCOL_MISMATCH = 4400
CLOSE_REPLACED = 4409  # the same node connected again; the older link is closed


class Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    pass


# ---- inventory -------------------------------------------------------------


class GpuInfo(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    index: int
    uuid: str
    model: str
    memory_mib: int


class GpuProcess(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A process holding memory on a GPU (NVML's compute processes)."""

    pid: int
    memory_used_mib: int


class GpuSample(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    uuid: str
    utilization_pct: int
    memory_used_mib: int
    memory_total_mib: int | None = None
    processes: list[GpuProcess] = []
    # Set when the GPU could not be read: it keeps its slot, reported as fully busy.
    error: str | None = None


class Inventory(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gpus: list[GpuInfo]
    cpus: float
    memory_mib: int
    labels: dict[str, str] = {}
    gpu_backend: str = "simulated"
    # Where the node's peers reach it (the agent's `advertise_address`): a gang's other
    # parts find its head there. None: the address schedd sees the agent connect from.
    address: str | None = None
    # Whether the agent's coordinator throttles an opportunistic job beside a guaranteed
    # one on a GPU (`[coordinator] enabled`): where not, none is placed on the node.
    coordinator: bool = True


class JobReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the agent knows of one job at (re)connect."""

    job_id: str
    attempt: int
    status: Literal["running", "exited"]
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # set when the job could not run at all
    checkpoint: str | None = None  # as in JobExited
    # The kind the agent treats a running job as: as launched, or as a SetKind made it
    # since (an agent that restarted knows only the first; schedd tells it again).
    kind: Literal["guaranteed", "opportunistic"] = "guaranteed"


# ---- agent -> schedd ---------------------------------------------------------


class Hello(Msg, tag="hello"):
    protocol: int
    node_id: str
    inventory: Inventory
    jobs: list[JobReport] = []


class JobStarted(Msg, tag="job_started"):
    job_id: str
    attempt: int
    pid: int


class JobExited(Msg, tag="job_exited"):
    """The process ended: `exit_code` when it exited, `signal` when a signal ended it."""

    job_id: str
    attempt: int
    exit_code: int | None = None
    signal: int | None = None
    # Set when it exited with the shim's EXIT_CHECKPOINTED and its checkpoint is on disk.
    checkpoint: str | None = None


class JobFailed(Msg, tag="job_failed"):
    """The job could not run at all (bad command, staging failed, launcher died)."""

    job_id: str
    attempt: int
    reason: str


class JobProgress(Msg, tag="job_progress"):
    """What the job's shim reported over the last interval (at most one a second a job)."""

    job_id: str
    attempt: int
    step: int  # steps completed, counting those before a checkpoint it resumed from
    steps_per_s: float  # over the interval, throttle sleeps and suspensions included
    step_wall_s: float | None = None  # mean time of one step's body in the interval
    gpu_s: float | None = None  # mean GPU time of a step (CUDA events), when it uses CUDA
    mem_reserved_mib: int | None = None
    mem_peak_mib: int | None = None


ControlEvent = Literal[
    "limits", "cap_applied", "suspended", "resumed", "checkpointed", "checkpoint_failed", "kind"
]


class JobControlled(Msg, tag="job_controlled"):
    """The job acted on a control, or could not: recorded in the job's history.

    `event`: limits (the agent passed a share or cap on), cap_applied, suspended, resumed,
    checkpointed (then the job exits and `path` names the checkpoint), checkpoint_failed,
    kind (what the agent made of a SetKind: taken, or why not).
    """

    job_id: str
    attempt: int
    event: ControlEvent
    step: int | None = None
    detail: str = ""
    path: str | None = None


class InputsStaged(Msg, tag="inputs_staged"):
    """Progress of copying one input of a job into the node's cache (a prefetch or a
    launch); the last report of an input has `done`, and `error` when it failed."""

    job_id: str
    input: str
    bytes_done: int
    bytes_total: int | None = None
    done: bool = False
    error: str | None = None


class GpuState(Msg, tag="gpu_state"):
    samples: list[GpuSample]


class GpuFault(Msg, tag="gpu_fault"):
    """A GPU reported an XID error, or fell off the bus: schedd stops placing on it,
    unless the XID is one a job's own code causes (schedd's `gpu_fault_ignore_xids`)."""

    uuid: str
    error: str
    xid: int | None = None  # NVML's critical XID event data; None when the GPU was lost


class LogChunk(Msg, tag="log_chunk"):
    request_id: str
    data: str = ""
    eof: bool = False
    error: str | None = None


# ---- schedd -> agent ---------------------------------------------------------


class Welcome(Msg, tag="welcome"):
    protocol: int


class Gang(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One node's part of a job spread over several: its rank (0 on the head node), how
    many parts there are, and where the head listens for the others."""

    rank: int
    size: int
    head: str
    port: int


class Launch(Msg, tag="launch"):
    job_id: str
    attempt: int
    user: str
    argv: list[str]
    env: dict[str, str] = {}
    cwd: str | None = None
    gpu_uuids: list[str] = []
    cpus: float = 1.0
    memory_mib: int = 1024
    inputs: list[str] = []
    image: str | None = None
    kind: Literal["guaranteed", "opportunistic"] = "guaranteed"
    resume_from: str | None = None  # a checkpoint the job's shim resumes from
    gang: Gang | None = None  # set for each part of a job spread over nodes


class Kill(Msg, tag="kill"):
    """SIGTERM to the job, SIGKILL after `grace_s`. With `checkpoint_s` (a preemption of
    a job whose shim can save), first ask the job to save a checkpoint at its next
    mini-batch and exit, and send SIGTERM only if it has not within that long."""

    job_id: str
    attempt: int
    grace_s: float = 10.0
    reason: str = ""
    checkpoint_s: float = 0.0


class SetLimits(Msg, tag="set_limits"):
    """The whole setting: no cap is None, full speed is a share of 100, 0 pauses."""

    job_id: str
    attempt: int
    share: int = 100
    memory_cap_mib: int | None = None


class SetKind(Msg, tag="set_kind"):
    """A running job is now of this kind (an opportunistic job upgraded to guaranteed):
    the GPUs' coordinators treat it so from now on; its process goes on as it is."""

    job_id: str
    attempt: int
    kind: Literal["guaranteed", "opportunistic"]


class Suspend(Msg, tag="suspend"):
    job_id: str
    attempt: int
    free_memory: bool = False  # give back cached GPU memory while suspended


class Resume(Msg, tag="resume"):
    job_id: str
    attempt: int


class Checkpoint(Msg, tag="checkpoint"):
    """Save and exit at the next step boundary; the job then ends `checkpointed`."""

    job_id: str
    attempt: int


class Prefetch(Msg, tag="prefetch"):
    """Copy a job's inputs into this node's cache now, ahead of its launch here."""

    job_id: str
    inputs: list[str]
    user: str = ""  # the job's: under run_jobs_as = "owner", only what it may read


class ExitAck(Msg, tag="exit_ack"):
    """schedd has committed the job's end; the agent may forget it."""

    job_id: str
    attempt: int
    # The job ended for good (succeeded, failed or cancelled: no attempt comes after):
    # its checkpoints may go with the attempt's directory.
    final: bool = False


class LogRequest(Msg, tag="log_request"):
    request_id: str
    job_id: str
    attempt: int
    offset: int = 0
    follow: bool = False


class LogCancel(Msg, tag="log_cancel"):
    request_id: str


AgentMessage = (
    Hello
    | JobStarted
    | JobExited
    | JobFailed
    | JobProgress
    | JobControlled
    | InputsStaged
    | GpuState
    | GpuFault
    | LogChunk
)
SchedMessage = (
    Welcome
    | Launch
    | Kill
    | SetLimits
    | SetKind
    | Suspend
    | Resume
    | Checkpoint
    | Prefetch
    | ExitAck
    | LogRequest
    | LogCancel
)

_encoder = msgspec.json.Encoder()
_agent_decoder: msgspec.json.Decoder[AgentMessage] = msgspec.json.Decoder(AgentMessage)
_sched_decoder: msgspec.json.Decoder[SchedMessage] = msgspec.json.Decoder(SchedMessage)

ProtocolError = msgspec.DecodeError  # ValidationError is a subclass


def encode(msg: Msg) -> bytes:
    return _encoder.encode(msg)


def decode_from_agent(data: bytes | str) -> AgentMessage:
    return _agent_decoder.decode(data)


def decode_from_sched(data: bytes | str) -> SchedMessage:
    return _sched_decoder.decode(data)
