"""Migration (Gandiva) in the live system, through scripted agents: a plan's Migrate is
recorded with its target GPUs, the snapshot shows the job migrating and holding them
beside its own, and its checkpointed exit requeues it pinned to the target node, where
it is launched to resume from its checkpoint while the waiting job starts on the node
it left. A move that cannot happen (its checkpoint fails, the job ends otherwise, its
node is away or lost) leaves nothing held for it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import asyncpg
import pytest

from schedd.policy.actions import Launch, Migrate, Plan, Suspend
from schedd.policy.snapshot import MIGRATING, PlacedJob, Shard, Snapshot
from schedd.store import jobs, tokens
from shared import protocol as p
from tests.integration.fake_agent import (
    CHECKPOINT,
    FakeAgent,
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
    # No minimum run before a move: these jobs have run for a moment only.
    async with start_gandiva(pool, min_run_s=0.0) as s:
        yield s


async def run_one(
    schedd: Schedd, pool: asyncpg.Pool, agent: FakeAgent, estimate_s: float | None = None
) -> str:
    """Submit a 1-GPU job and start it where it is launched, which must be `agent`."""
    job_id = await submit(schedd, pool, estimate_s=estimate_s)
    await started(agent, pool, job_id)
    return job_id


async def test_a_job_moves_to_free_a_node_for_a_waiting_job(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    # n1 runs X and W, n2 runs Y and V; only X reports mini-batches through a shim.
    n1 = await agent_on(schedd, "n1")
    x = await run_one(schedd, pool, n1, estimate_s=3600.0)
    w = await run_one(schedd, pool, n1)
    n2 = await agent_on(schedd, "n2")
    y = await run_one(schedd, pool, n2, estimate_s=3600.0)
    v = await run_one(schedd, pool, n2)
    await stepping(n1, pool, x)
    seen = await placed(schedd)
    assert seen[x].checkpointable and not seen[y].checkpointable

    # Z asks for two GPUs on one node: none has them, and no job of two GPUs runs to
    # take turns with. W's end leaves one free GPU in all: still nothing to move for.
    z = await submit(schedd, pool, gpus=2)
    await exited(n1, w, exit_code=0)
    await state_becomes(pool, w, "succeeded")

    # Record each snapshot the scheduler plans on, from V's end on.
    scheduler = schedd.scheduler
    planned: list[Snapshot] = []
    real = scheduler.profile.plan

    def recording(snapshot: Snapshot, now: float) -> Plan:
        planned.append(snapshot)
        return real(snapshot, now)

    scheduler.profile = dataclasses.replace(scheduler.profile, plan=recording)

    # V's end leaves one GPU free on each node: X moves to n2's, which frees n1 for Z.
    v_gpu = (await jobs.get(pool, v))["gpu_uuids"]  # type: ignore[index]
    await exited(n2, v, exit_code=0)
    checkpoint = await n1.expect(p.Checkpoint)
    assert (checkpoint.job_id, checkpoint.attempt) == (x, 1)
    row = await jobs.get(pool, x)
    assert row is not None and row["state"] == "running"
    assert (row["migrate_to"], row["migrate_gpu_uuids"]) == ("n2", v_gpu)
    moving = (await placed(schedd))[x]
    assert moving.state == MIGRATING
    assert moving.shards == (Shard("n1", ("n1-g0",)),)
    assert moving.moving_to == (Shard("n2", tuple(v_gpu)),)
    alice = await tokens.create(pool, "alice", "user")
    shown = await api_get(schedd, alice, f"/v1/jobs/{x}")
    assert (shown["migrating_to"], shown["migrating_to_gpus"]) == ("n2", v_gpu)
    asked = (
        "migration from node n1 to node n2 asked by the scheduler:"
        f" to free 2 GPU(s) on node n1 for job {z}"
    )
    assert any(r.startswith(asked) for r in await reasons(pool, x))
    assert (await jobs.get(pool, z))["state"] == "pending"  # type: ignore[index]

    # While X saves its checkpoint it holds both sets of GPUs: a cycle in between (any
    # event wakes one) starts nobody and moves nobody else.
    count = len(planned)
    scheduler.wake()
    async with asyncio.timeout(5):
        while len(planned) == count:  # noqa: ASYNC110 - the scheduler's own record
            await asyncio.sleep(0.01)
    assert next(j for j in planned[-1].placed if j.job_id == x).state == MIGRATING
    before_exit = len(planned)

    # It saved and exited: requeued at once pinned to n2, with its service kept, and
    # launched there from its checkpoint; Z starts on n1, which X left.
    await checkpointed(n1, x)
    relaunch = await n2.expect(p.Launch)
    assert (relaunch.job_id, relaunch.attempt) == (x, 2)
    assert relaunch.resume_from == CHECKPOINT
    assert relaunch.gpu_uuids == v_gpu
    z_launch = await n1.expect(p.Launch)
    assert (z_launch.job_id, sorted(z_launch.gpu_uuids)) == (z, ["n1-g0", "n1-g1"])

    requeued = next(s for s in planned[before_exit:] if any(j.job_id == x for j in s.pending))
    waiting = next(j for j in requeued.pending if j.job_id == x)
    assert waiting.request.node_id == "n2" and waiting.attained_s > 0
    assert waiting.resume_on == tuple(v_gpu)  # held for it: it resumes there first
    assert all(j.job_id != x for j in requeued.placed)

    await n2.start(relaunch)
    row = await state_becomes(pool, x, "running")
    assert row["node_id"] == "n2" and row["checkpoint_path"] == CHECKPOINT
    assert row["migrate_to"] is None and row["migrate_gpu_uuids"] is None
    assert row["pin_node_id"] is None and row["attained_gpu_s"] == waiting.attained_s
    assert row["checkpointable"] is None  # a new attempt: not known until its shim reports
    # Its history: the move asked (where from, where to, why), the checkpoint saved,
    # the requeue to move, and its start on the new node.
    history = [(e["from_state"], e["to_state"], e["node_id"], e["reason"])
               for e in await jobs.events(pool, x)]  # fmt: skip
    first = next(i for i, e in enumerate(history) if e[3].startswith(asked))
    assert history[first + 1 :] == [
        ("running", "running", "n1", "checkpointed: checkpoint of step 7 saved"),
        ("running", "pending", "n1", f"moving from node n1 to node n2: resumes from {CHECKPOINT}"),
        ("pending", "assigned", "n2", history[first + 3][3]),
        ("assigned", "running", "n2", "started"),
    ]
    for agent in (n1, n2):
        await agent.close()


async def test_a_move_that_cannot_happen_holds_nothing(schedd: Schedd, pool: asyncpg.Pool) -> None:
    scheduler = schedd.scheduler
    # The scheduler plans nothing by itself: the test's launches and moves go through
    # the executor as a plan's do.
    scheduler.profile = dataclasses.replace(scheduler.profile, plan=lambda s, n: Plan())
    execute = scheduler.executor.execute
    n1 = await agent_on(schedd, "n1")
    n2 = await agent_on(schedd, "n2")
    job_id = await submit(schedd, pool)
    await launched(schedd, n1, job_id)
    await stepping(n1, pool, job_id)
    move = Migrate(job_id, "n2", ("n2-g1",), "to free node n1")

    async def moving() -> PlacedJob:
        assert await execute(move)
        await n1.expect(p.Checkpoint)
        return (await placed(schedd))[job_id]

    # Its shim fails to save: the move is called off, nothing is held for it, and the
    # job is no longer taken as checkpointable this attempt.
    assert (await moving()).moving_to == (Shard("n2", ("n2-g1",)),)
    # It is not suspended for time-slicing while it saves to leave its GPUs.
    assert not await execute(Suspend(job_id, "time-sliced: another job takes turns"))
    await save_failed(n1, job_id)
    await move_dropped(pool, job_id)
    now = (await placed(schedd))[job_id]
    assert (now.state, now.moving_to, now.checkpointable) == ("running", (), False)
    words = "checkpoint_failed: CheckpointError: no save function; migration to node n2 called off"
    assert words in await reasons(pool, job_id)

    # The agent found no shim connected: the same, but whether it can save one is not
    # known (its shim may not have reconnected yet) until it reports mini-batches again.
    assert (await moving()).state == MIGRATING
    await n1.send(
        p.JobControlled(
            job_id=job_id, attempt=1, event="checkpoint_failed",
            detail="not checkpointable: the job has no shim connected",
        )
    )  # fmt: skip
    await move_dropped(pool, job_id)
    assert (await jobs.get(pool, job_id))["checkpointable"] is None  # type: ignore[index]
    await stepping(n1, pool, job_id)

    # The link drops between the move's commit and its send: called off again.
    with sends_lost(schedd):
        assert not await execute(move)
    row = await jobs.get(pool, job_id)
    assert row is not None and row["migrate_to"] is None and row["migrate_gpu_uuids"] is None
    said = await reasons(pool, job_id)
    assert said[-1] == "migration to node n2 called off: node n1 is not connected", said[-2:]
    assert said[-2].startswith("migration from node n1 to node n2 asked by the scheduler")

    # Lost with its node while it moves (the agent comes back without it): requeued,
    # and nothing is held for the move.
    assert (await moving()).state == MIGRATING
    await n1.close()
    n1 = await agent_on(schedd, "n1")
    row = await state_becomes(pool, job_id, "pending")
    assert row["migrate_to"] is None and row["migrate_gpu_uuids"] is None

    # Its node is away when the move is to be sent: refused, and nothing recorded.
    launch = await launched(schedd, n1, job_id)
    await stepping(n1, pool, job_id, launch.attempt)
    before = await reasons(pool, job_id)
    await n1.close()
    async with asyncio.timeout(5):
        while "n1" in schedd.hub.links:  # noqa: ASYNC110 - the hub's own record
            await asyncio.sleep(0.01)
    assert not await execute(move)
    row = await jobs.get(pool, job_id)
    assert row is not None and row["migrate_to"] is None and row["migrate_gpu_uuids"] is None
    assert await reasons(pool, job_id) == before

    # The job ends some other way while it moves: it ends as it would have, nothing held.
    report = p.JobReport(job_id=job_id, attempt=launch.attempt, status="running")
    n1 = await agent_on(schedd, "n1", report)
    assert (await moving()).state == MIGRATING
    await exited(n1, job_id, attempt=launch.attempt, exit_code=0)
    row = await state_becomes(pool, job_id, "succeeded")
    assert row["migrate_to"] is None and row["migrate_gpu_uuids"] is None
    for agent in (n1, n2):
        await agent.close()


async def launched(schedd: Schedd, agent: FakeAgent, job_id: str) -> p.Launch:
    """The job launched on the agent's first GPU by the executor, and started there."""
    uuid = agent.inventory.gpus[0].uuid
    shards = (Shard(agent.node_id, (uuid,)),)
    assert await schedd.scheduler.executor.execute(Launch(job_id, shards, "placed by the test"))
    launch = await agent.expect(p.Launch)
    await agent.start(launch)
    await state_becomes(schedd.scheduler.pool, job_id, "running")
    return launch


async def move_dropped(pool: asyncpg.Pool, job_id: str) -> None:
    async with asyncio.timeout(5):
        while (row := await jobs.get(pool, job_id)) and row["migrate_to"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert row is not None and row["state"] == "running" and row["migrate_gpu_uuids"] is None


async def test_a_job_first_known_to_checkpoint_wakes_the_scheduler(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    """A job is known to save checkpoints once its shim first reports steps: a move or
    resize passed over for that may be possible now, and no other event may come. That
    first report wakes a plan; later ones are not news."""
    n1 = await agent_on(schedd, "n1")
    x = await run_one(schedd, pool, n1, estimate_s=3600.0)
    progress = {"step": 1, "steps_per_s": 10.0}
    assert not await jobs.record_progress(pool, x, 1, progress)  # no step time: no shim
    before = schedd.scheduler.cycles
    await stepping(n1, pool, x)
    async with asyncio.timeout(5):
        while schedd.scheduler.cycles == before:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert not await jobs.record_progress(pool, x, 1, progress, step_wall_s=0.1)
    await n1.close()
