"""Draining a node through the API, with scripted agents: nothing new starts on a
drained node while its jobs run on (or are requeued, when the admin asks), it is shown
in `GET /v1/nodes`, kept across a restart, and back in placement when undrained; bad
requests are refused, naming the field, and change nothing."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from schedd.store import tokens
from shared import protocol as p
from tests.integration.fake_agent import FakeAgent, agent_on, exited, started, state_becomes
from tests.integration.inprocess import Schedd, api_call, api_get, start_schedd, submit, waits_with

DRAIN = "/v1/nodes/n1/drain"


async def node_shown(schedd: Schedd, token: str, node_id: str) -> dict[str, Any]:
    listed = (await api_get(schedd, token, "/v1/nodes"))["nodes"]
    return dict(next(n for n in listed if n["node_id"] == node_id))


async def test_a_drained_node_takes_nothing_new_until_it_is_put_back(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    admin = await tokens.create(pool, "root", "admin")
    n1, n2 = await agent_on(schedd, "n1"), await agent_on(schedd, "n2")
    running = await submit(schedd, pool)
    assert (await started(n1, pool, running)).gpu_uuids == ["n1-g0"]  # the fullest first

    status, body = await api_call(schedd, admin, "POST", DRAIN, {"reason": "new firmware"})
    assert status == 200, body
    assert (body["node_id"], body["drain"]["reason"], body["drain"]["by"]) == (
        "n1",
        "new firmware",
        "root",
    )
    assert (body["requeued"], body["jobs"]) == ([], [running])
    shown = await node_shown(schedd, admin, "n1")
    assert (shown["drain_reason"], shown["drained_by"]) == ("new firmware", "root")
    assert shown["drained_at"] == body["drain"]["at"]
    assert (await node_shown(schedd, admin, "n2"))["drained_at"] is None

    # n1 has a GPU free, and is the fullest: without the drain the next job went there.
    second = await submit(schedd, pool)
    assert (await started(n2, pool, second)).gpu_uuids == ["n2-g0"]
    third = await submit(schedd, pool)
    assert (await started(n2, pool, third)).gpu_uuids == ["n2-g1"]
    waiting = await submit(schedd, pool)
    await waits_with(schedd, waiting, "no_capacity")
    # The job on n1 ran on through all this: nothing was sent to stop it.
    assert (await state_becomes(pool, running, "running"))["node_id"] == "n1"

    # A second drain keeps the first one's words.
    status, body = await api_call(schedd, admin, "POST", DRAIN, {"reason": "again"})
    assert (status, body["drain"]["reason"]) == (200, "new firmware")

    status, body = await api_call(schedd, admin, "DELETE", DRAIN)
    assert (status, body["undone"]["reason"]) == (200, "new firmware")
    assert (await started(n1, pool, waiting)).gpu_uuids == ["n1-g1"]
    assert (await node_shown(schedd, admin, "n1"))["drain_reason"] is None
    status, body = await api_call(schedd, admin, "DELETE", DRAIN)
    assert (status, body["detail"]) == (409, "node n1 is not drained")
    for agent in (n1, n2):
        await agent.close()


async def test_a_drain_that_requeues_preempts_the_nodes_jobs(
    schedd: Schedd, pool: asyncpg.Pool
) -> None:
    admin = await tokens.create(pool, "root", "admin")
    n1 = await agent_on(schedd, "n1")
    job = await submit(schedd, pool)
    await started(n1, pool, job)
    n2 = await agent_on(schedd, "n2")
    body = {"reason": "replace PSU", "requeue": True}
    status, answer = await api_call(schedd, admin, "POST", DRAIN, body)
    assert (status, answer["requeued"], answer["jobs"]) == (200, [job], [job])
    kill = await n1.expect(p.Kill)
    assert (kill.job_id, kill.reason) == (job, "node n1 drained by root: replace PSU")
    await exited(n1, job, signal=15)
    # Requeued, it starts again on the other node.
    again = await n2.expect(p.Launch)
    assert (again.job_id, again.attempt, again.gpu_uuids) == (job, 2, ["n2-g0"])
    for agent in (n1, n2):
        await agent.close()


async def test_a_drain_outlives_a_restart(pool: asyncpg.Pool) -> None:
    admin = await tokens.create(pool, "root", "admin")
    async with start_schedd(pool) as first:
        agent = await agent_on(first, "n1")
        status, _ = await api_call(first, admin, "POST", DRAIN, {"reason": "maintenance"})
        assert status == 200
        await agent.close()
    async with start_schedd(pool) as second:
        assert second.hub.drained == {"n1"}
        agent = await agent_on(second, "n1")
        job = await submit(second, pool)
        # It waits for the drained node, as for one that is away.
        assert await waits_with(second, job, "node_away") == (
            "asks for 1 GPUs: the largest connected node has 0, and it waits for a node of 2"
            " that is away or drained rather than run across nodes"
        )
        await api_call(second, admin, "DELETE", DRAIN)
        await started(agent, pool, job)
        await agent.close()


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (None, "reason", 'required: send {"reason": "why the node is drained"}'),
        ({}, "reason", "reason: required field missing"),
        ({"reason": ""}, "reason", "Expected `str` of length >= 1"),
        ({"reason": "x" * 501}, "reason", "Expected `str` of length <= 500"),
        ({"reason": "ok", "requeue": "yes"}, "requeue", "Expected `bool`, got `str`"),
        ({"reason": "ok", "evict": True}, "evict", "evict: unknown field"),
    ],
)
async def test_a_bad_drain_is_refused_and_changes_nothing(
    schedd: Schedd, pool: asyncpg.Pool, body: Any, field: str, words: str
) -> None:
    admin = await tokens.create(pool, "root", "admin")
    agent: FakeAgent = await agent_on(schedd, "n1")
    status, answer = await api_call(schedd, admin, "POST", DRAIN, body)
    assert (status, answer["field"]) == (422, field), answer
    assert words in answer["detail"], answer
    assert schedd.hub.drained == set()
    assert (await node_shown(schedd, admin, "n1"))["drained_at"] is None
    await agent.close()


async def test_only_an_admin_drains_a_node_that_exists(schedd: Schedd, pool: asyncpg.Pool) -> None:
    admin = await tokens.create(pool, "root", "admin")
    alice = await tokens.create(pool, "alice", "user")
    agent = await agent_on(schedd, "n1")
    for method in ("POST", "DELETE"):
        status, answer = await api_call(schedd, alice, method, DRAIN, {"reason": "mine"})
        assert status == 403, answer
    status, answer = await api_call(schedd, admin, "POST", "/v1/nodes/n9/drain", {"reason": "x"})
    assert (status, answer["detail"]) == (404, "no node n9")
    status, answer = await api_call(schedd, admin, "DELETE", "/v1/nodes/n9/drain")
    assert (status, answer["detail"]) == (404, "no node n9")
    assert schedd.hub.drained == set()
    await agent.close()
