"""A scripted agent on a real websocket: it speaks shared/protocol.py and does what a test says
(its jobs' starts and exits, what their shims report)."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import aiohttp
import asyncpg
import msgspec
from aiohttp.test_utils import TestServer

from schedd.hub import Hub
from schedd.store import jobs
from shared import protocol as p
from tests.integration.inprocess import JOIN_TOKEN, Schedd

M = TypeVar("M", bound=p.Msg)
# Where the tests' shims say they saved a checkpoint.
CHECKPOINT = "/ck/step-000000007"


def inventory(gpus: int = 2) -> p.Inventory:
    return p.Inventory(
        gpus=[
            p.GpuInfo(index=i, uuid=f"GPU-{i}", model="Sim", memory_mib=1000) for i in range(gpus)
        ],
        cpus=8,
        memory_mib=16000,
    )


class FakeAgent:
    def __init__(self, server: TestServer, node_id: str = "n1", gpus: int = 2) -> None:
        self.server = server
        self.node_id = node_id
        self.inventory = inventory(gpus)
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def connect(self, *reports: p.JobReport, hub: Hub | None = None) -> FakeAgent:
        """Hello and Welcome; with `hub`, also wait until the node is reconciled and ready."""
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(
            self.server.make_url("/v1/agents/ws"),
            headers={"Authorization": f"Bearer {JOIN_TOKEN}"},
        )
        await self.send(
            p.Hello(
                protocol=p.PROTOCOL_VERSION,
                node_id=self.node_id,
                inventory=self.inventory,
                jobs=list(reports),
            )
        )
        assert isinstance(await self.next(), p.Welcome)
        if hub is not None:
            async with asyncio.timeout(5):
                while not ((link := hub.links.get(self.node_id)) and link.ready):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        return self

    async def send(self, msg: p.Msg) -> None:
        assert self.ws is not None
        await self.ws.send_bytes(p.encode(msg))

    async def next(self, within: float = 5.0) -> p.SchedMessage:
        assert self.ws is not None
        return p.decode_from_sched((await self.ws.receive(timeout=within)).data)

    async def expect(self, kind: type[M], within: float = 5.0) -> M:
        msg = await self.next(within)
        assert isinstance(msg, kind), f"expected {kind.__name__}, got {msg!r}"
        return msg

    async def start(self, launch: p.Launch) -> None:
        await self.send(p.JobStarted(job_id=launch.job_id, attempt=launch.attempt, pid=100))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()


async def state_becomes(
    pool: asyncpg.Pool, job_id: str, state: str, within: float = 5.0
) -> asyncpg.Record:
    async with asyncio.timeout(within):
        while (row := await jobs.get(pool, job_id))["state"] != state:  # noqa: ASYNC110 - a row
            await asyncio.sleep(0.01)
    return row


async def reasons(pool: asyncpg.Pool, job_id: str) -> list[str]:
    """The reasons in the job's history, oldest first."""
    return [e["reason"] for e in await jobs.events(pool, job_id)]


async def agent_on(schedd: Schedd, node_id: str, *reports: p.JobReport, gpus: int = 2) -> FakeAgent:
    """A scripted agent, connected and ready, with GPUs named after its node (`n1-g0`,
    `n1-g1`, ...), which reports `reports` in its hello."""
    agent = FakeAgent(schedd.server, node_id, gpus=gpus)
    named = [msgspec.structs.replace(g, uuid=f"{node_id}-g{g.index}") for g in agent.inventory.gpus]
    agent.inventory = msgspec.structs.replace(agent.inventory, gpus=named)
    return await agent.connect(*reports, hub=schedd.hub)


async def started(agent: FakeAgent, pool: asyncpg.Pool, job_id: str) -> p.Launch:
    """The next message to `agent` launches the job: it starts, and is running."""
    launch = await agent.expect(p.Launch)
    assert launch.job_id == job_id
    await agent.start(launch)
    await state_becomes(pool, job_id, "running")
    return launch


async def exited(
    agent: FakeAgent,
    job_id: str,
    attempt: int = 1,
    exit_code: int | None = None,
    signal: int | None = None,
) -> None:
    """The job's process ended and schedd acknowledged it: the end is durable."""
    await agent.send(
        p.JobExited(job_id=job_id, attempt=attempt, exit_code=exit_code, signal=signal)
    )
    await agent.expect(p.ExitAck)


async def stepping(agent: FakeAgent, pool: asyncpg.Pool, job_id: str, attempt: int = 1) -> None:
    """The job's shim reports mini-batches: it can save a checkpoint on request."""
    await agent.send(
        p.JobProgress(job_id=job_id, attempt=attempt, step=7, steps_per_s=10.0, step_wall_s=0.1)
    )
    async with asyncio.timeout(5):
        while (await jobs.get(pool, job_id))["checkpointable"] is not True:  # type: ignore[index]  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def checkpointed(agent: FakeAgent, job_id: str, attempt: int = 1) -> None:
    """The job saves its checkpoint at `CHECKPOINT` and exits, as its shim does on
    request."""
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


async def save_failed(agent: FakeAgent, job_id: str, attempt: int = 1) -> None:
    """The job's shim fails to save the checkpoint it was asked for, as one whose job
    registered no save function does; the job runs on."""
    await agent.send(
        p.JobControlled(
            job_id=job_id, attempt=attempt, event="checkpoint_failed", step=9,
            detail="CheckpointError: no save function",
        )
    )  # fmt: skip
