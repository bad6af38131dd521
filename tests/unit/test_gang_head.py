"""Where a gang's parts find its head, and the warning when they cannot reach it."""

from __future__ import annotations

import pytest

from schedd import gangs
from tests.unit.recording_log import RecordingLog


@pytest.mark.parametrize(
    ("addresses", "head", "warned"),
    [
        (["10.0.0.1", "10.0.0.2"], "10.0.0.1", False),
        (["127.0.0.1", "10.0.0.2"], "127.0.0.1", True),  # the head on schedd's own host
        (["localhost", "10.0.0.2"], "localhost", True),
        (["::1", "10.0.0.2"], "::1", True),
        (["127.0.0.1", "127.0.0.1"], "127.0.0.1", False),  # every part on one machine
        (["127.0.0.1", None], "127.0.0.1", False),  # the other node not connected
        ([None, "10.0.0.2"], "", False),  # the head not connected: its launch is not sent
        (["gpu-01.example", "127.0.0.1"], "gpu-01.example", False),
    ],
)
def test_head_address(
    monkeypatch: pytest.MonkeyPatch, addresses: list[str | None], head: str, warned: bool
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(gangs, "log", log)
    assert gangs.head_address("j-1", "n1", addresses) == head
    assert log.events("warning") == (["gang head unreachable from other nodes"] if warned else [])
    if warned:
        (_, _, fields) = log.lines[0]
        assert (fields["job_id"], fields["node_id"], fields["address"]) == ("j-1", "n1", head)
