"""A scripted agent on a real websocket: it speaks shared/protocol.py and does what a test says."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import aiohttp
import asyncpg
from aiohttp.test_utils import TestServer

from schedd.hub import Hub
from schedd.store import jobs
from shared import protocol as p
from tests.integration.inprocess import JOIN_TOKEN

M = TypeVar("M", bound=p.Msg)


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
