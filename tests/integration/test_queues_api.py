"""Queues over the API: unknown queues refused, GET /v1/queues, reservations on a job."""

from __future__ import annotations

import asyncio

import asyncpg

from schedd.policy import placed_totals
from schedd.store import tokens
from shared import protocol as p
from shared.config import ProfileConfig, QueueConfig
from tests.integration.fake_agent import FakeAgent, state_becomes
from tests.integration.inprocess import api_call, start_schedd

QUEUES = {
    "a": QueueConfig(guarantee_gpus=1, max_gpus=2),
    "b": QueueConfig(
        guarantee_gpus=1,
        max_gpus=2,
        weight=2.0,
        guarantee_gpu_memory_mib=500,
        max_gpu_memory_mib=2000,
    ),
}


async def counts(pool: asyncpg.Pool) -> tuple[int, int]:
    return (
        await pool.fetchval("SELECT count(*) FROM jobs"),
        await pool.fetchval("SELECT count(*) FROM job_events"),
    )


async def test_an_unknown_queue_is_refused_and_nothing_is_stored(pool: asyncpg.Pool) -> None:
    token = await tokens.create(pool, "alice", "user")
    async with start_schedd(pool, queues=QUEUES) as schedd:
        for spec in (
            {"name": "t", "command": ["true"], "queue": "c"},
            {"name": "t", "command": ["true"]},  # the "default" queue is not configured
        ):
            status, body = await api_call(schedd, token, "POST", "/v1/jobs", spec)
            assert status == 400
            assert body["field"] == "queue" and body["known"] == ["a", "b"]
            assert body["detail"].endswith("; known: a, b")
        assert await counts(pool) == (0, 0)
        status, body = await api_call(
            schedd, token, "POST", "/v1/jobs", {"name": "t", "command": ["true"], "queue": "b"}
        )
        assert status == 201 and body["queue"] == "b"


async def test_without_queues_any_queue_name_is_accepted(pool: asyncpg.Pool) -> None:
    token = await tokens.create(pool, "alice", "user")
    async with start_schedd(pool) as schedd:
        spec = {"name": "t", "command": ["true"], "queue": "anything/at-all"}
        status, body = await api_call(schedd, token, "POST", "/v1/jobs", spec)
        assert status == 201 and body["queue"] == "anything/at-all"


async def test_queues_show_usage_borrowing_shares_and_waits(pool: asyncpg.Pool) -> None:
    bob = await tokens.create(pool, "bob", "user")
    async with start_schedd(pool, policy="drf", queues=QUEUES) as schedd:
        status, _ = await api_call(schedd, None, "GET", "/v1/queues")
        assert status == 401
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        ids = []
        for _ in range(2):  # each asks 600 MiB of its GPU's memory
            spec = {
                "name": "t",
                "command": ["true"],
                "queue": "b",
                "cpus": 2,
                "gpu_memory_mib": 600,
            }
            status, body = await api_call(schedd, bob, "POST", "/v1/jobs", spec)
            ids.append(body["id"])
            await agent.start(await agent.expect(p.Launch))
        for job_id in ids:
            await state_becomes(schedd.hub.pool, job_id, "running")
        spec = {"name": "t", "command": ["true"], "queue": "b"}
        status, body = await api_call(schedd, bob, "POST", "/v1/jobs", spec)
        waiting_id = body["id"]
        async with asyncio.timeout(5):
            while schedd.scheduler.why_pending(waiting_id).code == "not_considered":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # The report counts its own totals: those the plans keep (which a large plan
        # reads in a worker thread meanwhile) stay as the last plan left them.
        kept_by_plans = placed_totals._kept.placed
        status, body = await api_call(schedd, bob, "GET", "/v1/queues")
        assert status == 200 and placed_totals._kept.placed is kept_by_plans
        queues = {q["name"]: q for q in body["queues"]}
        assert set(queues) == {"a", "b"}
        b = queues["b"]
        assert b["guarantee"] == {"gpus": 1, "cpus": 0.0, "memory_mib": 0, "gpu_memory_mib": 500}
        assert b["max"] == {"gpus": 2, "cpus": None, "memory_mib": None, "gpu_memory_mib": 2000}
        assert b["usage"] == {"gpus": 2, "cpus": 4.0, "memory_mib": 2048, "gpu_memory_mib": 1200}
        assert b["borrowed"] == {"gpus": 1, "cpus": 4.0, "memory_mib": 2048, "gpu_memory_mib": 700}
        assert (b["weight"], b["pending"], b["configured"]) == (2.0, 1, True)
        assert b["waiting"] == {"queue_max": 1}  # b holds its max of 2 GPUs
        # DRF: b holds the whole cluster's 2 GPUs, at weight 2 that is a share of 0.5.
        assert b["fair_share"] >= 0.5
        a = queues["a"]
        assert (a["usage"]["gpus"], a["borrowed"]["gpus"], a["pending"], a["fair_share"]) == (
            0,
            0,
            0,
            0.0,
        )
        assert body["cluster"]["gpus"] == 2 and body["policy"] == "drf"
        assert body["last_cycle"]["waiting"] == {"queue_max": 1}
        await agent.close()


async def test_a_blocked_job_shows_its_reservation(pool: asyncpg.Pool) -> None:
    alice = await tokens.create(pool, "alice", "user")
    profiles = {"backfill": ProfileConfig(settings={"reserve_after_s": 0})}
    async with start_schedd(pool, policy="backfill", profiles=profiles) as schedd:
        agent = await FakeAgent(schedd.server).connect(hub=schedd.hub)
        spec = {"name": "t", "command": ["true"], "gpus": 1, "estimated_runtime_s": 600}
        status, body = await api_call(schedd, alice, "POST", "/v1/jobs", spec)
        await agent.start(await agent.expect(p.Launch))
        await state_becomes(pool, body["id"], "running")
        status, body = await api_call(
            schedd, alice, "POST", "/v1/jobs", {"name": "big", "command": ["true"], "gpus": 2}
        )
        big = body["id"]
        async with asyncio.timeout(5):
            while schedd.scheduler.why_pending(big).code != "reserved":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        status, job = await api_call(schedd, alice, "GET", f"/v1/jobs/{big}")
        assert status == 200
        assert job["pending_reason"]["code"] == "reserved"
        assert job["reservation"]["node_ids"] == ["n1"]
        assert job["reservation"]["expected_start"]
        await agent.close()
