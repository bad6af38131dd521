"""Time-slicing (Gandiva) in the live system, through a scripted agent: a plan's suspend
reaches the agent before the launch that takes the job's GPU, the snapshot shows the
job suspended since then and its service stops growing, the turns rotate when a slice
is over with no job pending, and a reconnecting agent is told the suspensions again."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from schedd.policy.actions import Launch, Plan, Suspend
from schedd.policy.snapshot import SUSPENDED, Shard, Snapshot
from schedd.store import jobs, tokens
from shared import protocol as p
from tests.integration.fake_agent import FakeAgent, state_becomes
from tests.integration.inprocess import Schedd, control, placed, start_gandiva, submit

SLICE_S = 1.0


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    async with start_gandiva(pool, timeslice_s=SLICE_S) as s:
        yield s


async def test_jobs_take_turns_on_one_gpu(schedd: Schedd, pool: asyncpg.Pool) -> None:
    agent = await FakeAgent(schedd.server, gpus=1).connect()
    first = await submit(schedd, pool)
    await agent.start(await agent.expect(p.Launch))
    await state_becomes(pool, first, "running")

    # No free GPU: the second job starts on the first one's, which is suspended first
    # (its GPU memory given back) in the same cycle.
    second = await submit(schedd, pool)
    suspend = await agent.expect(p.Suspend)
    assert (suspend.job_id, suspend.free_memory) == (first, True)
    launch = await agent.expect(p.Launch)
    assert (launch.job_id, launch.gpu_uuids) == (second, ["GPU-0"])
    row = await jobs.get(pool, first)
    assert row is not None and row["state"] == "running"
    assert row["controls"]["suspended"] and row["controls"]["time_sliced"]
    seen = await placed(schedd)
    paused = seen[first]
    assert paused.state == SUSPENDED
    assert paused.state_since == pytest.approx(row["suspended_at"].timestamp())
    assert paused.gpu_uuids == ("GPU-0",)
    # Its service stops growing while it is suspended.
    later = (await placed(schedd))[first]
    assert later.attained_s == pytest.approx(paused.attained_s, abs=1e-6)

    # Only the scheduler resumes a time-sliced job: a user's resume would run it beside
    # the job that has its GPU.
    alice = await tokens.create(pool, "alice", "user")
    assert await control(schedd, alice, first, "resume") == 409
    assert await control(schedd, alice, first, "suspend") == 409

    # The second job's turn is timed from its start; at its end they swap, though
    # nothing is pending (the plan's recheck time wakes the scheduler).
    await agent.start(launch)
    started = time.time()
    await state_becomes(pool, second, "running")
    suspend = await agent.expect(p.Suspend, within=SLICE_S + 10)
    assert (suspend.job_id, suspend.free_memory) == (second, True)
    resume = await agent.expect(p.Resume)
    assert resume.job_id == first
    assert time.time() - started >= SLICE_S * 0.9
    seen = await placed(schedd)
    assert (seen[first].state, seen[second].state) == ("running", SUSPENDED)
    row = await jobs.get(pool, first)
    assert row is not None and not row["controls"]["suspended"]
    assert seen[first].state_since == pytest.approx(row["resumed_at"].timestamp())
    # The time it was suspended is not service: at least the second job's turn.
    assert row["paused_s"] >= SLICE_S * 0.9
    ran_s = time.time() - seen[first].started_at - row["paused_s"]  # type: ignore[operator]
    assert seen[first].attained_s <= ran_s + 0.01

    reasons = [e["reason"] for e in await jobs.events(pool, first)]
    assert any(r.startswith("suspend asked by the scheduler: time-sliced") for r in reasons)
    assert any(r.startswith("resume asked by the scheduler: its turn") for r in reasons)

    # An agent that comes back is told again who is suspended and who was resumed.
    await agent.close()
    reports = [p.JobReport(job_id=j, attempt=1, status="running") for j in (first, second)]
    agent = await FakeAgent(schedd.server, gpus=1).connect(*reports)
    told = {type(await agent.next()), type(await agent.next())}
    assert told == {p.Suspend, p.Resume}
    await agent.close()


async def test_a_launch_waits_when_the_suspend_freeing_its_gpu_is_refused(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await FakeAgent(schedd.server, gpus=1).connect()
    first = await submit(schedd, pool)
    await agent.start(await agent.expect(p.Launch))
    await state_becomes(pool, first, "running")
    # Its user suspended it: it keeps its GPU, and the scheduler may not take turns on it.
    alice = await tokens.create(pool, "alice", "user")
    assert await control(schedd, alice, first, "suspend") == 202
    assert not (await agent.expect(p.Suspend)).free_memory
    shown = (await placed(schedd))[first]
    # Running and holding its GPU, but paused: the profile's own plans take no turns on
    # it (tests/unit/test_timeslice.py); a plan that did is refused here.
    assert shown.state == "running" and shown.paused

    def scripted(snapshot: Snapshot, now: float) -> Plan:
        plan = Plan()
        for job in snapshot.pending:
            shards = (Shard("n1", ("GPU-0",)),)
            plan.actions += [Suspend(first, "time-sliced"), Launch(job.job_id, shards, "x")]
        return plan

    scheduler = schedd.scheduler
    scheduler.profile = dataclasses.replace(scheduler.profile, plan=scripted)
    second = await submit(schedd, pool)

    def planned() -> bool:
        last = scheduler.last
        return last is not None and any(j.job_id == second for j in last.pending)

    async with asyncio.timeout(10):
        while not planned():  # noqa: ASYNC110 - the scheduler's own record, not an event
            await asyncio.sleep(0.01)
    row = await jobs.get(pool, second)
    assert row is not None and row["state"] == "pending"
    assert (await jobs.get(pool, first))["controls"]["time_sliced"] is False  # type: ignore[index]
    await agent.close()
