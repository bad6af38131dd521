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

import asyncpg
import pytest

from schedd.policy.actions import Launch, Plan, Resize
from schedd.policy.snapshot import MIGRATING, Shard
from schedd.store import jobs, tokens
from shared import protocol as p
from tests.integration.fake_agent import (
    CHECKPOINT,
    agent_on,
    checkpointed,
    exited,
    reasons,
    save_failed,
    started,
    state_becomes,
    stepping,
)
from tests.integration.inprocess import (
    Schedd,
    api_get,
    placed,
    sends_lost,
    start_gandiva,
    submit,
)


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    # No minimum run before a resize: these jobs have run for a moment only.
    async with start_gandiva(pool, min_run_s=0.0) as s:
        yield s


async def test_an_elastic_job_starts_on_fewer_gpus_and_grows_into_idle_ones(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    admin = await tokens.create(pool, "alice", "admin")
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
    shown = await api_get(schedd, admin, f"/v1/jobs/{elastic}")
    assert (shown["gpus"], shown["gpu_range"]) == (2, [1, 4])
    # What it holds and is charged for is the count it got: 2 + 2 of the node's 4.
    queues = await api_get(schedd, admin, "/v1/queues")
    (default,) = [q for q in queues["queues"] if q["name"] == "default"]
    assert default["usage"]["gpus"] == 4

    # The other job ends with none waiting: the elastic job grows into its GPUs, which
    # are held for it (the snapshot shows it migrating) while it saves its checkpoint.
    await stepping(n1, pool, elastic)
    await exited(n1, other, exit_code=0)
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
    shown = await api_get(schedd, admin, f"/v1/jobs/{elastic}")
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
    await save_failed(n1, job_id)
    async with asyncio.timeout(5):
        while (row := await jobs.get(pool, job_id)) and row["resize_to"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert row is not None and row["migrate_to"] is None and row["migrate_gpu_uuids"] is None
    now = (await placed(schedd))[job_id]
    assert (now.state, now.moving_to, now.request.gpus) == ("running", (), 1)
    words = "checkpoint_failed: CheckpointError: no save function; resize to 2 GPUs called off"
    assert words in await reasons(pool, job_id)

    # The link drops between the resize's commit and its send: called off again.
    with sends_lost(schedd):
        assert not await execute(grow)
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
