"""The wire protocol: every message survives the trip; anything else is refused."""

from __future__ import annotations

import pytest

from shared import protocol as p

INVENTORY = p.Inventory(
    gpus=[p.GpuInfo(index=0, uuid="GPU-1", model="A100", memory_mib=81920)],
    cpus=8,
    memory_mib=65536,
    labels={"rack": "r1"},
)
FROM_AGENT = [
    p.Hello(
        protocol=p.PROTOCOL_VERSION,
        node_id="n1",
        inventory=INVENTORY,
        jobs=[p.JobReport(job_id="j", attempt=1, status="exited", exit_code=3)],
    ),
    p.JobStarted(job_id="j", attempt=1, pid=42),
    p.JobExited(job_id="j", attempt=1, signal=9),
    p.JobFailed(job_id="j", attempt=1, reason="no such file"),
    p.GpuState(samples=[p.GpuSample(uuid="GPU-1", utilization_pct=50, memory_used_mib=100)]),
    p.LogChunk(request_id="r", data="hello\n"),
]
FROM_SCHEDD = [
    p.Welcome(protocol=p.PROTOCOL_VERSION),
    p.Launch(job_id="j", attempt=2, user="alice", argv=["python3", "t.py"], gpu_uuids=["GPU-1"]),
    p.Kill(job_id="j", attempt=2, grace_s=5, reason="cancelled"),
    p.ExitAck(job_id="j", attempt=2),
    p.LogRequest(request_id="r", job_id="j", attempt=2, follow=True),
    p.LogCancel(request_id="r"),
    p.SetLimits(job_id="j", attempt=2, share=25, memory_cap_mib=4096),
    p.SetKind(job_id="j", attempt=2, kind="guaranteed"),
    p.Suspend(job_id="j", attempt=2, free_memory=True),
    p.Resume(job_id="j", attempt=2),
    p.Checkpoint(job_id="j", attempt=2),
    p.Prefetch(job_id="j", inputs=["s3://bucket/data"]),
]


@pytest.mark.parametrize("msg", FROM_AGENT, ids=lambda m: type(m).__name__)
def test_agent_messages_round_trip(msg: p.Msg) -> None:
    assert p.decode_from_agent(p.encode(msg)) == msg


@pytest.mark.parametrize("msg", FROM_SCHEDD, ids=lambda m: type(m).__name__)
def test_schedd_messages_round_trip(msg: p.Msg) -> None:
    assert p.decode_from_sched(p.encode(msg)) == msg


def test_messages_are_tagged_json() -> None:
    assert (
        p.encode(p.ExitAck(job_id="j", attempt=1))
        == b'{"type":"exit_ack","job_id":"j","attempt":1,"final":false}'
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"launch","job_id":"j","attempt":1,"user":"u","argv":[]}',  # wrong direction
        b'{"type":"job_started","job_id":"j","attempt":"one","pid":1}',
        b'{"type":"job_started","job_id":"j","attempt":1,"pid":1,"extra":true}',
        b'{"type":"teleport"}',
        b'{"job_id":"j"}',
        b"not json",
    ],
)
def test_agent_side_refuses_what_is_not_an_agent_message(raw: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_from_agent(raw)


def test_directions_do_not_mix() -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_from_sched(p.encode(p.JobStarted(job_id="j", attempt=1, pid=1)))
