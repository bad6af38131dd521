"""Job spec, job states and the one transition table.

Every state change anywhere in the system (store, API, agents' reports) is checked
against `TRANSITIONS`; the database enforces it with conditional updates.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, TypeVar

import msgspec
from msgspec import Meta


class JobState(enum.StrEnum):
    PENDING = "pending"  # accepted, waiting for a placement
    ASSIGNED = "assigned"  # placed; the launch is on its way to the agent
    RUNNING = "running"  # the agent started the process
    PREEMPTING = "preempting"  # the scheduler wants its GPUs back; the kill is on its way
    CANCELLING = "cancelling"  # cancel asked while placed; the kill is on its way
    CHECKPOINTED = "checkpointed"  # saved a checkpoint and exited on request; can resume
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# States in which a job holds its placement (GPUs, CPUs, memory on a node).
# A job being preempted or cancelled holds them until its process has exited.
HOLDS_RESOURCES: frozenset[JobState] = frozenset(
    {JobState.ASSIGNED, JobState.RUNNING, JobState.PREEMPTING, JobState.CANCELLING}
)

_S = JobState
# (from, to) -> what the transition means. The literal table is the contract:
# anything not listed is illegal and refused.
TRANSITIONS: dict[tuple[JobState, JobState], str] = {
    (_S.PENDING, _S.ASSIGNED): "placed by the scheduler",
    (_S.PENDING, _S.CANCELLED): "cancelled before it started",
    (_S.ASSIGNED, _S.RUNNING): "the agent started it",
    (_S.ASSIGNED, _S.PENDING): "requeued: the agent never started it",
    (_S.ASSIGNED, _S.FAILED): "the agent could not start it",
    (_S.ASSIGNED, _S.CANCELLING): "cancel asked before it started",
    (_S.ASSIGNED, _S.SUCCEEDED): "exited 0 before its start was recorded",
    (_S.RUNNING, _S.SUCCEEDED): "exited with status 0",
    (_S.RUNNING, _S.FAILED): "exited non-zero, by a signal, or could not run",
    (_S.RUNNING, _S.PENDING): "requeued: lost with its node, or migrated from its checkpoint",
    (_S.RUNNING, _S.CANCELLING): "cancel asked while running",
    (_S.ASSIGNED, _S.PREEMPTING): "preempted by the scheduler before it started",
    (_S.RUNNING, _S.PREEMPTING): "preempted by the scheduler; the kill is on its way",
    (_S.PREEMPTING, _S.PENDING): "requeued: its process exited after the preemption, or is lost",
    # The kill is already on its way; the job ends cancelled instead of requeued.
    (_S.PREEMPTING, _S.CANCELLING): "cancel asked while being preempted",
    (_S.CANCELLING, _S.CANCELLED): "the kill took effect",
    (_S.CANCELLING, _S.SUCCEEDED): "it finished before the kill arrived",
    (_S.CANCELLING, _S.FAILED): "it failed before the kill arrived",
    (_S.RUNNING, _S.CHECKPOINTED): "saved a checkpoint and exited on request",
    (_S.CHECKPOINTED, _S.PENDING): "requeued to resume from its checkpoint",
    (_S.CHECKPOINTED, _S.CANCELLED): "cancelled while checkpointed",
}


class IllegalTransition(Exception):
    def __init__(self, src: JobState, dst: JobState) -> None:
        super().__init__(f"illegal transition {src.value} -> {dst.value}")
        self.src = src
        self.dst = dst


def check_transition(src: JobState, dst: JobState) -> str:
    """Return the meaning of src -> dst, or raise IllegalTransition."""
    try:
        return TRANSITIONS[(src, dst)]
    except KeyError:
        raise IllegalTransition(src, dst) from None


def sources_of(dst: JobState) -> tuple[JobState, ...]:
    """Every state from which `dst` may be reached, in table order."""
    return tuple(src for (src, to) in TRANSITIONS if to is dst)


class JobKind(enum.StrEnum):
    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


Name = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
QueueName = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9_-]*(/[a-z0-9][a-z0-9_-]*)*$")
]
EnvKey = Annotated[str, Meta(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
LabelKey = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
]
Arg = Annotated[str, Meta(max_length=65536)]
AbsPath = Annotated[str, Meta(min_length=1, max_length=4096, pattern=r"^/")]


class JobSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """What a user submits. Unknown fields are refused; every bound is checked."""

    name: Name
    command: Annotated[list[Arg], Meta(min_length=1, max_length=4096)] | None = None
    script: Annotated[str, Meta(min_length=1, max_length=1_000_000)] | None = None
    env: Annotated[dict[EnvKey, Arg], Meta(max_length=1024)] = {}
    cwd: AbsPath | None = None
    gpus: Annotated[int, Meta(ge=0, le=4096)] = 1
    # An elastic job (Gandiva's grow/shrink): it may run on any GPU count from
    # `min_gpus` to `gpus`, restarted from its checkpoint when the count changes.
    min_gpus: Annotated[int, Meta(ge=1, le=4096)] | None = None
    gpu_memory_mib: Annotated[int, Meta(gt=0, le=16 * 1024 * 1024)] | None = None
    cpus: Annotated[float, Meta(ge=0.01, le=4096)] = 1.0
    memory_mib: Annotated[int, Meta(gt=0, le=64 * 1024 * 1024)] = 1024
    queue: QueueName = "default"
    priority: Annotated[int, Meta(ge=-1000, le=1000)] = 0
    kind: JobKind = JobKind.GUARANTEED
    # A guaranteed job that waited long may run opportunistically meanwhile (the antman
    # profile); true keeps it waiting for guaranteed GPUs instead.
    stay_guaranteed: bool = False
    deadline: datetime | None = None
    iterations: Annotated[int, Meta(gt=0)] | None = None
    # Expected run time in seconds, for policies that use run times (SJF, backfill).
    estimated_runtime_s: Annotated[float, Meta(gt=0, le=366 * 86400)] | None = None
    inputs: Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=4096)]], Meta(max_length=1024)
    ] = []
    image: Annotated[str, Meta(min_length=1, max_length=1024)] | None = None
    labels: Annotated[
        dict[LabelKey, Annotated[str, Meta(max_length=1024)]], Meta(max_length=256)
    ] = {}

    def __post_init__(self) -> None:
        # Messages start with the field in backticks: _spec_error names the field from it.
        if (self.command is None) == (self.script is None):
            raise ValueError("`command`: exactly one of `command` or `script` is required")
        if self.min_gpus is not None and self.min_gpus > self.gpus:
            raise ValueError(f"`min_gpus`: must be at most `gpus` ({self.gpus})")
        if self.stay_guaranteed and self.kind == JobKind.OPPORTUNISTIC:
            raise ValueError("`stay_guaranteed`: an opportunistic job cannot stay guaranteed")
        if self.deadline is not None and self.deadline.tzinfo is None:
            raise ValueError("`deadline`: needs a time zone, e.g. 2026-01-01T12:00:00Z")
        for field, texts in self._texts():
            if any("\x00" in t for t in texts):
                # PostgreSQL text cannot hold NUL, and no argv or environment can either.
                raise ValueError(f"`{field}`: must not contain NUL characters")

    def _texts(self) -> list[tuple[str, list[str]]]:
        return [
            ("command", self.command or []),
            ("script", [self.script or ""]),
            ("env", [*self.env, *self.env.values()]),
            ("cwd", [self.cwd or ""]),
            ("inputs", self.inputs),
            ("image", [self.image or ""]),
            ("labels", [*self.labels, *self.labels.values()]),
        ]

    def argv(self) -> list[str]:
        """The argv the agent runs: the command, or the script through /bin/sh."""
        if self.command is not None:
            return list(self.command)
        assert self.script is not None
        return ["/bin/sh", "-c", self.script]


class SpecError(ValueError):
    """A spec that does not validate; `field` names the offending field when known."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


_spec_decoder = msgspec.json.Decoder(JobSpec)


def parse_spec(body: bytes) -> JobSpec:
    """Decode and validate a JSON job spec, raising SpecError with the field at fault."""
    try:
        return _spec_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _spec_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise SpecError(None, f"malformed JSON: {exc}") from None


# ---- controls of a running job (POST /v1/jobs/{id}/...) ------------------------------


class LimitsRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole setting: a share of 100 is full speed, 0 pauses; no cap is null."""

    share: Annotated[int, Meta(ge=0, le=100)] = 100
    memory_cap_mib: Annotated[int, Meta(ge=0)] | None = None


class SuspendRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    free_memory: bool = False


class ResizeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    gpus: Annotated[int, Meta(ge=1, le=4096)]


class NodeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    node: Annotated[str, Meta(min_length=1, max_length=253)]


class DrainRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: Annotated[str, Meta(min_length=1, max_length=500)]
    # Also requeue the jobs placed there now (preempted: a job whose shim can save
    # saves first); without it they run on to their end.
    requeue: bool = False


T = TypeVar("T")


def parse_body(body: bytes, kind: type[T], empty_ok: bool = True) -> T:
    """Decode a JSON request body into `kind`, raising SpecError with the field at fault.
    An empty body means every field's default, where `empty_ok`."""
    if not body.strip() and empty_ok:
        body = b"{}"
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise _spec_error(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise SpecError(None, f"malformed JSON: {exc}") from None


def _spec_error(message: str) -> SpecError:
    # msgspec says "Expected `int` >= 0, got -1 - at `$.gpus`" or
    # "Object contains unknown field `foo`" or the __post_init__ text.
    reason, sep, where = message.rpartition(" - at `")
    if not sep:
        reason, where = message, ""
    where = where.rstrip("`")
    if where.startswith("key` in `"):  # a mapping's key is at fault
        where = where.removeprefix("key` in `")
        reason = f"a key: {reason}"
    elif where.endswith("[...]"):  # a mapping's value; msgspec does not say which key
        where = where.removesuffix("[...]")
        reason = f"a value: {reason}"
    field = where.removeprefix("$").lstrip(".") or None
    if reason.startswith("Object contains unknown field `"):
        unknown = reason.split("`")[1]
        field = f"{field}.{unknown}" if field else unknown
        reason = "unknown field"
    elif reason.startswith("`") and "`: " in reason:  # raised by __post_init__
        field, _, reason = reason[1:].partition("`: ")
    elif reason.startswith("Object missing required field `"):
        missing = reason.split("`")[1]
        field = f"{field}.{missing}" if field else missing
        reason = "required field missing"
    return SpecError(field, reason)
