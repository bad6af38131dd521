"""Packing (Gandiva) in the live system, through a scripted agent: two jobs taking turns
on one GPU, each measured using little of it while it ran alone (the agent's GPU
samples), run at once: the suspended one is resumed beside the other (`packed` in the
snapshot, its partner left running). Their step times against those alone (the shims'
progress reports) say when the pack hurts: it is undone (suspended again, not packed
again this attempt). A packed job whose partner left takes the GPU as its holder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from schedd.policy.snapshot import PACKED, SUSPENDED
from schedd.store import jobs, tokens
from shared import protocol as p
from tests.integration.fake_agent import FakeAgent, exited, reasons, started
from tests.integration.inprocess import (
    PredictsUtilisation,
    Schedd,
    control,
    placed,
    start_gandiva,
    submit,
)


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    # Turns far longer than the test: the two jobs never swap, they are packed or not;
    # a pack is judged as soon as its rates are measured.
    packing = ["timeslice", "pack"]
    async with start_gandiva(pool, packing, timeslice_s=3600.0, pack_check_s=0.0) as s:
        yield s


async def sample(agent: FakeAgent, pool: asyncpg.Pool, job_id: str, util: int) -> None:
    """The agent samples the GPU at `util`%, with `job_id` running alone on it."""
    await agent.send(
        p.GpuState(samples=[p.GpuSample(uuid="GPU-0", utilization_pct=util, memory_used_mib=100)])
    )
    async with asyncio.timeout(5):
        while (await jobs.get(pool, job_id))["util_alone"] is None:  # type: ignore[index]  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def steps(
    agent: FakeAgent, pool: asyncpg.Pool, job_id: str, wall_s: float, alone: bool
) -> None:
    """The job's shim reports mini-batches of `wall_s` (alone: kept as its rate alone)."""
    before = await jobs.get(pool, job_id)
    assert before is not None
    await agent.send(
        p.JobProgress(job_id=job_id, attempt=1, step=5, steps_per_s=1 / wall_s, step_wall_s=wall_s)
    )
    async with asyncio.timeout(5):
        while (row := await jobs.get(pool, job_id))["progress_at"] == before["progress_at"]:  # type: ignore[index]  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    kept = await pool.fetchval("SELECT step_alone_s FROM jobs WHERE id = $1", job_id)
    assert (wall_s in (kept or [])) == alone, kept
    assert row is not None


async def two_taking_turns(schedd: Schedd, pool: asyncpg.Pool) -> tuple[FakeAgent, str, str]:
    """First runs alone at 30% of the GPU with 0.1 s steps, then is suspended for second,
    which runs alone at 40%, with 0.1 s steps too."""
    agent = await FakeAgent(schedd.server, gpus=1).connect(hub=schedd.hub)
    first = await submit(schedd, pool)
    await started(agent, pool, first)
    await sample(agent, pool, first, 30)
    await steps(agent, pool, first, 0.1, alone=True)

    second = await submit(schedd, pool)
    assert (await agent.expect(p.Suspend)).job_id == first
    await started(agent, pool, second)
    await steps(agent, pool, second, 0.1, alone=True)
    await sample(agent, pool, second, 40)
    # The suspended job was not sampled meanwhile: its figure is still its own. (A cycle
    # may pack the two from now on.)
    seen = await placed(schedd)
    assert (seen[first].state in (SUSPENDED, PACKED), seen[first].utilization_pct) == (True, 30)
    assert (seen[second].state, seen[second].utilization_pct) == ("running", 40)
    return agent, first, second


async def packed_beside(schedd: Schedd, pool: asyncpg.Pool, agent: FakeAgent, job_id: str) -> None:
    """The next cycle (if none did yet) packs the suspended job: it is resumed, its
    partner left running."""
    schedd.scheduler.wake()
    resume = await agent.expect(p.Resume)
    assert resume.job_id == job_id
    async with asyncio.timeout(5):
        while (await placed(schedd))[job_id].state != PACKED:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def stays_suspended(schedd: Schedd, agent: FakeAgent, job_id: str) -> None:
    """A cycle runs and sends the agent nothing: the suspended job is not packed."""
    cycles = schedd.scheduler.cycles
    schedd.scheduler.wake()
    async with asyncio.timeout(5):
        while schedd.scheduler.cycles == cycles:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):
        await agent.next(within=0.3)
    assert (await placed(schedd))[job_id].state == SUSPENDED


async def test_two_little_used_jobs_are_packed_and_unpacked_when_it_hurts(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, first, second = await two_taking_turns(schedd, pool)

    # 30% + 40% of the GPU: the suspended job resumes beside the running one.
    await packed_beside(schedd, pool, agent, first)
    row = await jobs.get(pool, first)
    assert row is not None
    assert row["controls"]["packed"] and row["controls"]["packed_beside"] == second
    assert not row["controls"]["suspended"]
    seen = await placed(schedd)
    assert seen[first].state_since == pytest.approx(row["resumed_at"].timestamp())
    assert (seen[second].state, seen[first].gpu_uuids) == ("running", seen[second].gpu_uuids)
    said = await reasons(pool, first)
    assert any(
        r.startswith(f"resume beside job {second} (packed: the two run at once) asked by the"
                     f" scheduler: packed beside job {second}: together they use about 70%")
        for r in said
    ), said  # fmt: skip
    # Not measured against their rates alone until their shims report from the pack.
    assert (seen[first].progress_ratio, seen[second].progress_ratio) == (None, None)
    # Its user may neither suspend nor resume it: the scheduler runs the two at once.
    alice = await tokens.create(pool, "alice", "user")
    assert await control(schedd, alice, first, "suspend") == 409
    assert await control(schedd, alice, first, "resume") == 409

    # Packed, each steps at 0.25 s instead of 0.1 s alone: 0.4 + 0.4 of their speed,
    # worse than taking turns. The pack is undone: the packed job is suspended again.
    await steps(agent, pool, first, 0.25, alone=False)
    await steps(agent, pool, second, 0.25, alone=False)
    seen = await placed(schedd)
    assert seen[first].progress_ratio == pytest.approx(0.4)
    assert seen[second].progress_ratio == pytest.approx(0.4)
    schedd.scheduler.wake()
    suspend = await agent.expect(p.Suspend)
    assert (suspend.job_id, suspend.free_memory) == (first, True)
    async with asyncio.timeout(5):
        while (await placed(schedd))[first].state != SUSPENDED:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    seen = await placed(schedd)
    assert seen[first].packable is False and seen[second].packable is True
    row = await jobs.get(pool, first)
    assert row is not None and not row["controls"]["packed"]
    said = await reasons(pool, first)
    assert any("worse than taking turns" in r and "not packed again" in r for r in said), said

    # Not packed again in this attempt, however little the two use.
    await stays_suspended(schedd, agent, first)
    await agent.close()


async def test_a_packed_job_whose_partner_left_holds_the_gpu(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent, first, second = await two_taking_turns(schedd, pool)
    await packed_beside(schedd, pool, agent, first)

    # Its partner ends: it runs already, and takes the GPU as its holder (nothing to
    # send the agent), with its turn timed from now.
    await exited(agent, second, exit_code=0)
    async with asyncio.timeout(5):
        while (await placed(schedd))[first].state != "running":  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    row = await jobs.get(pool, first)
    assert row is not None and not row["controls"]["packed"] and not row["controls"]["suspended"]
    said = await reasons(pool, first)
    assert said[-1].startswith("takes its GPUs as their holder, asked by the scheduler: its packed")
    # Alone again: its GPU samples and step times count as its own once more.
    await sample(agent, pool, first, 35)
    await steps(agent, pool, first, 0.1, alone=True)
    with pytest.raises(TimeoutError):
        await agent.next(within=0.3)
    await agent.close()


async def test_a_job_taking_turns_is_packed_only_once_its_utilisation_is_known(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    agent = await FakeAgent(schedd.server, gpus=1).connect(hub=schedd.hub)
    first = await submit(schedd, pool)
    await started(agent, pool, first)
    second = await submit(schedd, pool)
    await agent.expect(p.Suspend)
    await started(agent, pool, second)
    # Only the running job was sampled: the suspended one's utilisation is not known,
    # and the estimator has learned nothing yet.
    await sample(agent, pool, second, 20)
    seen = await placed(schedd)
    assert (seen[first].utilization_pct, seen[second].utilization_pct) == (None, 20)
    await stays_suspended(schedd, agent, first)

    # The resource estimator, once trained, predicts what was not measured: 25% + 20%.
    schedd.scheduler.estimator = PredictsUtilisation()  # type: ignore[assignment]
    await packed_beside(schedd, pool, agent, first)
    said = await reasons(pool, first)
    assert any("together they use about 45% of the GPUs" in r for r in said), said
    await agent.close()
