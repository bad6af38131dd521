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

PROTOCOL_VERSION = 1
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


class JobReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the agent knows of one job at (re)connect."""

    job_id: str
    attempt: int
    status: Literal["running", "exited"]
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # set when the job could not run at all


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


class JobFailed(Msg, tag="job_failed"):
    """The job could not run at all (bad command, staging failed, launcher died)."""

    job_id: str
    attempt: int
    reason: str


class GpuState(Msg, tag="gpu_state"):
    samples: list[GpuSample]


class GpuFault(Msg, tag="gpu_fault"):
    """A GPU reported an XID error, or fell off the bus: schedd stops placing on it."""

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


class Kill(Msg, tag="kill"):
    job_id: str
    attempt: int
    grace_s: float = 10.0
    reason: str = ""


class ExitAck(Msg, tag="exit_ack"):
    """schedd has committed the job's end; the agent may forget it."""

    job_id: str
    attempt: int


class LogRequest(Msg, tag="log_request"):
    request_id: str
    job_id: str
    attempt: int
    offset: int = 0
    follow: bool = False


class LogCancel(Msg, tag="log_cancel"):
    request_id: str


# Later mechanisms (shares, suspend, checkpoint, migration, resize, staging) are
# actions of the policy core first; their wire messages join this union with them.

AgentMessage = Hello | JobStarted | JobExited | JobFailed | GpuState | GpuFault | LogChunk
SchedMessage = Welcome | Launch | Kill | ExitAck | LogRequest | LogCancel

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
