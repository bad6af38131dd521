"""Job controls through the HTTP API, schedd's hub and a scripted agent on a real websocket:
what reaches the agent, what the job's history says, and refusals that change nothing."""

from __future__ import annotations

import asyncio

import asyncpg

from schedd.store import jobs, tokens
from shared import protocol as p
from shared.model import JobSpec
from tests.integration.fake_agent import FakeAgent, state_becomes
from tests.integration.inprocess import Schedd, api_call


async def test_limits_suspend_and_a_checkpointed_exit(schedd: Schedd, pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", JobSpec(name="t", command=["train"]), None)
    job_id = row["id"]
    agent = await FakeAgent(schedd.server).connect()
    launch = await agent.expect(p.Launch)
    assert (launch.kind, launch.resume_from) == ("guaranteed", None)
    await agent.start(launch)
    await state_becomes(pool, job_id, "running")
    alice = await tokens.create(pool, "alice", "user")

    status, body = await api_call(schedd, alice, "POST", f"/v1/jobs/{job_id}/limits", {"share": 25})
    assert status == 202 and body["controls"]["share"] == 25
    sent = await agent.expect(p.SetLimits)
    assert (sent.job_id, sent.attempt, sent.share, sent.memory_cap_mib) == (job_id, 1, 25, None)
    # An agent that comes back (one that restarted lost its controls) is told them again.
    await agent.close()
    running = p.JobReport(job_id=job_id, attempt=1, status="running")
    agent = await FakeAgent(schedd.server).connect(running)
    again = await agent.expect(p.SetLimits)
    assert (again.job_id, again.share, again.memory_cap_mib) == (job_id, 25, None)

    # Refused input changes nothing and sends nothing.
    status, body = await api_call(
        schedd, alice, "POST", f"/v1/jobs/{job_id}/limits", {"share": "x"}
    )
    assert (status, body["field"]) == (422, "share")
    status, body = await api_call(
        schedd, alice, "POST", f"/v1/jobs/{job_id}/migrate", {"node": "nope"}
    )
    assert (status, body["field"]) == (422, "node")
    bob = await tokens.create(pool, "bob", "user")
    status, _ = await api_call(schedd, bob, "POST", f"/v1/jobs/{job_id}/suspend")
    assert status == 404  # not bob's job

    status, _ = await api_call(
        schedd, alice, "POST", f"/v1/jobs/{job_id}/suspend", {"free_memory": True}
    )
    assert status == 202
    assert (await agent.expect(p.Suspend)).free_memory is True
    await agent.send(
        p.JobControlled(job_id=job_id, attempt=1, event="suspended", step=7, detail="at step 7")
    )
    await agent.send(p.JobProgress(job_id=job_id, attempt=1, step=7, steps_per_s=0.0))

    status, _ = await api_call(schedd, alice, "POST", f"/v1/jobs/{job_id}/checkpoint")
    assert status == 202
    await agent.expect(p.Checkpoint)
    await agent.send(
        p.JobExited(job_id=job_id, attempt=1, exit_code=85, checkpoint="/ck/step-000000007")
    )
    await agent.expect(p.ExitAck)
    await state_becomes(pool, job_id, "checkpointed")
    row = await jobs.get(pool, job_id)
    assert row["checkpoint_path"] == "/ck/step-000000007" and row["progress"]["step"] == 7
    reasons = [e["reason"] for e in await jobs.events(pool, job_id)]
    assert "share 25, no memory cap, asked by alice" in reasons
    assert "suspended: at step 7" in reasons
    assert reasons[-1] == "checkpoint saved at /ck/step-000000007"

    # A checkpointed job cannot be suspended; resuming requeues it with its checkpoint.
    status, body = await api_call(schedd, alice, "POST", f"/v1/jobs/{job_id}/suspend")
    assert status == 409 and "checkpointed" in body["detail"]
    status, _ = await api_call(schedd, alice, "POST", f"/v1/jobs/{job_id}/resume")
    assert status == 202
    again = await agent.expect(p.Launch)
    assert (again.attempt, again.resume_from) == (2, "/ck/step-000000007")
    await agent.close()


async def test_an_exit_85_without_a_checkpoint_is_a_failure(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    row, _ = await jobs.submit(pool, "alice", JobSpec(name="t", command=["train"]), None)
    agent = await FakeAgent(schedd.server).connect()
    launch = await agent.expect(p.Launch)
    await agent.start(launch)
    await state_becomes(pool, row["id"], "running")
    await agent.send(p.JobExited(job_id=row["id"], attempt=1, exit_code=85))
    await state_becomes(pool, row["id"], "failed")
    await agent.close()


async def test_prefetch_sends_the_inputs_and_records_their_staging(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    spec = JobSpec(name="t", command=["train"], gpus=4, inputs=["http://data/x.bin"])
    row, _ = await jobs.submit(pool, "alice", spec, None)  # waits: the node has 2 GPUs
    agent = await FakeAgent(schedd.server, node_id="n2").connect()
    alice = await tokens.create(pool, "alice", "user")
    status, _ = await api_call(
        schedd, alice, "POST", f"/v1/jobs/{row['id']}/prefetch", {"node": "n2"}
    )
    assert status == 202
    sent = await agent.expect(p.Prefetch)
    assert (sent.job_id, sent.inputs) == (row["id"], ["http://data/x.bin"])
    await agent.send(
        p.InputsStaged(
            job_id=row["id"], input="http://data/x.bin", bytes_done=10, bytes_total=10, done=True
        )
    )
    await agent.send(p.JobProgress(job_id=row["id"], attempt=0, step=1, steps_per_s=1.0))

    async def staged() -> bool:
        reasons = [e["reason"] for e in await jobs.events(pool, row["id"])]
        return "input http://data/x.bin staged on node n2 (10 bytes)" in reasons

    for _ in range(100):
        if await staged():
            break
        await asyncio.sleep(0.05)
    assert await staged()
    assert (await jobs.get(pool, row["id"]))["progress"] is None  # not running: ignored
    await agent.close()


async def test_resize_restarts_the_job_from_its_checkpoint_with_the_new_count(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    row, _ = await jobs.submit(pool, "alice", JobSpec(name="t", command=["train"]), None)
    job_id = row["id"]
    agent = await FakeAgent(schedd.server, gpus=2).connect()
    launch = await agent.expect(p.Launch)
    assert len(launch.gpu_uuids) == 1
    await agent.start(launch)
    await state_becomes(pool, job_id, "running")
    alice = await tokens.create(pool, "alice", "user")
    status, body = await api_call(schedd, alice, "POST", f"/v1/jobs/{job_id}/resize", {"gpus": 0})
    assert (status, body["field"]) == (422, "gpus")
    status, body = await api_call(schedd, alice, "POST", f"/v1/jobs/{job_id}/resize", {"gpus": 2})
    assert status == 202 and body["resizing_to"] == 2
    await agent.expect(p.Checkpoint)
    await agent.send(
        p.JobExited(job_id=job_id, attempt=1, exit_code=85, checkpoint="/ck/step-000000003")
    )
    await agent.expect(p.ExitAck)
    again = await agent.expect(p.Launch)
    assert (again.attempt, len(again.gpu_uuids)) == (2, 2)
    assert again.resume_from == "/ck/step-000000003"
    row = await jobs.get(pool, job_id)
    assert (row["gpus"], row["resize_to"]) == (2, None)
    reasons = [e["reason"] for e in await jobs.events(pool, job_id)]
    assert "resize from 1 to 2 GPUs asked by alice" in reasons
    assert "resizing from 1 to 2 GPUs: resumes from /ck/step-000000003" in reasons
    await agent.close()
