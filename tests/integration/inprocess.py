"""schedd's parts wired in-process on a real PostgreSQL and served on a real TCP port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import asyncpg
from aiohttp.test_utils import TestServer

from schedd.api import Api, build_app
from schedd.executor import Executor
from schedd.hub import Hub
from schedd.scheduler import Scheduler
from shared.config import SchedConfig
from shared.tasks import Supervisor

JOIN_TOKEN = "test-join-token"


@dataclass
class Schedd:
    server: TestServer
    hub: Hub
    scheduler: Scheduler
    config: SchedConfig


@asynccontextmanager
async def start_schedd(pool: asyncpg.Pool, **config: object) -> AsyncIterator[Schedd]:
    cfg = SchedConfig(join_token=JOIN_TOKEN, **config)  # type: ignore[arg-type]
    supervisor = Supervisor()
    hub = Hub(pool, cfg, supervisor)
    executor = Executor(pool, hub, cfg)
    scheduler = Scheduler(pool, hub, executor, cfg)
    hub.wake = scheduler.wake
    hub.job_started = scheduler.job_started
    server = TestServer(build_app(Api(pool, hub, scheduler, executor), cfg.max_body_bytes))
    await server.start_server()
    supervisor.spawn(scheduler.run(), name="scheduler")
    try:
        yield Schedd(server, hub, scheduler, cfg)
    finally:
        await hub.close()
        await supervisor.close()
        await server.close()
