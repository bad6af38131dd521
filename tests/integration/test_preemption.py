"""Preemption through the live parts: executor, hub and a scripted agent on a real websocket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import asyncpg
import pytest

from schedd.policy.actions import Preempt
from schedd.store import jobs, tokens
from shared import protocol as p
from shared.config import ProfileConfig, QueueConfig
from shared.model import JobSpec, JobState
from tests.integration.fake_agent import (
    CHECKPOINT,
    FakeAgent,
    checkpointed,
    exited,
    state_becomes,
    stepping,
)
from tests.integration.inprocess import Schedd, start_schedd

REASON = "preempted: queue a reclaims its guarantee for job j-x"


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    async with start_schedd(pool, kill_grace_s=7.0, preempt_checkpoint_s=12.0) as s:
        yield s


async def submit(pool: asyncpg.Pool, user: str = "alice", gpus: int = 1, queue: str = "b") -> str:
    spec = JobSpec(name="t", command=["sleep", "100"], gpus=gpus, queue=queue)
    row, _ = await jobs.submit(pool, user, spec, None)
    return str(row["id"])


async def running_job(schedd: Schedd, pool: asyncpg.Pool) -> tuple[FakeAgent, str]:
    job_id = await submit(pool)
    agent = await FakeAgent(schedd.server).connect()
    launch = await agent.expect(p.Launch)
    assert launch.job_id == job_id
    await agent.start(launch)
    await state_becomes(pool, job_id, "running")
    return agent, job_id


async def test_preempt_kills_then_the_exit_requeues_with_the_attempt_kept(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, job_id = await running_job(schedd, pool)
    assert await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    kill = await agent.expect(p.Kill)
    assert (kill.job_id, kill.attempt, kill.grace_s, kill.reason) == (job_id, 1, 7.0, REASON)
    assert kill.checkpoint_s == 0  # its shim never reported a mini-batch: nothing to ask
    row = await jobs.get(pool, job_id)
    assert row["state"] == "preempting" and row["node_id"] == "n1"  # it still holds its GPU
    await agent.send(p.JobExited(job_id=job_id, attempt=1, signal=15))
    # Not final: the next attempt may resume from the job's checkpoints.
    assert await agent.expect(p.ExitAck) == p.ExitAck(job_id=job_id, attempt=1, final=False)
    # Requeued, and placed again at once on the freed GPU with the next attempt.
    again = await agent.expect(p.Launch)
    assert (again.job_id, again.attempt) == (job_id, 2)
    events = await jobs.events(pool, job_id)
    moves = [(e["from_state"], e["to_state"], e["attempt"]) for e in events]
    assert moves == [
        (None, "pending", 0),
        ("pending", "assigned", 1),
        ("assigned", "running", 1),
        ("running", "preempting", 1),
        ("preempting", "pending", 1),
        ("pending", "assigned", 2),
    ]
    assert events[3]["reason"] == REASON
    assert REASON in events[4]["reason"] and "SIGTERM" in events[4]["reason"]
    row = await jobs.get(pool, job_id)
    assert row["attained_gpu_s"] > 0
    runs = await pool.fetch("SELECT attempt, gpus FROM job_runs WHERE job_id = $1", job_id)
    assert [(r["attempt"], r["gpus"]) for r in runs] == [(1, 1)]
    await agent.close()


async def test_a_job_that_can_save_is_asked_to_and_resumes_from_its_checkpoint(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, job_id = await running_job(schedd, pool)
    await stepping(agent, pool, job_id)  # its shim reports mini-batches: it can save
    assert await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    kill = await agent.expect(p.Kill)
    assert (kill.checkpoint_s, kill.grace_s) == (12.0, 7.0)
    await checkpointed(agent, job_id)  # saved at its next mini-batch, and exited
    again = await agent.expect(p.Launch)
    assert (again.job_id, again.attempt, again.resume_from) == (job_id, 2, CHECKPOINT)
    events = await jobs.events(pool, job_id)
    moves = [(e["from_state"], e["to_state"]) for e in events if e["from_state"] != e["to_state"]]
    assert moves[-3:] == [
        ("running", "preempting"),
        ("preempting", "pending"),
        ("pending", "assigned"),
    ]
    said = [e["reason"] for e in events]
    assert "checkpointed: checkpoint of step 7 saved" in said
    requeued = next(e for e in events if (e["from_state"], e["to_state"]) == moves[-2])
    assert requeued["reason"] == (
        f"requeued after preemption ({REASON}): checkpoint saved, resumes from {CHECKPOINT}"
    )
    await agent.close()


async def test_exit_code_zero_after_a_preemption_still_requeues(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, job_id = await running_job(schedd, pool)
    await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    await agent.expect(p.Kill)
    await exited(agent, job_id, exit_code=0)
    assert (await agent.expect(p.Launch)).attempt == 2
    assert [e["to_state"] for e in await jobs.events(pool, job_id)][-2:] == ["pending", "assigned"]
    await agent.close()


async def test_a_job_that_cannot_run_while_preempted_is_requeued(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, job_id = await running_job(schedd, pool)
    await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    await agent.expect(p.Kill)
    await agent.send(p.JobFailed(job_id=job_id, attempt=1, reason="launcher died"))
    await agent.expect(p.ExitAck)
    assert (await agent.expect(p.Launch)).attempt == 2
    await agent.close()


async def test_cancel_while_preempting_ends_cancelled_without_a_second_kill(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, job_id = await running_job(schedd, pool)
    await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    await agent.expect(p.Kill)
    token = await tokens.create(pool, "alice", "user")
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            schedd.server.make_url(f"/v1/jobs/{job_id}/cancel"),
            headers={"Authorization": f"Bearer {token}"},
        ) as resp,
    ):
        assert resp.status == 202
        assert (await resp.json())["state"] == "cancelling"
    await agent.send(p.JobExited(job_id=job_id, attempt=1, signal=15))
    assert isinstance(await agent.next(), p.ExitAck)  # no second Kill came before it
    row = await state_becomes(pool, job_id, "cancelled")
    assert row["attempt"] == 1
    moves = [(e["from_state"], e["to_state"]) for e in await jobs.events(pool, job_id)][-3:]
    assert moves == [("running", "preempting"), ("preempting", "cancelling"),
                     ("cancelling", "cancelled")]  # fmt: skip
    await agent.close()


async def test_a_preempting_job_the_node_no_longer_knows_is_requeued(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, job_id = await running_job(schedd, pool)
    await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    await agent.expect(p.Kill)
    await agent.close()
    # The node comes back without the job (it rebooted): the job is requeued, then placed.
    again = await FakeAgent(schedd.server).connect()
    launch = await again.expect(p.Launch)
    assert (launch.job_id, launch.attempt) == (job_id, 2)
    events = await jobs.events(pool, job_id)
    assert (events[-2]["from_state"], events[-2]["to_state"]) == ("preempting", "pending")
    assert "lost" in events[-2]["reason"]
    await again.close()


async def test_a_preempted_job_reported_running_is_killed_again(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    job_id = await submit(pool)
    agent = await FakeAgent(schedd.server).connect()
    launch = await agent.expect(p.Launch)
    # Preempted before its start was recorded; the agent then reports it started (its
    # first kill raced the start): it is killed again.
    await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    assert (await agent.expect(p.Kill)).reason == REASON
    await agent.start(launch)
    again = await agent.expect(p.Kill)
    assert (again.job_id, again.attempt, again.reason) == (job_id, 1, "preempted")
    assert (await jobs.get(pool, job_id))["state"] == "preempting"
    await agent.close()


async def test_a_finished_job_is_not_preempted(schedd: Schedd, pool: asyncpg.Pool) -> None:
    agent, job_id = await running_job(schedd, pool)
    await exited(agent, job_id, exit_code=0)
    assert not await schedd.scheduler.executor.execute(Preempt(job_id, REASON))
    assert (await jobs.get(pool, job_id))["state"] == "succeeded"
    await agent.close()


async def bob_borrows_both_gpus(
    schedd: Schedd, pool: asyncpg.Pool, queue: str = "b"
) -> tuple[FakeAgent, list[str]]:
    """Two of bob's jobs in `queue` run on the agent's two GPUs, borrowed beyond its
    guarantee."""
    agent = await FakeAgent(schedd.server).connect()
    bobs = [await submit(pool, "bob", queue=queue) for _ in range(2)]
    for _ in bobs:
        schedd.scheduler.wake()
        await agent.start(await agent.expect(p.Launch))
    for job_id in bobs:
        await state_becomes(pool, job_id, "running")
    return agent, bobs


async def cycle_done(schedd: Schedd, since: int) -> None:
    """Wait until a scheduling cycle after the `since`-th has ended."""
    async with asyncio.timeout(5):
        while schedd.scheduler.cycles == since:  # noqa: ASYNC110 - a counter
            await asyncio.sleep(0.01)


@dataclass
class Reclaim:
    schedd: Schedd
    agent: FakeAgent
    bobs: list[str]
    alices: str
    kill: p.Kill  # of the victim stopped for alice's job


@asynccontextmanager
async def reclaim_begun(
    pool: asyncpg.Pool, queues: dict[str, QueueConfig], borrower: str, owner: str
) -> AsyncIterator[Reclaim]:
    """The default profile (no minimum run time): bob borrows both GPUs in `borrower`,
    alice submits one job to `owner`, and the first victim's kill has come."""
    profiles = {"default": ProfileConfig(settings={"min_run_s": 0})}
    async with start_schedd(pool, policy="default", queues=queues, profiles=profiles) as schedd:
        agent, bobs = await bob_borrows_both_gpus(schedd, pool, queue=borrower)
        alices = await submit(pool, "alice", queue=owner)
        schedd.scheduler.wake()
        yield Reclaim(schedd, agent, bobs, alices, await agent.expect(p.Kill))


async def test_a_queue_under_its_guarantee_reclaims_from_a_borrower(pool: asyncpg.Pool) -> None:
    """The default profile's plan, carried out live: bob borrows, alice reclaims."""
    queues = {"a": QueueConfig(guarantee_gpus=1, max_gpus=2), "b": QueueConfig(guarantee_gpus=1)}
    async with reclaim_begun(pool, queues, borrower="b", owner="a") as r:
        schedd, agent, bobs, alices, kill = r.schedd, r.agent, r.bobs, r.alices, r.kill
        assert kill.job_id in bobs and kill.reason.startswith("preempted: queue a reclaims")
        # Cycles while the victim stops preempt nobody else: its GPU is on its way.
        for _ in range(2):
            cycles = schedd.scheduler.cycles
            schedd.scheduler.wake()
            await cycle_done(schedd, cycles)
        states = [(await jobs.get(pool, j))["state"] for j in bobs]
        assert sorted(states) == ["preempting", "running"]
        why = schedd.scheduler.why_pending(alices)
        assert why.code == "preempting" and kill.job_id in why.reason
        await exited(agent, kill.job_id, signal=15)
        launch = await agent.expect(p.Launch)
        assert launch.job_id == alices
        victim = await jobs.get(pool, kill.job_id)
        assert (victim["state"], victim["attempt"]) == ("pending", 1)
        assert victim["reason"].startswith("requeued after preemption (preempted: queue a")
        await agent.close()


async def test_transitions_of_preemption_in_the_store(pool: asyncpg.Pool) -> None:
    job_id = await submit(pool)
    assert not (await jobs.transition(pool, job_id, JobState.PREEMPTING, "x")).ok  # pending
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    moved = await jobs.transition(pool, job_id, JobState.PREEMPTING, "reclaim", reason="reclaim")
    assert moved.ok and moved.previous is JobState.ASSIGNED
    assert [r["id"] for r in await jobs.placed(pool)] == [job_id]  # it holds its resources
    assert not (await jobs.transition(pool, job_id, JobState.RUNNING, "started")).ok
    assert not (await jobs.transition(pool, job_id, JobState.FAILED, "x")).ok
    assert not (await jobs.transition(pool, job_id, JobState.CANCELLED, "x")).ok
    assert (await jobs.transition(pool, job_id, JobState.PENDING, "requeued", attempt=1)).ok
    row = await jobs.get(pool, job_id)
    assert (row["state"], row["attempt"], row["node_id"]) == ("pending", 1, None)
    # It never ran: no GPU time, no run recorded.
    assert row["attained_gpu_s"] == 0
    assert await pool.fetchval("SELECT count(*) FROM job_runs") == 0


async def test_a_victim_too_young_to_preempt_is_preempted_once_it_comes_of_age(
    pool: asyncpg.Pool,
) -> None:
    """No event follows the submission: the plan's recheck time alone wakes the scheduler."""
    queues = {"a": QueueConfig(guarantee_gpus=1, max_gpus=2), "b": QueueConfig(guarantee_gpus=1)}
    profiles = {"default": ProfileConfig(settings={"min_run_s": 1.5})}
    async with start_schedd(pool, policy="default", queues=queues, profiles=profiles) as schedd:
        agent, bobs = await bob_borrows_both_gpus(schedd, pool)
        alices = await submit(pool, "alice", queue="a")
        cycles = schedd.scheduler.cycles
        schedd.scheduler.wake()
        await cycle_done(schedd, cycles)
        why = schedd.scheduler.why_pending(alices)
        assert why.code == "no_capacity" and schedd.scheduler.last is not None
        recheck = schedd.scheduler.last.plan.recheck_at
        assert recheck is not None
        kill = await agent.expect(p.Kill, within=10)
        assert kill.job_id in bobs and kill.reason.startswith("preempted: queue a reclaims")
        # Woken once for the recheck, not polling in between.
        assert schedd.scheduler.cycles - cycles <= 3


async def test_a_second_queue_reclaims_while_the_first_victim_is_still_stopping(
    pool: asyncpg.Pool,
) -> None:
    """The plan counts a victim on its way out as leaving (its GPU is for the job it was
    stopped for), so another queue's reclaim goes ahead at once, as the simulator
    replays it, not after that victim's exit. (The borrower's queue is named last: its
    second of use weighs nothing in the fair order, and equal shares go by name.)"""
    queues = {
        "a": QueueConfig(guarantee_gpus=1),
        "c": QueueConfig(guarantee_gpus=1),
        "x": QueueConfig(guarantee_gpus=0, max_gpus=2),
    }
    async with reclaim_begun(pool, queues, borrower="x", owner="a") as r:
        schedd, agent, bobs, alices, first = r.schedd, r.agent, r.bobs, r.alices, r.kill
        assert first.job_id in bobs and first.reason.startswith("preempted: queue a reclaims")
        carols = await submit(pool, "carol", queue="c")
        schedd.scheduler.wake()
        second = await agent.expect(p.Kill)
        assert {first.job_id, second.job_id} == set(bobs)
        assert second.reason.startswith("preempted: queue c reclaims")
        assert (await jobs.get(pool, first.job_id))["state"] == "preempting"
        # Each waits for its own victim, by name.
        for waiter, victim in ((alices, first.job_id), (carols, second.job_id)):
            why = schedd.scheduler.why_pending(waiter)
            assert why.code == "preempting" and victim in why.reason, why
        await exited(agent, first.job_id, signal=15)
        assert (await agent.expect(p.Launch)).job_id == alices
        await exited(agent, second.job_id, signal=15)
        assert (await agent.expect(p.Launch)).job_id == carols
        await agent.close()


async def test_the_gpu_a_job_was_stopped_for_goes_to_that_job(pool: asyncpg.Pool) -> None:
    """Bob borrows both GPUs; Alice's queue reclaims one. While bob's job stops, Dave
    submits to a queue without a guarantee that the fair order puts first (no use, and
    its name): he cannot preempt, but the freed GPU would be his, and Alice would
    preempt bob's other job. The plan kept Alice as its claimant: she is served first,
    the GPU is hers, and nobody else is stopped."""
    queues = {
        "t": QueueConfig(guarantee_gpus=1, max_gpus=2),
        "d": QueueConfig(guarantee_gpus=0, max_gpus=2),
        "x": QueueConfig(guarantee_gpus=0, max_gpus=2),
    }
    async with reclaim_begun(pool, queues, borrower="x", owner="t") as r:
        schedd, agent, bobs, alices, kill = r.schedd, r.agent, r.bobs, r.alices, r.kill
        assert kill.reason.startswith("preempted: queue t reclaims")
        # Marked once the plan is carried out, after the kill.
        claimant = "SELECT claimant FROM jobs WHERE id = $1"
        async with asyncio.timeout(5):
            while not await pool.fetchval(claimant, alices):  # noqa: ASYNC110 - a row
                await asyncio.sleep(0.01)
        daves = await submit(pool, "dave", queue="d")
        cycles = schedd.scheduler.cycles
        schedd.scheduler.wake()
        await cycle_done(schedd, cycles)
        assert schedd.scheduler.why_pending(daves).code == "no_capacity"
        await exited(agent, kill.job_id, signal=15)
        launch = await agent.expect(p.Launch)
        assert launch.job_id == alices
        others = [j for j in bobs if j != kill.job_id]
        assert (await jobs.get(pool, others[0]))["state"] == "running"  # not stopped
        assert schedd.scheduler.why_pending(daves).code == "no_capacity"
        # Placed: the mark is gone with its wait.
        assert await pool.fetchval(claimant, alices) is False
        await agent.close()
