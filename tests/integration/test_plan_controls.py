"""A plan's job controls carried out by the executor as the API's would be: what reaches
the agent, what the job's history says, and controls that no longer apply."""

from __future__ import annotations

import asyncpg

from schedd.policy.actions import Migrate, Resize, Resume, SetLimits, Suspend
from schedd.store import jobs
from shared import protocol as p
from shared.model import JobSpec
from tests.integration.fake_agent import FakeAgent, state_becomes
from tests.integration.inprocess import Schedd


async def test_the_plans_controls_reach_the_agent_in_the_schedulers_name(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    row, _ = await jobs.submit(pool, "alice", JobSpec(name="t", command=["train"]), None)
    job_id = row["id"]
    agent = await FakeAgent(schedd.server).connect()
    await agent.start(await agent.expect(p.Launch))
    await state_becomes(pool, job_id, "running")
    execute = schedd.scheduler.executor.execute

    assert await execute(SetLimits(job_id, "packed beside job 9", memory_cap_mib=4096))
    sent = await agent.expect(p.SetLimits)
    assert (sent.share, sent.memory_cap_mib) == (100, 4096)  # the share left as it was
    assert await execute(SetLimits(job_id, "job 9 needs more", compute_share=30))
    sent = await agent.expect(p.SetLimits)
    assert (sent.share, sent.memory_cap_mib) == (30, 4096)  # the cap left as it was

    assert await execute(Suspend(job_id, "its turn is over"))
    assert (await agent.expect(p.Suspend)).free_memory is True  # for the job taking its turn
    assert await execute(Resume(job_id, "its turn again"))
    await agent.expect(p.Resume)

    assert await execute(Migrate(job_id, "n2", ("n2-g0",), "to free node n1 whole"))
    await agent.expect(p.Checkpoint)
    row = await jobs.get(pool, job_id)
    assert row is not None
    assert (row["migrate_to"], row["migrate_gpu_uuids"]) == ("n2", ["n2-g0"])
    # Already on its way: a second migration to where it runs is refused, nothing sent.
    assert not await execute(Migrate(job_id, "n1", ("n1-g0",), "back"))

    reasons = [e["reason"] for e in await jobs.events(pool, job_id)]
    assert "share 100, memory cap 4096 MiB, asked by the scheduler: packed beside job 9" in reasons
    assert "suspend asked by the scheduler: its turn is over" in reasons
    assert (
        "migration from node n1 to node n2 asked by the scheduler: to free node n1 whole" in reasons
    )
    await agent.close()


async def test_controls_of_jobs_not_running_change_nothing(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    row, _ = await jobs.submit(pool, "alice", JobSpec(name="t", command=["train"], gpus=8), None)
    execute = schedd.scheduler.executor.execute
    before = await jobs.events(pool, row["id"])
    assert not await execute(Suspend(row["id"], "x"))
    assert not await execute(Resize(row["id"], 4, "fewer GPUs"))  # not running
    assert not await execute(SetLimits("no-such-job", "x", compute_share=10))
    assert await jobs.events(pool, row["id"]) == before
    assert (await jobs.get(pool, row["id"]))["state"] == "pending"
