"""The HTTP API under /v1: JSON in and out, problem+json errors, bearer tokens.

A user sees and cancels only their own jobs (someone else's job is a 404, so job ids
do not leak); an admin sees all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from aiohttp import web

from schedd import api_controls, api_nodes, estimate_report, job_controls, queue_report
from schedd.executor import Executor
from schedd.hub import Hub
from schedd.problems import Problem, invalid, not_found, unauthorized
from schedd.scheduler import Scheduler
from schedd.store import gangs as gang_parts
from schedd.store import jobs, nodes, tokens
from shared import logging
from shared.model import TERMINAL, JobState, SpecError, parse_spec
from shared.protocol import LogCancel, LogChunk, LogRequest

log = logging.get("api")

PRINCIPAL = web.RequestKey("principal", tokens.Principal)
MAX_IDEMPOTENCY_KEY = 255
TOKEN_CACHE_S = 30.0  # a revoked token stops working within this time
# curl -d sends x-www-form-urlencoded unless told otherwise; take it as the JSON it is.
JSON_BODY_TYPES = {"application/json", "application/x-www-form-urlencoded"}
LOG_QUEUE_CHUNKS = 256
FOLLOW_WAIT_S = 75.0  # how long a log follower waits for the job to be placed and start
# How long a submission with a deadline waits for the policy's answer before replying
# without it (the answer then shows in GET /v1/jobs/{id}).
DEADLINE_ANSWER_S = 5.0


def respond(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(data), content_type="application/json", headers=headers
    )


class TokenCache:
    """Token lookups cached briefly, so that a burst of requests costs one query."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._cache: dict[str, tuple[float, tokens.Principal | None]] = {}

    async def principal(self, token: str) -> tokens.Principal | None:
        now = time.monotonic()
        hit = self._cache.get(token)
        if hit is not None and now - hit[0] < TOKEN_CACHE_S:
            return hit[1]
        principal = await tokens.lookup(self.pool, token)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[token] = (now, principal)
        return principal


class Api:
    def __init__(
        self, pool: asyncpg.Pool, hub: Hub, scheduler: Scheduler, executor: Executor
    ) -> None:
        self.pool = pool
        self.hub = hub
        self.scheduler = scheduler
        self.executor = executor
        self.tokens = TokenCache(pool)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/healthz", self.healthz),
            web.post("/v1/jobs", self.submit),
            web.get("/v1/jobs", self.list_jobs),
            web.get("/v1/jobs/{job_id}", self.get_job),
            web.post("/v1/jobs/{job_id}/cancel", self.cancel),
            web.post(
                f"/v1/jobs/{{job_id}}/{{control:{'|'.join(api_controls.ACTIONS)}}}", self.control
            ),
            web.get("/v1/jobs/{job_id}/logs", self.logs),
            web.get("/v1/estimates/{job_id}", self.estimates),
            web.get("/v1/nodes", self.list_nodes),
            web.delete("/v1/nodes/{node_id}/gpus/{uuid}/fault", self.clear_gpu_fault),
            web.post("/v1/nodes/{node_id}/drain", self.drain_node),
            web.delete("/v1/nodes/{node_id}/drain", self.undrain_node),
            web.get("/v1/queues", self.list_queues),
            web.get("/v1/agents/ws", self.hub.handle),
        ]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            if request.path not in ("/healthz", "/v1/agents/ws"):
                request[PRINCIPAL] = await self._authenticate(request)
            response: web.StreamResponse = await handler(request)
            return response
        except Problem as problem:
            return problem.response(request.path)
        except web.HTTPRequestEntityTooLarge as exc:
            return Problem(413, "Payload too large", exc.text or "body too large").response(
                request.path
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return Problem(exc.status, exc.reason, exc.text or exc.reason).response(request.path)

    async def _authenticate(self, request: web.Request) -> tokens.Principal:
        header = request.headers.get("Authorization")
        if not header:
            raise unauthorized("missing Authorization: Bearer <token> header")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized("Authorization must be 'Bearer <token>'")
        principal = await self.tokens.principal(token.strip())
        if principal is None:
            raise unauthorized("unknown or revoked token")
        return principal

    # ---- routes ------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        try:
            await asyncio.wait_for(self.pool.fetchval("SELECT 1"), 2.0)
        except (asyncpg.PostgresError, OSError, TimeoutError) as exc:
            return respond({"status": "unavailable", "database": str(exc)}, status=503)
        return respond(
            {"status": "ok", "agents": len(self.hub.links), "policy": self.scheduler.profile.name}
        )

    async def submit(self, request: web.Request) -> web.Response:
        principal = request[PRINCIPAL]
        if "Content-Type" in request.headers and request.content_type not in JSON_BODY_TYPES:
            raise Problem(
                415,
                "Unsupported media type",
                f"send the job spec as application/json, not {request.content_type}",
                field="Content-Type",
            )
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
            raise invalid("Idempotency-Key", f"must be 1 to {MAX_IDEMPOTENCY_KEY} characters")
        body = await request.read()
        if not body.strip():
            raise invalid(None, "the body is empty; send a JSON job spec", status=400)
        try:
            spec = parse_spec(body)
        except SpecError as exc:
            status = 400 if exc.field is None and exc.reason.startswith("malformed") else 422
            raise invalid(exc.field, exc.reason, status=status) from None
        known = self.scheduler.queue_config
        if known and spec.queue not in known:
            raise Problem(
                400,
                "Unknown queue",
                f"queue: unknown queue {spec.queue!r}; known: {', '.join(sorted(known))}",
                field="queue",
                reason=f"unknown queue {spec.queue!r}",
                known=sorted(known),
            )
        try:
            row, created = await jobs.submit(self.pool, principal.user, spec, key)
        except jobs.IdempotencyConflict as exc:
            raise Problem(
                409,
                "Idempotency-Key reused",
                f"this Idempotency-Key already submitted job {exc.job_id} with a different spec",
                field="Idempotency-Key",
                job_id=exc.job_id,
            ) from None
        if created:
            log.info("job submitted", job_id=row["id"], user=principal.user, gpus=spec.gpus)
            self.scheduler.wake()
        undecided = spec.deadline is not None and row["deadline_admitted"] is None
        if undecided and self.scheduler.decides_deadlines:
            async with self.scheduler.deadline_answer(row["id"]) as answered:
                row = await jobs.get(self.pool, row["id"]) or row
                if row["deadline_admitted"] is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(answered), DEADLINE_ANSWER_S)
                    row = await jobs.get(self.pool, row["id"]) or row
        headers = {"Location": f"/v1/jobs/{row['id']}"}
        if not created:
            headers["Idempotent-Replayed"] = "true"
        return respond(self._with_deadline_note(jobs.as_dict(row)), status=201, headers=headers)

    def _with_deadline_note(self, body: dict[str, Any]) -> dict[str, Any]:
        """Say why a deadline has no answer: not decided yet, or never by this policy."""
        held = body.get("deadline")
        if held is not None and held["guaranteed"] is None:
            held["reason"] = (
                "not decided yet: the scheduler decides at its next cycle with nodes connected"
                if self.scheduler.decides_deadlines
                else f"policy {self.scheduler.profile.name} does not guarantee deadlines"
                " (the chronus profile does)"
            )
        return body

    async def list_jobs(self, request: web.Request) -> web.Response:
        principal = request[PRINCIPAL]
        q = request.query
        state = q.get("state")
        if state is not None and state not in JobState.__members__.values():
            known = ", ".join(s.value for s in JobState)
            raise invalid("state", f"unknown state {state!r}; one of {known}")
        limit = _int_param(q, "limit", default=100, low=1, high=1000)
        after = _int_param(q, "after", default=0, low=0, high=2**62)
        user = q.get("user")
        if not principal.is_admin:
            if user is not None and user != principal.user:
                raise Problem(
                    403, "Forbidden", "only an admin may list other users' jobs", field="user"
                )
            user = principal.user
        rows = await jobs.list_jobs(
            self.pool, user=user, state=state, queue=q.get("queue"), after_seq=after, limit=limit
        )
        next_cursor = rows[-1]["seq"] if len(rows) == limit else None
        return respond({"jobs": [jobs.as_dict(r) for r in rows], "next": next_cursor})

    async def _own_job(self, request: web.Request) -> asyncpg.Record:
        principal = request[PRINCIPAL]
        job_id = request.match_info["job_id"]
        row = await jobs.get(self.pool, job_id)
        if row is None or (row["user_name"] != principal.user and not principal.is_admin):
            raise not_found(f"job {job_id}")
        return row

    async def estimates(self, request: web.Request) -> web.Response:
        row = await self._own_job(request)
        sched = self.scheduler
        # Four forests' predictions: CPU work, off the event loop.
        body = await asyncio.to_thread(
            estimate_report.report,
            row,
            sched.estimator,
            sched.estimator_trained_at,
            sched.estimator_retrain_s > 0,
        )
        return respond(body)

    async def get_job(self, request: web.Request) -> web.Response:
        row = await self._own_job(request)
        body = self._with_deadline_note(jobs.as_dict(row))
        parts = await gang_parts.parts(self.pool, row["id"], row["attempt"])
        if parts and body["placement"] is not None:
            body["placement"]["parts"] = [gang_parts.as_dict(p) for p in parts]
        body["events"] = [
            {
                "at": e["at"].isoformat(),
                "from": e["from_state"],
                "to": e["to_state"],
                "attempt": e["attempt"],
                "node_id": e["node_id"],
                "reason": e["reason"],
            }
            for e in await jobs.events(self.pool, row["id"])
        ]
        if row["state"] == JobState.PENDING:
            wait = self.scheduler.why_pending(row["id"])
            body["pending_reason"] = {"code": wait.code, "reason": wait.reason}
            held = self.scheduler.reservations.get(row["id"])
            if held is not None:
                body["reservation"] = {
                    "node_ids": list(held.node_ids),
                    "expected_start": datetime.fromtimestamp(held.expected_start, UTC).isoformat(),
                    "reason": held.reason,
                }
        return respond(body)

    async def cancel(self, request: web.Request) -> web.Response:
        row = await self._own_job(request)
        principal = request[PRINCIPAL]
        if JobState(row["state"]) in TERMINAL:
            raise Problem(
                409,
                "Already finished",
                f"job {row['id']} already {row['state']}",
                state=row["state"],
            )
        moved = await self.executor.cancel(row["id"], f"cancelled by {principal.user}")
        if moved.ok:
            log.info("job cancel asked", job_id=row["id"], user=principal.user)
            self.scheduler.wake()
        elif moved.current is not JobState.CANCELLING:
            raise Problem(409, "Cannot cancel", moved.detail, state=str(moved.current))
        fresh = await jobs.get(self.pool, row["id"])
        assert fresh is not None
        return respond(jobs.as_dict(fresh), status=202 if fresh["state"] == "cancelling" else 200)

    async def control(self, request: web.Request) -> web.Response:
        row = await self._own_job(request)
        name = request.match_info["control"]
        user = request[PRINCIPAL].user
        try:
            await api_controls.ACTIONS[name](self, request, row, user)
        except job_controls.ControlRefused as exc:
            raise Problem(409, "Cannot control job", str(exc), state=row["state"]) from None
        log.info("job control asked", job_id=row["id"], control=name, user=user)
        self.scheduler.wake()
        fresh = await jobs.get(self.pool, row["id"])
        assert fresh is not None
        return respond(jobs.as_dict(fresh), status=202)

    async def list_nodes(self, request: web.Request) -> web.Response:
        return respond({"nodes": await nodes.list_nodes(self.pool)})

    async def clear_gpu_fault(self, request: web.Request) -> web.Response:
        """An admin puts a GPU taken out of placement for a fault back into it."""
        by = self._admin(request, "clear a GPU's fault")
        node_id, uuid = request.match_info["node_id"], request.match_info["uuid"]
        if not await nodes.has_gpu(self.pool, node_id, uuid):
            raise not_found(f"GPU {uuid} on node {node_id}")
        cleared = await self.hub.clear_fault(node_id, uuid, by=by)
        if cleared is None:
            raise Problem(409, "No fault", f"GPU {uuid} of node {node_id} has no fault to clear")
        return respond(
            {
                "node_id": node_id,
                "uuid": uuid,
                "cleared": {
                    "fault": cleared["fault"],
                    "fault_xid": cleared["fault_xid"],
                    "fault_at": cleared["fault_at"].isoformat(),
                },
            }
        )

    async def drain_node(self, request: web.Request) -> web.Response:
        """An admin takes a node out of placement (api_nodes)."""
        return respond(await api_nodes.drain(self, request, self._admin(request, "drain a node")))

    async def undrain_node(self, request: web.Request) -> web.Response:
        """An admin puts a drained node back into placement (api_nodes)."""
        user = self._admin(request, "undrain a node")
        return respond(await api_nodes.undrain(self, request, user))

    @staticmethod
    def _admin(request: web.Request, what: str) -> str:
        """The admin asking (403 for anyone else, naming `what` they may not do)."""
        if not request[PRINCIPAL].is_admin:
            raise Problem(403, "Forbidden", f"only an admin may {what}")
        return str(request[PRINCIPAL].user)

    async def list_queues(self, request: web.Request) -> web.Response:
        return respond(await queue_report.report(self.scheduler))

    async def logs(self, request: web.Request) -> web.StreamResponse:
        row = await self._own_job(request)
        follow = request.query.get("follow", "0") not in ("0", "false", "")
        offset = _int_param(request.query, "offset", default=0, low=0, high=2**62)
        rank = _int_param(request.query, "rank", default=0, low=0, high=4096)
        if follow:
            row = await self._placed_soon(row)
        if row["node_id"] is None or row["attempt"] == 0:
            raise Problem(
                409, "No logs yet", f"job {row['id']} has not run yet", state=row["state"]
            )
        node_id = await self._log_node(row, rank)
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue[LogChunk] = asyncio.Queue(LOG_QUEUE_CHUNKS)
        self.hub.log_streams[request_id] = queue
        ask = LogRequest(
            request_id=request_id,
            job_id=row["id"],
            attempt=row["attempt"],
            offset=offset,
            follow=follow,
        )
        try:
            if not await self.hub.send(node_id, ask):
                raise Problem(
                    503,
                    "Node unavailable",
                    f"node {node_id} holding the logs is not connected",
                    node_id=node_id,
                )
            # A follower may ask before the job has started; the agent waits for it to.
            first = await asyncio.wait_for(queue.get(), FOLLOW_WAIT_S if follow else 10.0)
            if first.error is not None:
                raise Problem(
                    404 if "no log" in first.error else 502, "Logs unavailable", first.error
                )
            response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
            await response.prepare(request)
            chunk = first
            while True:
                if chunk.data:
                    await response.write(chunk.data.encode())
                if chunk.eof:
                    if chunk.error:
                        await response.write(f"\n[gpusched: {chunk.error}]\n".encode())
                    break
                chunk = await queue.get()
            await response.write_eof()
            return response
        except TimeoutError:
            raise Problem(504, "Node did not answer", "the node did not send the logs") from None
        finally:
            del self.hub.log_streams[request_id]
            await self.hub.send(node_id, LogCancel(request_id=request_id))

    async def _log_node(self, row: asyncpg.Record, rank: int) -> str:
        """The node holding the logs of the job's part of that rank: its own node for a
        job on one node (rank 0 only), a gang's part's node."""
        parts = await gang_parts.parts(self.pool, row["id"], row["attempt"])
        nodes_by_rank = [p["node_id"] for p in parts] or [row["node_id"]]
        if rank >= len(nodes_by_rank):
            raise invalid(
                "rank",
                f"job {row['id']} runs as {len(nodes_by_rank)} part(s): ranks 0 to"
                f" {len(nodes_by_rank) - 1}",
            )
        return str(nodes_by_rank[rank])

    async def _placed_soon(self, row: asyncpg.Record) -> asyncpg.Record:
        """A follower of a job still waiting for its first placement waits for it too,
        for as long as a follower waits for the job to start on its node."""
        deadline = time.monotonic() + FOLLOW_WAIT_S
        while row["attempt"] == 0 and row["state"] == JobState.PENDING:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
            fresh = await jobs.get(self.pool, row["id"])
            assert fresh is not None
            row = fresh
        return row


def _int_param(query: Any, name: str, *, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(name, f"must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise invalid(name, f"must be between {low} and {high}")
    return value


def build_app(api: Api, max_body_bytes: int) -> web.Application:
    app = web.Application(middlewares=[api.middleware], client_max_size=max_body_bytes)
    app.add_routes(api.routes())
    return app
