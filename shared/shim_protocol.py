"""The shim <-> agent wire schema: newline-delimited JSON over the job's Unix socket.

The shim (shared/shim.py) is stdlib-only and writes these messages by hand;
tests/unit/test_shim_protocol.py decodes what it writes with this schema so the two
cannot drift. The agent decodes strictly: whatever this schema refuses closes that
connection. The shim opens with `Hello`; the agent answers with the controls it holds
for the job, then `Ready`. Then the shim sends one `Step` per mini-batch and an event
when it acts on a control; the agent sends controls whenever it likes, and the shim
applies the latest of them at its next step boundary.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.shim import EXIT_CHECKPOINTED, MAX_LINE_BYTES, PROTOCOL_VERSION

__all__ = ["EXIT_CHECKPOINTED", "MAX_LINE_BYTES", "PROTOCOL_VERSION"]

Count = Annotated[int, msgspec.Meta(ge=0)]
MiB = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]
Share = Annotated[int, msgspec.Meta(ge=0, le=100)]


class ShimMsg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    pass


# ---- shim -> agent -----------------------------------------------------------------


class Hello(ShimMsg, tag="hello"):
    """First on every connection; says what the shim is applying now (for a new agent)."""

    protocol: int
    pid: int
    job_kind: Literal["guaranteed", "opportunistic"]
    step: Count  # steps completed, counting those before a resumed checkpoint
    memory_cap_mib: MiB | None
    share: Share
    suspended: bool


class Step(ShimMsg, tag="step"):
    """One mini-batch. `gpu_s` and the memory figures are None for a job without CUDA."""

    step: Count
    wall_s: Seconds  # the step itself, without the throttle's sleep
    gpu_s: Seconds | None
    mem_allocated_mib: MiB | None
    mem_reserved_mib: MiB | None
    mem_peak_mib: MiB | None  # the most reserved so far (PyTorch's max_memory_reserved)
    cap_met: bool | None  # None: no cap, or no GPU to cap
    spilling: bool  # activations are being kept in host memory to fit the cap


class CapApplied(ShimMsg, tag="cap_applied"):
    memory_cap_mib: MiB | None
    met: bool | None
    mem_reserved_mib: MiB | None
    spilling: bool


class Suspended(ShimMsg, tag="suspended"):
    step: Count
    freed_mib: MiB | None  # cached GPU memory given back, when asked to


class Resumed(ShimMsg, tag="resumed"):
    step: Count


class Checkpointed(ShimMsg, tag="checkpointed"):
    """The last message: the job exits with EXIT_CHECKPOINTED right after it."""

    step: Count
    path: str


class CheckpointFailed(ShimMsg, tag="checkpoint_failed"):
    """The job could not save; it runs on."""

    step: Count
    reason: str


# ---- agent -> shim -----------------------------------------------------------------


class Limits(ShimMsg, tag="limits"):
    """The whole setting each time: no cap is None, full speed is 100, 0 pauses the job."""

    memory_cap_mib: MiB | None = None
    share: Share = 100


class Suspend(ShimMsg, tag="suspend"):
    free_memory: bool = False


class Resume(ShimMsg, tag="resume"):
    pass


class Checkpoint(ShimMsg, tag="checkpoint"):
    """Save through the job's save function and exit with EXIT_CHECKPOINTED."""


class Ready(ShimMsg, tag="ready"):
    """Follows the controls sent on connect: the shim's first step waits for it."""


FromShim = Hello | Step | CapApplied | Suspended | Resumed | Checkpointed | CheckpointFailed
ToShim = Limits | Suspend | Resume | Checkpoint | Ready

_encoder = msgspec.json.Encoder()
_from_shim: msgspec.json.Decoder[FromShim] = msgspec.json.Decoder(FromShim)
_to_shim: msgspec.json.Decoder[ToShim] = msgspec.json.Decoder(ToShim)

ShimProtocolError = msgspec.DecodeError  # ValidationError is a subclass


def encode(msg: ShimMsg) -> bytes:
    """One line, newline included."""
    return _encoder.encode(msg) + b"\n"


def decode_from_shim(line: bytes) -> FromShim:
    return _from_shim.decode(line)


def decode_to_shim(line: bytes) -> ToShim:
    return _to_shim.decode(line)
