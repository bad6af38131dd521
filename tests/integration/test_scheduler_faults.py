"""The scheduler loop outlives a cycle that fails by a fault of its own."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from schedd import scheduler as scheduler_module
from schedd.policy.actions import Plan
from schedd.policy.snapshot import Snapshot
from schedd.store import tokens
from shared import protocol as p
from shared.config import ProfileConfig
from tests.integration.fake_agent import FakeAgent, state_becomes
from tests.integration.inprocess import api_call, start_schedd
from tests.unit.recording_log import RecordingLog


async def test_a_plan_that_raises_is_logged_and_scheduling_goes_on(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug the cycle's state brings out (no other way to cause one than to plant it):
    the first plan raises; the loop logs it with its traceback, and the next plan,
    after the pause, starts the job."""
    recorded = RecordingLog()
    monkeypatch.setattr(scheduler_module, "log", recorded)
    monkeypatch.setattr(scheduler_module, "FAULT_PAUSE_FIRST_S", 0.05, raising=False)
    alice = await tokens.create(pool, "alice", "user")
    async with start_schedd(pool) as schedd:
        planned = schedd.scheduler._plan
        faults = []

        def fails_once(snapshot: Snapshot, now: float) -> Plan:
            if snapshot.pending and not faults:
                faults.append(now)
                raise RuntimeError("planted fault")
            return planned(snapshot, now)

        monkeypatch.setattr(schedd.scheduler, "_plan", fails_once)
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        status, body = await api_call(
            schedd, alice, "POST", "/v1/jobs", {"name": "t", "command": ["true"]}
        )
        assert status == 201
        launch = await agent.expect(p.Launch)
        assert launch.job_id == body["id"] and faults
        await agent.start(launch)
        await state_becomes(pool, body["id"], "running")
        assert "scheduling cycle failed unexpectedly" in recorded.events("exception")
        await agent.close()


async def test_a_launch_skipped_mid_plan_tells_the_job_why_it_still_waits(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its GPUs go out of placement (a fault, a drain) between the plan and its launch:
    the launch is skipped, and the job's wait says so rather than nothing. Served first
    (a claimant: GPUs were on their way out for it), it stays so."""
    alice = await tokens.create(pool, "alice", "user")
    async with start_schedd(pool) as schedd:
        hub, planned = schedd.hub, schedd.scheduler._plan
        out_now: set[str] = set()

        def then_gpus_fault(snapshot: Snapshot, now: float) -> Plan:
            plan = planned(snapshot, now)
            if snapshot.pending:  # from the plan on: as a fault arriving then
                out_now.update(g.uuid for n in snapshot.nodes for g in n.gpus)
            return plan

        monkeypatch.setattr(schedd.scheduler, "_plan", then_gpus_fault)
        monkeypatch.setattr(hub, "out_of_placement", lambda: set(out_now))
        # Submitted and marked before any node is there to plan on.
        status, body = await api_call(
            schedd, alice, "POST", "/v1/jobs", {"name": "t", "command": ["true"]}
        )
        assert status == 201
        await pool.execute("UPDATE jobs SET claimant = true WHERE id = $1", body["id"])
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        async with asyncio.timeout(5):
            while not out_now:  # noqa: ASYNC110 - the cycle's plan, in-process
                await asyncio.sleep(0.01)
            while schedd.scheduler.why_pending(body["id"]).code == "not_considered":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        wait = schedd.scheduler.why_pending(body["id"])
        assert wait.code == "not_started" and "out of placement" in wait.reason
        # Counted with the cycle's waits, as GET /v1/queues shows them.
        last = schedd.scheduler.last
        assert last is not None and last.wait_counts() == {"not_started": 1}
        status, report = await api_call(schedd, alice, "GET", "/v1/queues")
        assert status == 200 and report["last_cycle"]["waiting"] == {"not_started": 1}
        claimant = "SELECT claimant FROM jobs WHERE id = $1"
        assert await pool.fetchval(claimant, body["id"]) is True
        await agent.close()


async def test_jobs_behind_the_window_are_told_so_while_a_claimant_is_read_beside_it(
    pool: asyncpg.Pool,
) -> None:
    """With a window of one job, j3 (a claimant) is read beside it; j2, behind it and
    no claimant, waits as queued behind the window, not as never considered."""
    alice = await tokens.create(pool, "alice", "user")
    profiles = {"fifo": ProfileConfig(pending_window=1)}
    async with start_schedd(pool, policy="fifo", profiles=profiles) as schedd:
        ids = []
        for name in ("j1", "j2", "j3"):  # each larger than any node: none starts
            spec = {"name": name, "command": ["true"], "gpus": 64}
            status, body = await api_call(schedd, alice, "POST", "/v1/jobs", spec)
            assert status == 201
            ids.append(body["id"])
        await pool.execute("UPDATE jobs SET claimant = true WHERE id = $1", ids[2])
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        async with asyncio.timeout(5):
            while (last := schedd.scheduler.last) is None or ids[2] not in {  # noqa: ASYNC110
                j.job_id for j in last.pending
            }:
                await asyncio.sleep(0.01)
        assert [j.job_id for j in schedd.scheduler.last.pending] == [ids[0], ids[2]]
        assert schedd.scheduler.why_pending(ids[1]).code == "queued"
        await agent.close()
