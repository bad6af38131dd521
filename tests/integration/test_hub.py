"""The agent hub over real websockets, with a scripted agent as the peer."""

from __future__ import annotations

import asyncio

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from schedd.store import jobs
from shared import protocol as p
from shared.model import JobSpec, JobState
from tests.integration.inprocess import JOIN_TOKEN, Schedd, start_schedd

INVENTORY = p.Inventory(
    gpus=[p.GpuInfo(index=i, uuid=f"GPU-{i}", model="Sim", memory_mib=1000) for i in range(2)],
    cpus=8,
    memory_mib=16000,
)


async def connect(server: TestServer, token: str = JOIN_TOKEN) -> aiohttp.ClientWebSocketResponse:
    session = aiohttp.ClientSession()
    ws = await session.ws_connect(
        server.make_url("/v1/agents/ws"), headers={"Authorization": f"Bearer {token}"}
    )
    ws._test_session = session  # type: ignore[attr-defined]  # closed with the socket below
    return ws


async def close(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.close()
    await ws._test_session.close()  # type: ignore[attr-defined]


async def hello(ws: aiohttp.ClientWebSocketResponse, *reports: p.JobReport) -> None:
    await ws.send_bytes(
        p.encode(
            p.Hello(
                protocol=p.PROTOCOL_VERSION, node_id="n1", inventory=INVENTORY, jobs=list(reports)
            )
        )
    )
    assert isinstance(p.decode_from_sched((await ws.receive(timeout=5)).data), p.Welcome)


async def next_msg(ws: aiohttp.ClientWebSocketResponse) -> p.SchedMessage:
    return p.decode_from_sched((await ws.receive(timeout=5)).data)


async def state_becomes(pool: asyncpg.Pool, job_id: str, state: str) -> asyncpg.Record:
    """Reconciliation runs just after the welcome: wait for it, boundedly."""
    async with asyncio.timeout(5):
        while (row := await jobs.get(pool, job_id))["state"] != state:  # noqa: ASYNC110 - a row
            await asyncio.sleep(0.01)
    return row


async def submit(pool: asyncpg.Pool, gpus: int = 1) -> str:
    row, _ = await jobs.submit(pool, "alice", JobSpec(name="t", command=["true"], gpus=gpus), None)
    return str(row["id"])


async def test_wrong_join_token_is_refused(schedd: Schedd) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await session.ws_connect(
                schedd.server.make_url("/v1/agents/ws"), headers={"Authorization": "Bearer nope"}
            )
    assert err.value.status == 401
    assert schedd.hub.links == {}


async def test_another_protocol_version_is_closed(schedd: Schedd) -> None:
    ws = await connect(schedd.server)
    await ws.send_bytes(
        p.encode(p.Hello(protocol=p.PROTOCOL_VERSION + 1, node_id="n1", inventory=INVENTORY))
    )
    msg = await ws.receive(timeout=5)
    assert msg.type == aiohttp.WSMsgType.CLOSE
    assert ws.close_code == p.CLOSE_PROTOCOL_MISMATCH
    await close(ws)


async def test_a_launch_follows_the_hello_and_events_drive_the_job(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    job_id = await submit(pool)
    ws = await connect(schedd.server)
    await hello(ws)
    launch = await next_msg(ws)
    assert isinstance(launch, p.Launch) and launch.job_id == job_id and launch.attempt == 1
    await ws.send_bytes(p.encode(p.JobStarted(job_id=job_id, attempt=1, pid=10)))
    await ws.send_bytes(p.encode(p.JobExited(job_id=job_id, attempt=1, exit_code=0)))
    ack = await next_msg(ws)
    assert ack == p.ExitAck(job_id=job_id, attempt=1, final=True)  # no attempt after it
    row = await jobs.get(pool, job_id)
    assert (row["state"], row["exit_code"]) == ("succeeded", 0)
    await close(ws)


async def test_a_job_the_agent_does_not_know_is_requeued_as_lost(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    job_id = await submit(pool, gpus=3)  # too big for n1: it stays pending after the requeue
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    await jobs.transition(pool, job_id, JobState.RUNNING, "started", attempt=1)
    ws = await connect(schedd.server)
    await hello(ws)  # reports no jobs
    row = await state_becomes(pool, job_id, "pending")
    assert row["node_id"] is None
    last = (await jobs.events(pool, job_id))[-1]
    assert (last["from_state"], last["to_state"]) == ("running", "pending")
    assert "lost" in last["reason"]
    await close(ws)


async def test_a_job_the_agent_runs_against_schedds_wishes_is_killed(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    job_id = await submit(pool, gpus=3)
    await jobs.transition(pool, job_id, JobState.CANCELLED, "cancelled")
    ws = await connect(schedd.server)
    await hello(ws, p.JobReport(job_id=job_id, attempt=1, status="running"))
    kill = await next_msg(ws)
    assert isinstance(kill, p.Kill) and (kill.job_id, kill.attempt) == (job_id, 1)
    await close(ws)


async def test_an_exit_reported_in_the_hello_is_recorded_and_acknowledged(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    job_id = await submit(pool, gpus=3)
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    await jobs.transition(pool, job_id, JobState.RUNNING, "started", attempt=1)
    ws = await connect(schedd.server)
    await hello(ws, p.JobReport(job_id=job_id, attempt=1, status="exited", exit_code=9))
    assert await next_msg(ws) == p.ExitAck(job_id=job_id, attempt=1, final=True)  # failed
    row = await state_becomes(pool, job_id, "failed")
    assert (row["exit_code"], row["attempt"]) == (9, 1)
    await close(ws)


async def test_a_stale_report_does_not_touch_the_new_attempt(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    job_id = await submit(pool, gpus=3)
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    await jobs.transition(pool, job_id, JobState.PENDING, "lost", attempt=1)
    await jobs.transition(pool, job_id, JobState.ASSIGNED, "placed", node_id="n1")
    ws = await connect(schedd.server)
    await hello(ws, p.JobReport(job_id=job_id, attempt=2, status="running"))
    await ws.send_bytes(p.encode(p.JobExited(job_id=job_id, attempt=1, exit_code=1)))
    assert await next_msg(ws) == p.ExitAck(job_id=job_id, attempt=1)
    row = await state_becomes(pool, job_id, "running")
    assert row["attempt"] == 2
    await close(ws)


async def test_bad_messages_are_skipped_and_the_link_stays(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    ws = await connect(schedd.server)
    await hello(ws)
    await ws.send_str("{not json")
    await ws.send_str('{"type": "job_started", "job_id": 1}')
    job_id = await submit(pool)
    schedd.scheduler.wake()
    launch = await next_msg(ws)
    assert isinstance(launch, p.Launch) and launch.job_id == job_id
    assert "n1" in schedd.hub.links
    await close(ws)


async def test_a_cycle_that_used_its_whole_window_plans_again(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from schedd import policy

    fifo = policy.profile("fifo")
    monkeypatch.setitem(policy.PROFILES, "fifo-1", policy.Profile("fifo-1", fifo.plan, 1))
    ids = [await submit(pool) for _ in range(3)]
    async with start_schedd(pool, policy="fifo-1") as schedd:
        ws = await connect(schedd.server)
        await hello(ws)
        # Each cycle reads one job; a cycle that started it plans again at once.
        first, second = await next_msg(ws), await next_msg(ws)
        assert [first.job_id, second.job_id] == ids[:2]  # type: ignore[union-attr]
        await state_becomes(pool, ids[1], "assigned")
        assert schedd.scheduler.why_pending(ids[2]).code in ("no_capacity", "queued")
        await close(ws)


async def test_no_launch_reaches_a_node_before_it_is_welcomed_and_reconciled(
    schedd: Schedd, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = await submit(pool)
    reconcile = schedd.hub._reconcile

    async def slow_reconcile(link: object) -> None:
        # A cycle runs while the node is being reconciled, as after a burst of submissions.
        schedd.scheduler.wake()
        await asyncio.sleep(0.3)
        await reconcile(link)  # type: ignore[arg-type]

    monkeypatch.setattr(schedd.hub, "_reconcile", slow_reconcile)
    ws = await connect(schedd.server)
    await hello(ws)  # the first message is the welcome
    launch = await next_msg(ws)
    assert isinstance(launch, p.Launch) and launch.job_id == job_id
    await ws.send_bytes(p.encode(p.JobStarted(job_id=job_id, attempt=1, pid=10)))
    row = await state_becomes(pool, job_id, "running")
    assert row["attempt"] == 1
    assert not any("lost" in (e["reason"] or "") for e in await jobs.events(pool, job_id))
    await close(ws)


async def test_the_snapshot_shows_each_gpus_busiest_figures_over_the_window(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    ws = await connect(schedd.server)
    await hello(ws)

    def sample(util: int, memory: int) -> p.GpuSample:
        return p.GpuSample(uuid="GPU-0", utilization_pct=util, memory_used_mib=memory)

    await ws.send_bytes(p.encode(p.GpuState(samples=[sample(95, 900)])))
    await ws.send_bytes(p.encode(p.GpuState(samples=[sample(5, 100)])))

    def figures() -> dict[str, tuple[int, int]]:
        return {
            g.uuid: (g.utilization_pct, g.memory_used_mib)
            for n in schedd.scheduler.nodes()
            for g in n.gpus
        }

    # The hub records a report after taking it into the window: once the idle sample is
    # stored, both are in.
    async with asyncio.timeout(5):
        stored = "SELECT utilization_pct FROM gpus WHERE uuid = 'GPU-0'"
        while await pool.fetchval(stored) != 5:  # noqa: ASYNC110 - a row
            await asyncio.sleep(0.01)
    # Busy a moment ago is busy for the policy, though the last sample is idle; a GPU
    # never sampled reads as idle.
    assert figures() == {"GPU-0": (95, 900), "GPU-1": (0, 0)}
    await close(ws)
