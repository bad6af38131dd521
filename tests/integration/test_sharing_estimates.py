"""AntMan's sharing in the live scheduler, with the resource estimator: a guaranteed job
too young for its GPU's window to have seen it run is shared at once when the estimator
predicts it uses little, instead of after `share_after_s`; one predicted busy is shared
when it comes of age, if its GPU's window then shows little use."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from schedd.policy.framework import NO_SHAREABLE_GPU
from shared import protocol as p
from shared.config import ProfileConfig
from shared.model import JobKind
from tests.integration.fake_agent import FakeAgent, started
from tests.integration.inprocess import PredictsUtilisation, Schedd, start_schedd, submit


async def opportunistic(schedd: Schedd, pool: asyncpg.Pool) -> str:
    """Bob's opportunistic job, once it waits for a GPU to share."""
    guest = await submit(schedd, pool, user="bob", kind=JobKind.OPPORTUNISTIC)
    async with asyncio.timeout(5):
        while schedd.scheduler.why_pending(guest).code != NO_SHAREABLE_GPU:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return guest


async def test_a_young_holder_predicted_to_use_little_is_shared_at_once(
    pool: asyncpg.Pool,
) -> None:
    # The estimator off: it is put in by hand below, once the holder runs.
    async with start_schedd(pool, estimator_retrain_s=0) as schedd:
        agent = await FakeAgent(schedd.server, gpus=1).connect(hub=schedd.hub)
        holder = await submit(schedd, pool)
        await started(agent, pool, holder)
        # Started a moment ago, nothing known of its use: its GPU is not shared yet.
        guest = await opportunistic(schedd, pool)
        with pytest.raises(TimeoutError):
            await agent.next(within=0.3)

        # The trained estimator predicts 25%, below `share_below_pct`: shared now.
        schedd.scheduler.estimator = PredictsUtilisation()  # type: ignore[assignment]
        schedd.scheduler.wake()
        launch = await agent.expect(p.Launch)
        assert (launch.job_id, launch.gpu_uuids) == (guest, ["GPU-0"])
        await agent.close()


async def test_a_young_holder_predicted_busy_is_shared_once_of_age(pool: asyncpg.Pool) -> None:
    settings = ProfileConfig(settings={"share_after_s": 2.0})
    async with start_schedd(
        pool, estimator_retrain_s=0, policy="default", profiles={"default": settings}
    ) as schedd:
        schedd.scheduler.estimator = PredictsUtilisation(80.0)  # type: ignore[assignment]
        agent = await FakeAgent(schedd.server, gpus=1).connect(hub=schedd.hub)
        holder = await submit(schedd, pool)
        await started(agent, pool, holder)
        guest = await opportunistic(schedd, pool)
        # 80% predicted, above `share_below_pct`: not shared while young.
        schedd.scheduler.wake()
        with pytest.raises(TimeoutError):
            await agent.next(within=0.5)
        # Of age two seconds after its start, with no event meanwhile: its GPU's window
        # (no busy sample in it) speaks for it now, and the plan made then shares it.
        launch = await agent.expect(p.Launch, within=5.0)
        assert (launch.job_id, launch.gpu_uuids) == (guest, ["GPU-0"])
        await agent.close()
