"""HTTP routes that take a node out of placement and put it back (admins only).

    POST   /v1/nodes/{node}/drain  {"reason": "...", "requeue": false}: nothing new starts
                                   there; with requeue, its jobs are preempted and requeued
    DELETE /v1/nodes/{node}/drain  back into placement

A drain is kept across agent reconnects and schedd restarts; `GET /v1/nodes` shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from schedd.policy.actions import Preempt
from schedd.problems import Problem, invalid, not_found
from schedd.store import jobs, nodes
from shared import logging
from shared.model import DrainRequest, JobState, SpecError, parse_body

if TYPE_CHECKING:
    from schedd.api import Api

log = logging.get("api")

# A job already stopping (preempted, cancelled) is left to it.
_REQUEUED_FROM = (JobState.ASSIGNED, JobState.RUNNING)


async def drain(api: Api, request: web.Request, user: str) -> dict[str, Any]:
    node_id = request.match_info["node_id"]
    raw = await request.read()
    if not raw.strip():
        raise invalid("reason", 'required: send {"reason": "why the node is drained"}')
    try:
        body = parse_body(raw, DrainRequest, empty_ok=False)
    except SpecError as exc:
        raise invalid(exc.field, exc.reason) from None
    drained = await api.hub.drain(node_id, body.reason, by=user)
    if drained is None:
        raise not_found(f"node {node_id}")
    # A requeued job stays placed there until it has stopped: all are listed.
    placed = await jobs.placed(api.pool, node_id)
    requeued: list[str] = []
    if body.requeue:
        why = f"node {node_id} drained by {user}: {drained['drain_reason']}"
        for row in placed:
            if row["state"] in _REQUEUED_FROM and await api.executor.execute(
                Preempt(row["id"], why)
            ):
                requeued.append(row["id"])
        if requeued:
            log.info("drained node's jobs requeued", node_id=node_id, jobs=requeued, by=user)
    listed = [r["id"] for r in placed]
    return {"node_id": node_id, "drain": _drain(drained), "requeued": requeued, "jobs": listed}


async def undrain(api: Api, request: web.Request, user: str) -> dict[str, Any]:
    node_id = request.match_info["node_id"]
    if not await nodes.has_node(api.pool, node_id):
        raise not_found(f"node {node_id}")
    undone = await api.hub.undrain(node_id, by=user)
    if undone is None:
        raise Problem(409, "Not drained", f"node {node_id} is not drained")
    return {"node_id": node_id, "undone": _drain(undone)}


def _drain(row: Any) -> dict[str, Any]:
    return {
        "reason": row["drain_reason"],
        "by": row["drained_by"],
        "at": row["drained_at"].isoformat(),
    }
