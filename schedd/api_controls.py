"""HTTP routes that control a running job through its shim (docs/shim.md).

    POST /v1/jobs/{id}/limits      {"share": 0-100, "memory_cap_mib": N | null}
    POST /v1/jobs/{id}/suspend     {"free_memory": false}
    POST /v1/jobs/{id}/resume      a suspended job goes on; a checkpointed one is requeued
    POST /v1/jobs/{id}/checkpoint  save and exit: the job ends `checkpointed`
    POST /v1/jobs/{id}/migrate     {"node": "NODE"}: checkpoint, then resume on NODE
    POST /v1/jobs/{id}/prefetch    {"node": "NODE"}: copy the job's inputs to NODE now
    POST /v1/jobs/{id}/resize      {"gpus": N}: checkpoint, then restart with N GPUs

Each answers 202 with the job: the agent applies the control at the job's next step
boundary, and the job's events say when it did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web

from schedd import job_controls
from schedd.problems import invalid
from shared.model import (
    LimitsRequest,
    NodeRequest,
    ResizeRequest,
    SpecError,
    SuspendRequest,
    T,
    parse_body,
)

if TYPE_CHECKING:
    from schedd.api import Api

Act = Callable[["Api", web.Request, asyncpg.Record, str], Awaitable[None]]


async def _body(request: web.Request, kind: type[T]) -> T:
    try:
        return parse_body(await request.read(), kind)
    except SpecError as exc:
        raise invalid(exc.field, exc.reason) from None


async def _limits(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    body = await _body(request, LimitsRequest)
    await job_controls.set_limits(api.pool, api.hub, row, user, body.share, body.memory_cap_mib)


async def _suspend(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    body = await _body(request, SuspendRequest)
    await job_controls.suspend(api.pool, api.hub, row, user, body.free_memory)


async def _resume(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    await job_controls.resume(api.pool, api.hub, row, user)


async def _checkpoint(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    await job_controls.checkpoint(api.pool, api.hub, row, user)


async def _connected_node(api: Api, request: web.Request) -> str:
    body = await _body(request, NodeRequest)
    if body.node not in api.hub.links:
        known = sorted(api.hub.links)
        raise invalid("node", f"node {body.node!r} is not connected; connected: {known}")
    return body.node


async def _migrate(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    node = await _connected_node(api, request)
    await job_controls.checkpoint(api.pool, api.hub, row, user, migrate_to=node)


async def _resize(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    body = await _body(request, ResizeRequest)
    await job_controls.resize(api.pool, api.hub, row, user, body.gpus)


async def _prefetch(api: Api, request: web.Request, row: asyncpg.Record, user: str) -> None:
    node = await _connected_node(api, request)
    await job_controls.prefetch(api.pool, api.hub, row, user, node)


# The controls by the last part of their path.
ACTIONS: dict[str, Act] = {
    "limits": _limits,
    "suspend": _suspend,
    "resume": _resume,
    "checkpoint": _checkpoint,
    "migrate": _migrate,
    "prefetch": _prefetch,
    "resize": _resize,
}
