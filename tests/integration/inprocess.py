"""schedd's parts wired in-process on a real PostgreSQL and served on a real TCP port, and
what tests do with them: submit a job, read the placed jobs, call the API, lose sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
from aiohttp.test_utils import TestServer

from schedd.api import Api, build_app
from schedd.executor import Executor
from schedd.hub import Hub
from schedd.policy.snapshot import PlacedJob
from schedd.scheduler import Scheduler
from schedd.store import jobs
from shared import protocol as p
from shared.config import ProfileConfig, SchedConfig
from shared.model import JobKind, JobSpec
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
    await hub.recall()  # as schedd/main.py does at start
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


def start_gandiva(
    pool: asyncpg.Pool, decide: list[str] | None = None, **settings: float
) -> AbstractAsyncContextManager[Schedd]:
    """schedd under the `gandiva` profile with these settings (and decide plugins)."""
    profile = ProfileConfig(decide=decide, settings=settings)
    return start_schedd(pool, policy="gandiva", profiles={"gandiva": profile})


@contextmanager
def sends_lost(schedd: Schedd) -> Iterator[None]:
    """What the hub sends meanwhile is lost, as when a node's link drops between a
    control's commit and its send."""

    async def lost(node_id: str, msg: p.Msg) -> bool:
        return False

    hub_send, schedd.hub.send = schedd.hub.send, lost  # type: ignore[method-assign]
    try:
        yield
    finally:
        schedd.hub.send = hub_send  # type: ignore[method-assign]


async def submit(
    schedd: Schedd,
    pool: asyncpg.Pool,
    gpus: int = 1,
    min_gpus: int | None = None,
    estimate_s: float | None = None,
    user: str = "alice",
    kind: JobKind = JobKind.GUARANTEED,
) -> str:
    """A training job (alice's unless said), stored as the API stores it, and the
    scheduler woken for it."""
    spec = JobSpec(
        name="train", command=["train"], gpus=gpus, min_gpus=min_gpus,
        estimated_runtime_s=estimate_s, kind=kind,
    )  # fmt: skip
    row, _ = await jobs.submit(pool, user, spec, None)
    schedd.scheduler.wake()
    return str(row["id"])


class PredictsUtilisation:
    """A trained resource estimator, as far as utilisation is asked of it: `pct` for
    every job."""

    models = {"gpu_util_pct": object()}

    def __init__(self, pct: float = 25.0) -> None:
        self.pct = pct

    def values(self, target: str, rows: list[object]) -> list[float]:
        assert target == "gpu_util_pct"
        return [self.pct] * len(rows)


async def placed(schedd: Schedd) -> dict[str, PlacedJob]:
    """The placed jobs as a snapshot taken now shows them, by id."""
    return {j.job_id: j for j in await schedd.scheduler.placed_now()}


async def api_get(schedd: Schedd, token: str, path: str) -> dict[str, Any]:
    """What the API answers a GET of `path` with `token`, which must be a 200."""
    status, body = await api_call(schedd, token, "GET", path)
    assert status == 200, body
    return dict(body)


async def control(schedd: Schedd, token: str, job_id: str, name: str) -> int:
    """The status the API answers a control of the job (`suspend`, `resume`, ...) with."""
    status, _ = await api_call(schedd, token, "POST", f"/v1/jobs/{job_id}/{name}")
    return status


async def api_call(
    schedd: Schedd, token: str | None, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """The status and JSON answer of one API request, with `token` (None: none) and a
    JSON `body` (None: none)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, schedd.server.make_url(path), headers=headers, json=body) as resp,
    ):
        # Read whatever the type: errors come as application/problem+json.
        return resp.status, await resp.json(content_type=None)


async def waits_with(schedd: Schedd, job_id: str, code: str) -> str:
    """The job's wait reason, once the scheduler's last plan says it waits with `code`."""
    async with asyncio.timeout(5):
        while schedd.scheduler.why_pending(job_id).code != code:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return schedd.scheduler.why_pending(job_id).reason
