"""The shim writes and reads by hand what the agent's msgspec schema says: they agree.

Every message the stdlib shim can write decodes with the schema to the same fields, and
every control the agent can send is understood by the shim. A field added on one side
only fails here.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared import shim
from shared import shim_protocol as sp

UNCAPPED = shim.Controls()
THROTTLED = shim.Controls(memory_cap_mib=2048, share=25, suspended=True)
MEMORY = shim.Memory(allocated_mib=1000, reserved_mib=1500, peak_mib=1800)

WRITTEN_BY_SHIM: list[dict[str, Any]] = [
    shim.hello_msg(123, shim.GUARANTEED, 0, UNCAPPED),
    shim.hello_msg(123, shim.OPPORTUNISTIC, 41, THROTTLED),
    shim.step_msg(1, 0.25, None, None, None, False),
    shim.step_msg(2, 0.25, 0.2, MEMORY, True, True),
    shim.step_msg(3, 0, 0, shim.Memory(0, 0, 0), False, False),
    shim.cap_applied_msg(None, None, None, False),
    shim.cap_applied_msg(2048, False, 2500, True),
    shim.suspended_msg(7, None),
    shim.suspended_msg(7, 512),
    shim.resumed_msg(7),
    shim.checkpointed_msg(9, "/ckpt/step-000000009"),
    shim.checkpoint_failed_msg(9, "OSError: disk full"),
]


def tag(kind: type[msgspec.Struct]) -> str:
    return str(kind.__struct_config__.tag)


@pytest.mark.parametrize("msg", WRITTEN_BY_SHIM, ids=lambda m: str(m["type"]))
def test_what_the_shim_writes_decodes_to_the_same_fields(msg: dict[str, Any]) -> None:
    line = shim.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decoded = sp.decode_from_shim(line)
    assert tag(type(decoded)) == msg["type"]
    assert msgspec.to_builtins(decoded) == msg  # same fields, none missing or extra


def test_the_shim_writes_every_message_of_the_schema() -> None:
    schema_tags = {tag(kind) for kind in sp.FromShim.__args__}
    assert {m["type"] for m in WRITTEN_BY_SHIM} == schema_tags


CONTROLS: list[tuple[sp.ToShim, shim.Controls]] = [
    (sp.Limits(), shim.Controls()),
    (sp.Limits(memory_cap_mib=1024, share=25), shim.Controls(memory_cap_mib=1024, share=25)),
    (sp.Limits(share=0), shim.Controls(share=0)),
    (sp.Suspend(), shim.Controls(suspended=True)),
    (sp.Suspend(free_memory=True), shim.Controls(suspended=True, free_memory=True)),
    (sp.Resume(), shim.Controls()),
    (sp.Checkpoint(), shim.Controls(checkpoint=True)),
    (sp.Ready(), shim.Controls()),
]


@pytest.mark.parametrize("control, expected", CONTROLS, ids=lambda c: type(c).__name__)
def test_the_shim_understands_every_control(control: sp.ToShim, expected: shim.Controls) -> None:
    line = sp.encode(control)
    assert sp.decode_to_shim(line) == control
    parsed = shim.parse_control(line)
    assert parsed is not None and parsed["type"] == tag(type(control))
    assert shim.apply_control(shim.Controls(), parsed) == expected


def test_every_control_of_the_schema_is_tested() -> None:
    assert {type(c) for c, _ in CONTROLS} == set(sp.ToShim.__args__)


def test_resume_lifts_a_suspension_and_keeps_the_limits() -> None:
    paused = shim.Controls(memory_cap_mib=512, share=50, suspended=True, free_memory=True)
    parsed = shim.parse_control(sp.encode(sp.Resume()))
    assert parsed is not None
    assert shim.apply_control(paused, parsed) == shim.Controls(memory_cap_mib=512, share=50)


@pytest.mark.parametrize(
    "line",
    [
        b"{not json",
        b"[1, 2]",
        b'{"type": "limits", "share": 101}',
        b'{"type": "limits", "share": true}',
        b'{"type": "limits", "share": 50.5}',
        b'{"type": "limits", "memory_cap_mib": "1G"}',
        b'{"type": "limits", "memory_cap_mib": -1}',
        b'{"type": "suspend", "free_memory": "yes"}',
        b'{"type": "launch"}',
        b'{"share": 50}',
    ],
)
def test_the_shim_ignores_what_it_cannot_use(line: bytes) -> None:
    assert shim.parse_control(line) is None


@pytest.mark.parametrize(
    "line",
    [
        b"not json\n",
        b'{"type":"limits","share":50}\n',  # the agent's own message, sent back
        b'{"type":"resumed","step":"one"}\n',
        b'{"type":"resumed","step":-1}\n',
        b'{"type":"resumed","step":true}\n',
        b'{"type":"resumed","step":1,"extra":0}\n',
        b'{"type":"resumed"}\n',
        b'{"type":"step","step":1,"wall_s":-0.5,"gpu_s":null,"mem_allocated_mib":null,'
        b'"mem_reserved_mib":null,"mem_peak_mib":null,"cap_met":null,"spilling":false}\n',
    ],
)
def test_the_agent_refuses_anything_else(line: bytes) -> None:
    with pytest.raises(sp.ShimProtocolError):
        sp.decode_from_shim(line)


def test_both_sides_share_the_constants() -> None:
    assert sp.EXIT_CHECKPOINTED == shim.EXIT_CHECKPOINTED
    assert sp.PROTOCOL_VERSION == shim.PROTOCOL_VERSION
    assert sp.MAX_LINE_BYTES == shim.MAX_LINE_BYTES


def test_the_checkpointed_status_is_one_nothing_else_means() -> None:
    code = shim.EXIT_CHECKPOINTED
    assert code not in (0, 1, 2)  # success, Python's uncaught exception, usage errors
    assert not 64 <= code <= 78  # sysexits.h (75 = EX_TEMPFAIL, used by many tools)
    assert code not in (77, 99)  # automake's "skipped" and "hard error"
    assert code < 126  # the shell's "cannot execute", "not found", 128+N for signals
