"""Jobs spread over nodes (gangs) in the live system, through scripted agents on real
websockets: one part launched per node with where the head listens, the job running
from its first part's start and ending with its last, a failed part stopping the
others, a lost node requeueing the job, cancels reaching every part, and what the API
shows and refuses."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest

from schedd.policy.actions import Migrate, Plan, Preempt
from schedd.policy.snapshot import Snapshot
from schedd.store import jobs, tokens
from shared import protocol as p
from shared.model import JobSpec
from tests.integration.fake_agent import (
    FakeAgent,
    agent_on,
    exited,
    reasons,
    state_becomes,
    stepping,
)
from tests.integration.inprocess import (
    Schedd,
    api_call,
    api_get,
    sends_lost,
    start_gandiva,
    start_schedd,
    waits_with,
)

ALICE = "alice"
SAMPLES = "SELECT gpu_util_samples FROM jobs WHERE id = $1"


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    async with start_schedd(pool, node_lost_after_s=0.3, kill_grace_s=5.0) as s:
        yield s


@pytest.fixture
async def nodes(schedd: Schedd) -> AsyncIterator[list[FakeAgent]]:
    """Two nodes of two GPUs each, connected and ready."""
    agents = [await agent_on(schedd, "n1"), await agent_on(schedd, "n2")]
    yield agents
    for agent in agents:
        await agent.close()


async def submit_gang(schedd: Schedd, pool: asyncpg.Pool) -> str:
    """A 4-GPU job with 4 CPUs and 2 GiB: larger than either 2-GPU node."""
    spec = JobSpec(name="ddp", command=["train"], gpus=4, cpus=4, memory_mib=2048)
    row, _ = await jobs.submit(pool, ALICE, spec, None)
    schedd.scheduler.wake()
    return str(row["id"])


async def launched(
    schedd: Schedd, pool: asyncpg.Pool, agents: list[FakeAgent]
) -> tuple[str, dict[int, tuple[FakeAgent, p.Launch]]]:
    """A gang placed over both nodes: each part's agent and launch by rank."""
    job_id = await submit_gang(schedd, pool)
    by_rank = {}
    for agent in agents:
        launch = await agent.expect(p.Launch)
        assert launch.job_id == job_id and launch.gang is not None
        by_rank[launch.gang.rank] = (agent, launch)
    return job_id, by_rank


async def start_all(
    pool: asyncpg.Pool, job_id: str, parts: dict[int, tuple[FakeAgent, p.Launch]]
) -> None:
    for agent, launch in parts.values():
        await agent.start(launch)
    await state_becomes(pool, job_id, "running")


async def test_a_job_larger_than_a_node_runs_as_one_part_per_node(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    assert sorted(parts) == [0, 1]
    (head, first), (other, second) = parts[0], parts[1]
    # Each part has its node's two GPUs, half the CPUs and memory, and the same head.
    assert first.gpu_uuids == [f"{head.node_id}-g0", f"{head.node_id}-g1"]
    assert second.gpu_uuids == [f"{other.node_id}-g0", f"{other.node_id}-g1"]
    assert (first.cpus, first.memory_mib, second.cpus, second.memory_mib) == (2, 1024, 2, 1024)
    assert first.gang is not None and second.gang is not None
    assert (first.gang.size, second.gang.size) == (2, 2)
    assert first.gang.head == second.gang.head == schedd.hub.links[head.node_id].address != ""
    assert first.gang.port == second.gang.port
    assert first.argv == second.argv == ["train"] and first.attempt == second.attempt == 1

    # Running from its first part's start.
    await head.start(first)
    row = await state_becomes(pool, job_id, "running")
    assert row["node_id"] == head.node_id and len(row["gpu_uuids"]) == 4 and row["gpus"] == 4
    await other.start(second)
    token = await tokens.create(pool, ALICE, "user")
    shown = await api_get(schedd, token, f"/v1/jobs/{job_id}")
    assert [(x["rank"], x["node_id"]) for x in shown["placement"]["parts"]] == [
        (0, head.node_id),
        (1, other.node_id),
    ]
    assert all(
        x["started_at"] is not None and x["ended_at"] is None for x in shown["placement"]["parts"]
    )
    # The scheduler sees one job holding both nodes' GPUs, a shard on each.
    (placed,) = await schedd.scheduler.placed_now()
    assert [(s.node_id, len(s.gpu_uuids)) for s in placed.shards] == [
        (head.node_id, 2),
        (other.node_id, 2),
    ]

    # One part done: the job runs on until the other is.
    await exited(other, job_id, exit_code=0)
    assert (await jobs.get(pool, job_id))["state"] == "running"
    await exited(head, job_id, exit_code=0)
    row = await state_becomes(pool, job_id, "succeeded")
    assert row["exit_code"] == 0
    assert (await reasons(pool, job_id))[-1] == "every part exited with code 0"


async def test_a_failed_part_stops_the_others_and_the_job_fails_with_its_words(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    (head, _), (other, _) = parts[0], parts[1]
    await exited(other, job_id, exit_code=3)
    kill = await head.expect(p.Kill)
    words = f"part 1 on node {other.node_id}: exited with code 3"
    assert (kill.job_id, kill.attempt, kill.grace_s) == (job_id, 1, 5.0)
    assert kill.reason == f"gang broken: {words}"
    # It holds the head's GPUs until that part has stopped too.
    assert (await jobs.get(pool, job_id))["state"] == "running"
    await exited(head, job_id, signal=15)
    row = await state_becomes(pool, job_id, "failed")
    assert (row["exit_code"], row["exit_signal"], row["reason"]) == (3, None, words)


async def test_a_part_that_cannot_start_fails_the_job_likewise(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    (head, first), (other, _) = parts[0], parts[1]
    await head.start(first)
    await state_becomes(pool, job_id, "running")
    await other.send(p.JobFailed(job_id=job_id, attempt=1, reason="cannot run train: not found"))
    await other.expect(p.ExitAck)
    assert (await head.expect(p.Kill)).job_id == job_id
    await exited(head, job_id, signal=15)
    row = await state_becomes(pool, job_id, "failed")
    assert row["reason"] == f"part 1 on node {other.node_id}: cannot run train: not found"


async def test_a_cancel_reaches_every_part_and_ends_with_the_last(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    token = await tokens.create(pool, ALICE, "user")
    status, _ = await api_call(schedd, token, "POST", f"/v1/jobs/{job_id}/cancel")
    assert status == 202
    for agent, _ in parts.values():
        assert (await agent.expect(p.Kill)).job_id == job_id
    (head, _), (other, _) = parts[0], parts[1]
    await exited(head, job_id, signal=15)
    assert (await jobs.get(pool, job_id))["state"] == "cancelling"
    await exited(other, job_id, signal=15)
    await state_becomes(pool, job_id, "cancelled")


@pytest.mark.parametrize("how", ["node lost", "reconnects without it"])
async def test_a_part_lost_with_its_node_stops_the_others_and_requeues_the_job(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent], how: str
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    (head, _), (other, _) = parts[0], parts[1]
    if how == "node lost":
        await other.close()  # gone for longer than node_lost_after_s
        lost = f"node {other.node_id} lost for 0.3s"
    else:
        # The agent restarted and no longer knows the part (its state was wiped).
        await other.close()
        other = await FakeAgent(schedd.server, other.node_id).connect(hub=schedd.hub)
        lost = f"node {other.node_id} does not know it (lost)"
    kill = await head.expect(p.Kill)
    words = f"part 1 on node {other.node_id}: {lost}"
    assert kill.reason == f"gang broken: {words}"
    row = await state_becomes(pool, job_id, "preempting")
    assert row["reason"] == words
    await exited(head, job_id, signal=15)
    row = await state_becomes(pool, job_id, "pending")
    assert row["reason"] == f"requeued ({words}): every part has stopped"
    assert row["node_id"] is None and list(row["gpu_uuids"]) == []
    if how == "reconnects without it":
        # Both nodes are back: it is placed again, as a new attempt, on both.
        for agent in (head, other):
            again = await agent.expect(p.Launch)
            assert (again.job_id, again.attempt) == (job_id, 2)


async def test_controls_are_refused_for_a_gang_and_logs_are_read_by_rank(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    token = await tokens.create(pool, ALICE, "user")
    status, body = await api_call(schedd, token, "POST", f"/v1/jobs/{job_id}/suspend")
    assert status == 409
    assert body["detail"] == (
        f"cannot suspend job {job_id}: it runs on 2 nodes, and job controls act on jobs on"
        " one node only"
    )
    assert (await jobs.get(pool, job_id))["controls"] is None  # nothing changed

    status, body = await api_call(schedd, token, "GET", f"/v1/jobs/{job_id}/logs?rank=2")
    assert (status, body["field"]) == (422, "rank")
    assert body["reason"] == f"job {job_id} runs as 2 part(s): ranks 0 to 1"

    # Rank 1's logs come from its node.
    other, _ = parts[1]
    reading = asyncio.create_task(logs(schedd, token, f"/v1/jobs/{job_id}/logs?rank=1"))
    ask = await other.expect(p.LogRequest)
    assert (ask.job_id, ask.attempt) == (job_id, 1)
    await other.send(p.LogChunk(request_id=ask.request_id, data="rank 1 here\n", eof=True))
    assert await reading == "rank 1 here\n"


async def logs(schedd: Schedd, token: str, path: str) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(schedd.server.make_url(path), headers={"Authorization": f"Bearer {token}"}) as r,
    ):
        assert r.status == 200
        return await r.text()


async def test_parts_that_end_at_once_still_settle_the_job(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    """Each node's report is handled on its own connection: the last part's ending must
    see the other's, whichever commits first."""
    for _ in range(3):
        job_id, parts = await launched(schedd, pool, nodes)
        await start_all(pool, job_id, parts)
        await asyncio.gather(
            *(a.send(p.JobExited(job_id=job_id, attempt=1, exit_code=0)) for a, _ in parts.values())
        )
        for agent, _ in parts.values():
            await agent.expect(p.ExitAck)
        await state_becomes(pool, job_id, "succeeded")


async def test_every_parts_gpu_samples_count_toward_the_jobs_usage(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    for rank, memory in ((1, 7000), (0, 3000)):
        agent, launch = parts[rank]
        samples = [
            p.GpuSample(uuid=u, utilization_pct=90, memory_used_mib=memory)
            for u in launch.gpu_uuids
        ]
        await agent.send(p.GpuState(samples=samples))
    async with asyncio.timeout(5):
        while await pool.fetchval(SAMPLES, job_id) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    row = await pool.fetchrow("SELECT gpu_memory_peak_mib FROM jobs WHERE id = $1", job_id)
    assert row["gpu_memory_peak_mib"] == 7000  # the busiest GPU, on the other part's node


async def test_a_preempted_gang_is_requeued_once_every_part_has_stopped(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    await stepping(parts[0][0], pool, job_id)  # its shim reports mini-batches
    reason = "preempted: queue a reclaims its guarantee for job j-x"
    assert await schedd.scheduler.executor.execute(Preempt(job_id, reason))
    for agent, _ in parts.values():
        kill = await agent.expect(p.Kill)
        # Not asked to save first: each part would save on its own, at its own step.
        assert (kill.job_id, kill.reason, kill.checkpoint_s) == (job_id, reason, 0)
        await exited(agent, job_id, signal=15)
    row = await state_becomes(pool, job_id, "pending")
    assert row["reason"] == f"requeued ({reason}): every part has stopped"


async def test_a_part_whose_kill_was_lost_is_killed_when_its_node_reports_it_again(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    (head, _), (other, _) = parts[0], parts[1]
    with sends_lost(schedd):  # the break-up's kill to the head never arrives
        await other.send(p.JobExited(job_id=job_id, attempt=1, exit_code=3))
        await state_becomes_part_ended(pool, job_id, rank=1)
    # The head's agent reconnects, still running its part: killed now.
    await head.close()
    head = await FakeAgent(schedd.server, head.node_id).connect(
        p.JobReport(job_id=job_id, attempt=1, status="running")
    )
    kill = await head.expect(p.Kill)
    assert kill.reason == f"gang broken: part 1 on node {other.node_id}: exited with code 3"
    await exited(head, job_id, signal=15)
    row = await state_becomes(pool, job_id, "failed")
    assert row["exit_code"] == 3
    await head.close()


async def test_a_gang_broken_by_a_failure_fails_even_if_a_node_is_lost_after(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    job_id, parts = await launched(schedd, pool, nodes)
    await start_all(pool, job_id, parts)
    (head, _), (other, _) = parts[0], parts[1]
    with sends_lost(schedd):
        await other.send(p.JobExited(job_id=job_id, attempt=1, exit_code=3))
        await state_becomes_part_ended(pool, job_id, rank=1)
    await head.close()  # and never comes back: its part is lost
    row = await state_becomes(pool, job_id, "failed")
    assert row["reason"] == f"part 1 on node {other.node_id}: exited with code 3"


async def test_after_a_restart_a_part_on_a_node_that_never_returns_is_lost(
    pool: asyncpg.Pool,
) -> None:
    async with start_schedd(pool) as first:
        agents = [await agent_on(first, "n1"), await agent_on(first, "n2")]
        job_id, parts = await launched(first, pool, agents)
        await start_all(pool, job_id, parts)
    # schedd restarts; only the head's node comes back.
    (head, _), (other, _) = parts[0], parts[1]
    for agent in agents:
        await agent.close()
    async with start_schedd(pool, node_lost_after_s=0.3, kill_grace_s=5.0) as second:
        back = await FakeAgent(second.server, head.node_id).connect(
            p.JobReport(job_id=job_id, attempt=1, status="running"), hub=second.hub
        )
        kill = await back.expect(p.Kill)
        lost = f"part 1 on node {other.node_id}: node {other.node_id} lost for 0.3s"
        assert kill.reason == f"gang broken: {lost}"
        await exited(back, job_id, signal=15)
        await state_becomes(pool, job_id, "pending")
        await back.close()


async def test_a_job_that_a_node_away_could_hold_waits_for_it(
    schedd: Schedd, pool: asyncpg.Pool, nodes: list[FakeAgent]
) -> None:
    """A 4-GPU node restarts: a 4-GPU job waits for it rather than split over the two
    2-GPU nodes, and runs there, whole, once it is back."""
    big = await agent_on(schedd, "big", gpus=4)
    await big.close()
    job_id = await submit_gang(schedd, pool)
    assert "waits for a node of 4 that is away" in await waits_with(schedd, job_id, "node_away")
    big = await agent_on(schedd, "big", gpus=4)
    launch = await big.expect(p.Launch)
    assert (launch.job_id, launch.gang, len(launch.gpu_uuids)) == (job_id, None, 4)
    await big.close()


async def state_becomes_part_ended(pool: asyncpg.Pool, job_id: str, rank: int) -> None:
    async with asyncio.timeout(5):
        while not await pool.fetchval(  # noqa: ASYNC110
            "SELECT ended_at IS NOT NULL FROM job_parts WHERE job_id = $1 AND rank = $2",
            job_id,
            rank,
        ):
            await asyncio.sleep(0.01)


async def test_a_gang_is_never_planned_to_move(pool: asyncpg.Pool) -> None:
    """Job controls act on one node, so a gang cannot save a checkpoint on request: the
    snapshot says so, and gandiva's gather plans no move of it onto a node that joins
    large enough to hold it whole (it planned one, refused, every cycle)."""
    async with start_gandiva(pool, min_run_s=0.0) as schedd:
        agents = [await agent_on(schedd, "n1"), await agent_on(schedd, "n2")]
        job_id, parts = await launched(schedd, pool, agents)
        await start_all(pool, job_id, parts)
        await stepping(parts[0][0], pool, job_id)  # its shim reports mini-batches
        (gang,) = await schedd.scheduler.placed_now()
        assert len(gang.shards) == 2 and not gang.checkpointable

        scheduler = schedd.scheduler
        real = scheduler.profile.plan
        seen: list[tuple[frozenset[str], list[object]]] = []

        def recording(snapshot: Snapshot, now: float) -> Plan:
            plan = real(snapshot, now)
            seen.append((frozenset(n.node_id for n in snapshot.nodes), list(plan.actions)))
            return plan

        scheduler.profile = dataclasses.replace(scheduler.profile, plan=recording)
        big = await agent_on(schedd, "big", gpus=4)
        async with asyncio.timeout(5):
            while not any("big" in nodes for nodes, _ in seen):  # noqa: ASYNC110 - the plans' own record
                await asyncio.sleep(0.01)
        assert not [a for _, actions in seen for a in actions if isinstance(a, Migrate)]
        assert (await jobs.get(pool, job_id))["state"] == "running"  # type: ignore[index]
        for agent in (*agents, big):
            await agent.close()
