"""Malformed and hostile requests against the real API on a real port.

Each is refused with the right 4xx as application/problem+json naming the field at
fault, and leaves the jobs and job_events tables exactly as they were.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson
import pytest
from aiohttp import ClientResponse, ClientSession
from aiohttp.test_utils import TestServer

from schedd.store import jobs, tokens
from shared.config import SchedConfig
from shared.model import JobState, parse_spec
from tests.integration.inprocess import start_schedd

MAX_BODY = SchedConfig().max_body_bytes
REUSED_KEY = "retry-1"
DROP = object()
HUGE_INT = orjson.Fragment(b"1" + b"0" * 30)


def spec(**fields: Any) -> bytes:
    """A valid job spec as JSON, with fields replaced (or removed with DROP)."""
    body: dict[str, Any] = {"name": "train", "command": ["python3", "train.py"]}
    body.update(fields)
    return orjson.dumps({k: v for k, v in body.items() if v is not DROP})


@dataclasses.dataclass(frozen=True)
class Case:
    method: str
    path: str
    status: int
    field: str | None = None
    body: bytes | None = None
    user: str | None = "alice"
    authorization: str | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    members: dict[str, Any] = dataclasses.field(default_factory=dict)
    response_headers: dict[str, str] = dataclasses.field(default_factory=dict)


def submit(
    body: bytes,
    status: int,
    field: str | None = None,
    *,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
    **kw: Any,
) -> Case:
    headers = {"Content-Type": content_type, **(headers or {})}
    return Case("POST", "/v1/jobs", status, field, body=body, headers=headers, **kw)


def get(path: str, status: int, field: str | None = None, **kw: Any) -> Case:
    return Case("GET", path, status, field, **kw)


def post(path: str, status: int, field: str | None = None, **kw: Any) -> Case:
    return Case("POST", path, status, field, **kw)


CASES = [
    pytest.param(submit(spec(gpus="2"), 422, "gpus"), id="gpus-as-string"),
    pytest.param(submit(spec(gpus=True), 422, "gpus"), id="gpus-as-bool"),
    pytest.param(submit(spec(command="python3 train.py"), 422, "command"), id="command-as-string"),
    pytest.param(submit(spec(command=["python3", 3]), 422, "command[1]"), id="command-item-int"),
    pytest.param(submit(spec(env={"LR": 0.1}), 422, "env"), id="env-value-not-string"),
    pytest.param(submit(spec(env={"1BAD": "x"}), 422, "env"), id="env-key-bad"),
    pytest.param(submit(spec(gpu=2), 422, "gpu"), id="unknown-field"),
    pytest.param(submit(spec(gpus=-1), 422, "gpus"), id="gpus-negative"),
    pytest.param(submit(spec(gpus=4097), 422, "gpus"), id="gpus-too-large"),
    pytest.param(submit(spec(gpus=HUGE_INT), 422, "gpus"), id="gpus-beyond-int64"),
    pytest.param(submit(spec(cpus=0), 422, "cpus"), id="cpus-zero"),
    pytest.param(submit(spec(cpus=1e-300), 422, "cpus"), id="cpus-below-a-hundredth"),
    pytest.param(submit(spec(name=DROP), 422, "name"), id="name-missing"),
    pytest.param(submit(spec(name="x; rm -rf /"), 422, "name"), id="name-bad-characters"),
    pytest.param(submit(spec(script="echo hi"), 422, "command"), id="command-and-script"),
    pytest.param(submit(spec(command=DROP), 422, "command"), id="neither-command-nor-script"),
    pytest.param(submit(spec(command=[]), 422, "command"), id="command-empty"),
    pytest.param(submit(spec(queue="Prod Queue"), 422, "queue"), id="queue-bad-name"),
    pytest.param(submit(spec(priority=1001), 422, "priority"), id="priority-too-high"),
    pytest.param(submit(spec(priority=-1001), 422, "priority"), id="priority-too-low"),
    pytest.param(
        submit(spec(estimated_runtime_s=0), 422, "estimated_runtime_s"), id="estimate-zero"
    ),
    pytest.param(
        submit(spec(estimated_runtime_s=-5.5), 422, "estimated_runtime_s"), id="estimate-negative"
    ),
    pytest.param(
        submit(spec(estimated_runtime_s="1h"), 422, "estimated_runtime_s"), id="estimate-string"
    ),
    pytest.param(
        submit(spec(estimated_runtime_s=True), 422, "estimated_runtime_s"), id="estimate-bool"
    ),
    pytest.param(
        submit(spec(estimated_runtime_s=1e12), 422, "estimated_runtime_s"), id="estimate-huge"
    ),
    pytest.param(submit(spec(kind="spot"), 422, "kind"), id="kind-unknown"),
    pytest.param(
        submit(spec(deadline="2030-01-01T12:00:00"), 422, "deadline"), id="deadline-naive"
    ),
    pytest.param(submit(spec(cwd="work/run"), 422, "cwd"), id="cwd-relative"),
    pytest.param(submit(spec(gpus=4, min_gpus=0), 422, "min_gpus"), id="min-gpus-zero"),
    pytest.param(submit(spec(gpus=2, min_gpus=3), 422, "min_gpus"), id="min-gpus-above-gpus"),
    pytest.param(submit(spec(gpus=0, min_gpus=1), 422, "min_gpus"), id="min-gpus-no-gpus"),
    pytest.param(submit(spec(min_gpus="2"), 422, "min_gpus"), id="min-gpus-string"),
    pytest.param(submit(spec(min_gpus=2.5), 422, "min_gpus"), id="min-gpus-float"),
    pytest.param(
        submit(spec(command=["python3", "-c", "print(1)\x00"]), 422, "command"),
        id="command-with-nul",
    ),
    pytest.param(submit(spec(env={"A": "x\x00y"}), 422, "env"), id="env-value-with-nul"),
    pytest.param(
        submit(spec(command=DROP, script="echo\x00"), 422, "script"), id="script-with-nul"
    ),
    pytest.param(submit(spec(labels={"m": "\x00"}), 422, "labels"), id="label-with-nul"),
    pytest.param(submit(spec(command=["x" * MAX_BODY]), 413), id="body-over-1mib"),
    pytest.param(submit(b'{"name": "train",', 400), id="json-malformed"),
    pytest.param(submit(spec() + b" junk", 400), id="json-trailing-garbage"),
    pytest.param(submit(b'{"name": "t", "command": ["\\ud800"]}', 400), id="json-lone-surrogate"),
    pytest.param(submit(b"", 400), id="body-empty"),
    pytest.param(submit(b"  \n", 400), id="body-whitespace"),
    pytest.param(submit(b"[" + spec() + b"]", 422), id="json-array"),
    pytest.param(submit(b"null", 422), id="json-null"),
    pytest.param(
        submit(b"<job><name>train</name></job>", 415, "Content-Type", content_type="text/xml"),
        id="content-type-xml",
    ),
    pytest.param(
        submit(spec(), 422, "Idempotency-Key", headers={"Idempotency-Key": "k" * 300}),
        id="idempotency-key-300-chars",
    ),
    pytest.param(
        submit(spec(), 422, "Idempotency-Key", headers={"Idempotency-Key": ""}),
        id="idempotency-key-empty",
    ),
    pytest.param(
        submit(spec(gpus=2), 409, "Idempotency-Key", headers={"Idempotency-Key": REUSED_KEY}),
        id="idempotency-key-reused-other-spec",
    ),
    pytest.param(
        submit(spec(), 401, user=None, response_headers={"WWW-Authenticate": "Bearer"}),
        id="authorization-missing",
    ),
    pytest.param(
        submit(spec(), 401, authorization="Bearer gst_forged"), id="authorization-unknown-token"
    ),
    pytest.param(
        submit(spec(), 401, authorization="Basic YWxpY2U6c2VjcmV0"), id="authorization-basic"
    ),
    pytest.param(submit(spec(), 401, authorization="Bearer   "), id="authorization-bearer-empty"),
    pytest.param(get("/v1/jobs", 401, user=None), id="list-unauthenticated"),
    pytest.param(get("/v1/jobs/{bob_job}", 404), id="get-others-job"),
    pytest.param(post("/v1/jobs/{bob_job}/cancel", 404), id="cancel-others-job"),
    pytest.param(post("/v1/jobs/{done_job}/cancel", 404, user="bob"), id="cancel-others-done-job"),
    pytest.param(get("/v1/jobs/{bob_job}/logs", 404), id="logs-others-job"),
    pytest.param(get("/v1/jobs/j-0000000000000000", 404), id="get-unknown-job"),
    pytest.param(post("/v1/jobs/j-0000000000000000/cancel", 404), id="cancel-unknown-job"),
    pytest.param(
        post("/v1/jobs/{done_job}/cancel", 409, members={"state": "succeeded"}),
        id="cancel-finished-job",
    ),
    pytest.param(get("/v1/jobs?state=bogus", 422, "state"), id="list-state-bogus"),
    pytest.param(get("/v1/jobs?limit=abc", 422, "limit"), id="list-limit-not-int"),
    pytest.param(get("/v1/jobs?limit=0", 422, "limit"), id="list-limit-zero"),
    pytest.param(get("/v1/jobs?limit=1001", 422, "limit"), id="list-limit-too-large"),
    pytest.param(get("/v1/jobs?limit=-5", 422, "limit", user="admin"), id="list-limit-admin"),
    pytest.param(get("/v1/jobs?after=-1", 422, "after"), id="list-after-negative"),
    pytest.param(get("/v1/jobs?user=bob", 403, "user"), id="list-other-user-not-admin"),
]


@dataclasses.dataclass
class World:
    pool: asyncpg.Pool
    server: TestServer
    http: ClientSession
    tokens: dict[str, str]
    jobs: dict[str, str]

    async def send(self, case: Case) -> ClientResponse:
        headers = dict(case.headers)
        if case.authorization is not None:
            headers["Authorization"] = case.authorization
        elif case.user is not None:
            headers["Authorization"] = f"Bearer {self.tokens[case.user]}"
        url = self.server.make_url(case.path.format(**self.jobs))
        return await self.http.request(case.method, url, data=case.body, headers=headers)


async def finished_job(pool: asyncpg.Pool, user: str) -> str:
    row, _ = await jobs.submit(pool, user, parse_spec(spec(name="done")), None)
    for state in (JobState.ASSIGNED, JobState.RUNNING, JobState.SUCCEEDED):
        moved = await jobs.transition(pool, row["id"], state, "test", node_id="n")
        assert moved.ok, moved.detail
    return str(row["id"])


@pytest.fixture
async def world(pool: asyncpg.Pool) -> AsyncIterator[World]:
    bob_job, _ = await jobs.submit(pool, "bob", parse_spec(spec(name="bobs")), None)
    await jobs.submit(pool, "alice", parse_spec(spec()), REUSED_KEY)
    async with start_schedd(pool) as schedd, ClientSession() as http:
        yield World(
            pool=pool,
            server=schedd.server,
            http=http,
            tokens={
                "alice": await tokens.create(pool, "alice", "user"),
                "bob": await tokens.create(pool, "bob", "user"),
                "admin": await tokens.create(pool, "root", "admin"),
            },
            jobs={"bob_job": bob_job["id"], "done_job": await finished_job(pool, "alice")},
        )


async def stored(pool: asyncpg.Pool) -> tuple[dict[str, str], int]:
    """Every job's state, and the number of job events."""
    states = {r["id"]: r["state"] for r in await pool.fetch("SELECT id, state FROM jobs")}
    return states, await pool.fetchval("SELECT count(*) FROM job_events")


@pytest.mark.parametrize("case", CASES)
async def test_bad_request_is_refused_and_stores_nothing(world: World, case: Case) -> None:
    before = await stored(world.pool)
    async with await world.send(case) as resp:
        assert resp.status == case.status, await resp.text()
        assert resp.content_type == "application/problem+json"
        problem = await resp.json(content_type=None)
        for header, value in case.response_headers.items():
            assert resp.headers.get(header) == value
    assert problem["status"] == case.status
    assert isinstance(problem["detail"], str) and problem["detail"]
    if case.field is not None:
        assert problem.get("field") == case.field, problem
    for member, value in case.members.items():
        assert problem.get(member) == value, problem
    assert await stored(world.pool) == before


async def test_valid_submit_stores_one_job_and_one_event(world: World) -> None:
    states, events = await stored(world.pool)
    async with await world.send(submit(spec(gpus=2), 201)) as resp:
        assert resp.status == 201, await resp.text()
        job = await resp.json()
    after_states, after_events = await stored(world.pool)
    assert after_states == {**states, job["id"]: "pending"}
    assert after_events == events + 1
    assert (job["user"], job["spec"]["gpus"]) == ("alice", 2)


async def test_an_elastic_job_shows_its_gpu_range(world: World) -> None:
    async with await world.send(submit(spec(gpus=4, min_gpus=2), 201)) as resp:
        assert resp.status == 201, await resp.text()
        job = await resp.json()
    assert (job["gpus"], job["gpu_range"], job["spec"]["min_gpus"]) == (4, [2, 4], 2)
    get_job = get(f"/v1/jobs/{job['id']}", 200)
    async with await world.send(get_job) as resp:
        shown = await resp.json()
    assert (shown["gpus"], shown["gpu_range"]) == (4, [2, 4])
    # A job that is not elastic has no range.
    async with await world.send(submit(spec(gpus=2, name="fixed"), 201)) as resp:
        assert "gpu_range" not in await resp.json()
    # The error names the field and says the bound.
    async with await world.send(submit(spec(gpus=2, min_gpus=3), 422, "min_gpus")) as resp:
        problem = await resp.json(content_type=None)
    assert problem["field"] == "min_gpus" and "at most `gpus` (2)" in problem["detail"]


async def test_a_spec_without_content_type_is_taken_as_json(world: World) -> None:
    url = world.server.make_url("/v1/jobs")
    headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
    body = orjson.dumps({"name": "plain", "command": ["true"]})
    async with world.http.post(
        url, data=body, headers=headers, skip_auto_headers={"Content-Type"}
    ) as resp:
        assert resp.status == 201, await resp.text()
