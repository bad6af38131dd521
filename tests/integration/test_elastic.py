"""Elastic jobs (Gandiva's grow/shrink) in the live system, through scripted agents: an
elastic job starts on fewer GPUs where that is all there is, and the count it got is
what it holds and is charged for; a plan's Resize is recorded with its target GPUs (the
snapshot shows the job migrating and holding them), its checkpointed exit requeues it
pinned to the node with the new count, and it is launched there to resume from its
checkpoint on that many GPUs: a grow into GPUs left idle, a shrink to make room for a
waiting job. A resize that cannot happen holds nothing afterwards."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import msgspec
import pytest

from schedd.policy.actions import Launch, Plan, Resize
from schedd.policy.snapshot import MIGRATING, PlacedJob, Shard
from schedd.store import jobs, tokens
from shared import protocol as p
from shared.config import ProfileConfig
from shared.model import JobSpec
from tests.integration.fake_agent import FakeAgent, state_becomes
from tests.integration.inprocess import Schedd, start_schedd

CHECKPOINT = "/ck/step-000000007"


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    # No minimum run before a resize: these jobs have run for a moment only.
    moves = ProfileConfig(settings={"min_run_s": 0.0})
    async with start_schedd(pool, policy="gandiva", profiles={"gandiva": moves}) as s:
        yield s


async def agent_on(schedd: Schedd, node_id: str, *reports: p.JobReport, gpus: int = 2) -> FakeAgent:
    """A scripted agent with GPUs named after its node (`n1-g0`, `n1-g1`, ...)."""
    agent = FakeAgent(schedd.server, node_id, gpus=gpus)
    named = [msgspec.structs.replace(g, uuid=f"{node_id}-g{g.index}") for g in agent.inventory.gpus]
    agent.inventory = msgspec.structs.replace(agent.inventory, gpus=named)
    return await agent.connect(*reports, hub=schedd.hub)


async def submit(
    schedd: Schedd,
    pool: asyncpg.Pool,
    gpus: int = 1,
    min_gpus: int | None = None,
    estimate_s: float | None = None,
) -> str:
    spec = JobSpec(
        name="train", command=["train"], gpus=gpus, min_gpus=min_gpus,
        estimated_runtime_s=estimate_s,
    )  # fmt: skip
    row, _ = await jobs.submit(pool, "alice", spec, None)
    schedd.scheduler.wake()
    return str(row["id"])


async def started(agent: FakeAgent, pool: asyncpg.Pool, job_id: str) -> p.Launch:
    launch = await agent.expect(p.Launch)
    assert launch.job_id == job_id
    await agent.start(launch)
    await state_becomes(pool, job_id, "running")
    return launch


async def stepping(agent: FakeAgent, pool: asyncpg.Pool, job_id: str, attempt: int = 1) -> None:
    """The job's shim reports mini-batches: it can save a checkpoint on request."""
    await agent.send(
        p.JobProgress(job_id=job_id, attempt=attempt, step=7, steps_per_s=10.0, step_wall_s=0.1)
    )
    async with asyncio.timeout(5):
        while (await jobs.get(pool, job_id))["checkpointable"] is not True:  # type: ignore[index]  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def checkpointed(agent: FakeAgent, job_id: str, attempt: int = 1) -> None:
    """The job saves its checkpoint and exits, as its shim does on request."""
    await agent.send(
        p.JobControlled(
            job_id=job_id, attempt=attempt, event="checkpointed", step=7,
            detail="checkpoint of step 7 saved", path=CHECKPOINT,
        )
    )  # fmt: skip
    await agent.send(
        p.JobExited(job_id=job_id, attempt=attempt, exit_code=85, checkpoint=CHECKPOINT)
    )
    await agent.expect(p.ExitAck)


async def placed(schedd: Schedd) -> dict[str, PlacedJob]:
    return {j.job_id: j for j in await schedd.scheduler.placed_now()}


async def reasons(pool: asyncpg.Pool, job_id: str) -> list[str]:
    return [e["reason"] for e in await jobs.events(pool, job_id)]


async def api_get(schedd: Schedd, pool: asyncpg.Pool, path: str) -> dict[str, Any]:
    token = await tokens.create(pool, "alice", "admin")
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            schedd.server.make_url(path), headers={"Authorization": f"Bearer {token}"}
        ) as resp,
    ):
        assert resp.status == 200
        return dict(await resp.json())


async def test_an_elastic_job_starts_on_fewer_gpus_and_grows_into_idle_ones(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    n1 = await agent_on(schedd, "n1", gpus=4)
    other = await submit(schedd, pool, gpus=2)
    await started(n1, pool, other)

    # It asks for 4 GPUs, 1 at least: two are free, so it starts on two.
    elastic = await submit(schedd, pool, gpus=4, min_gpus=1, estimate_s=3600.0)
    launch = await started(n1, pool, elastic)
    assert len(launch.gpu_uuids) == 2
    row = await jobs.get(pool, elastic)
    assert row is not None and (row["gpus"], row["min_gpus"], row["max_gpus"]) == (2, 1, 4)
    assert any("elastic, on 2 of its 4 GPUs" in r for r in await reasons(pool, elastic))
    seen = (await placed(schedd))[elastic]
    assert (seen.request.gpus, seen.gpu_range, seen.state) == (2, (1, 4), "running")
    shown = await api_get(schedd, pool, f"/v1/jobs/{elastic}")
    assert (shown["gpus"], shown["gpu_range"]) == (2, [1, 4])
    # What it holds and is charged for is the count it got: 2 + 2 of the node's 4.
    queues = await api_get(schedd, pool, "/v1/queues")
    (default,) = [q for q in queues["queues"] if q["name"] == "default"]
    assert default["usage"]["gpus"] == 4

    # The other job ends with none waiting: the elastic job grows into its GPUs, which
    # are held for it (the snapshot shows it migrating) while it saves its checkpoint.
    await stepping(n1, pool, elastic)
    await n1.send(p.JobExited(job_id=other, attempt=1, exit_code=0))
    await n1.expect(p.ExitAck)
    ask = await n1.expect(p.Checkpoint)
    assert (ask.job_id, ask.attempt) == (elastic, 1)
    row = await jobs.get(pool, elastic)
    assert row is not None and row["state"] == "running"
    target = sorted(row["migrate_gpu_uuids"])
    assert (row["resize_to"], row["migrate_to"], target) == (
        4,
        "n1",
        [f"n1-g{i}" for i in range(4)],
    )
    moving = (await placed(schedd))[elastic]
    assert moving.state == MIGRATING
    assert moving.shards == (Shard("n1", tuple(launch.gpu_uuids)),)
    assert moving.moving_to == (Shard("n1", tuple(row["migrate_gpu_uuids"])),)
    shown = await api_get(schedd, pool, f"/v1/jobs/{elastic}")
    assert shown["resizing_to"] == 4 and sorted(shown["resizing_to_gpus"]) == target
    assert "migrating_to" not in shown
    asked = "resize from 2 to 4 GPUs on node n1 asked by the scheduler: grows into 2 idle GPU(s)"
    assert any(r.startswith(asked) for r in await reasons(pool, elastic))

    # Saved and exited: requeued pinned to n1 with 4 GPUs, launched there from its
    # checkpoint on all four.
    await checkpointed(n1, elastic)
    relaunch = await n1.expect(p.Launch)
    assert (relaunch.job_id, relaunch.attempt) == (elastic, 2)
    assert relaunch.resume_from == CHECKPOINT and len(relaunch.gpu_uuids) == 4
    await n1.start(relaunch)
    row = await state_becomes(pool, elastic, "running")
    assert (row["gpus"], row["resize_to"], row["migrate_to"], row["pin_node_id"]) == (
        4, None, None, None,
    )  # fmt: skip
    history = [
        (e["from_state"], e["to_state"], e["reason"]) for e in await jobs.events(pool, elastic)
    ]
    assert (
        "running",
        "pending",
        f"resizing from 2 to 4 GPUs on node n1: resumes from {CHECKPOINT}",
    ) in history
    # Its first run counted on its 2 GPUs.
    (run,) = await pool.fetch("SELECT gpus FROM job_runs WHERE job_id = $1", elastic)
    assert run["gpus"] == 2
    await n1.close()


async def test_an_elastic_job_shrinks_to_make_room_for_a_waiting_job(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    n1 = await agent_on(schedd, "n1")
    elastic = await submit(schedd, pool, gpus=2, min_gpus=1, estimate_s=3600.0)
    launch = await started(n1, pool, elastic)
    assert len(launch.gpu_uuids) == 2
    await stepping(n1, pool, elastic)

    # A job of one GPU finds none free, and no job of one GPU to take turns with: the
    # elastic job shrinks to one, keeping the first of its GPUs.
    waiting = await submit(schedd, pool, gpus=1)
    await n1.expect(p.Checkpoint)
    row = await jobs.get(pool, elastic)
    assert row is not None
    kept = [launch.gpu_uuids[0]]
    assert (row["resize_to"], row["migrate_to"], row["migrate_gpu_uuids"]) == (1, "n1", kept)
    moving = (await placed(schedd))[elastic]
    assert (moving.state, moving.moving_to) == (MIGRATING, (Shard("n1", tuple(kept)),))
    asked = (
        "resize from 2 to 1 GPUs on node n1 asked by the scheduler: shrinks to 1 GPU(s) to"
        f" make room on node n1 for job {waiting}"
    )
    assert any(r.startswith(asked) for r in await reasons(pool, elastic))
    assert (await jobs.get(pool, waiting))["state"] == "pending"  # type: ignore[index]

    # Saved and exited: it restarts on one GPU from its checkpoint, the waiting job on
    # the other.
    await checkpointed(n1, elastic)
    launches = {m.job_id: m for m in [await n1.expect(p.Launch), await n1.expect(p.Launch)]}
    again = launches[elastic]
    assert (again.attempt, len(again.gpu_uuids), again.resume_from) == (2, 1, CHECKPOINT)
    assert len(launches[waiting].gpu_uuids) == 1
    assert set(again.gpu_uuids).isdisjoint(launches[waiting].gpu_uuids)
    await n1.start(again)
    row = await state_becomes(pool, elastic, "running")
    assert row["gpus"] == 1
    seen = (await placed(schedd))[elastic]
    assert (seen.request.gpus, seen.gpu_range) == (1, (1, 2))
    await n1.close()


async def test_a_resize_that_cannot_happen_holds_nothing(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    scheduler = schedd.scheduler
    # The scheduler plans nothing by itself: the test's launches and resizes go through
    # the executor as a plan's do.
    scheduler.profile = dataclasses.replace(scheduler.profile, plan=lambda s, n: Plan())
    execute = scheduler.executor.execute
    n1 = await agent_on(schedd, "n1")
    job_id = await submit(schedd, pool, gpus=2, min_gpus=1)
    shards = (Shard("n1", ("n1-g0",)),)
    assert await execute(Launch(job_id, shards, "elastic, on 1 of its 2 GPUs"))
    launch = await n1.expect(p.Launch)
    assert launch.gpu_uuids == ["n1-g0"]
    await n1.start(launch)
    await state_becomes(pool, job_id, "running")
    await stepping(n1, pool, job_id)
    grow = Resize(job_id, 2, "grows", "n1", ("n1-g0", "n1-g1"))

    # Outside its range, or on another count of GPUs than it names: refused, nothing
    # recorded.
    assert not await execute(Resize(job_id, 3, "grows", "n1", ("n1-g0", "n1-g1", "x")))
    assert not await execute(Resize(job_id, 2, "grows", "n1", ("n1-g0",)))
    assert (await jobs.get(pool, job_id))["resize_to"] is None  # type: ignore[index]

    # Its shim fails to save: the resize is called off, nothing is held for it.
    assert await execute(grow)
    await n1.expect(p.Checkpoint)
    assert (await placed(schedd))[job_id].moving_to == (Shard("n1", ("n1-g0", "n1-g1")),)
    assert not await execute(grow)  # one under way already
    await n1.send(
        p.JobControlled(
            job_id=job_id, attempt=1, event="checkpoint_failed", step=9,
            detail="CheckpointError: no save function",
        )
    )  # fmt: skip
    async with asyncio.timeout(5):
        while (row := await jobs.get(pool, job_id)) and row["resize_to"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert row is not None and row["migrate_to"] is None and row["migrate_gpu_uuids"] is None
    now = (await placed(schedd))[job_id]
    assert (now.state, now.moving_to, now.request.gpus) == ("running", (), 1)
    words = "checkpoint_failed: CheckpointError: no save function; resize to 2 GPUs called off"
    assert words in await reasons(pool, job_id)

    # The link drops between the resize's commit and its send: called off again.

    async def dropped(node_id: str, msg: p.Msg) -> bool:
        return False

    hub_send, schedd.hub.send = schedd.hub.send, dropped  # type: ignore[method-assign]
    try:
        assert not await execute(grow)
    finally:
        schedd.hub.send = hub_send  # type: ignore[method-assign]
    row = await jobs.get(pool, job_id)
    assert row is not None and row["resize_to"] is None and row["migrate_to"] is None
    said = await reasons(pool, job_id)
    assert said[-1] == "resize to 2 GPUs called off: node n1 is not connected", said[-2:]

    # Lost with its node while it resizes: requeued with its most GPUs again (a requeue
    # that is not a resize gives an elastic job its whole range back), nothing held.
    assert await execute(grow)
    await n1.expect(p.Checkpoint)
    await n1.close()
    n1 = await agent_on(schedd, "n1")
    row = await state_becomes(pool, job_id, "pending")
    assert (row["gpus"], row["resize_to"], row["migrate_to"]) == (2, None, None)
    await n1.close()
