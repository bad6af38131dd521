"""Two queues on real daemons: one borrows the whole cluster, the other reclaims its guarantee."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e

QUEUES = """
policy = "default"
[queues."a"]
guarantee_gpus = 2
max_gpus = 4
[queues."b"]
guarantee_gpus = 2
max_gpus = 4
[profiles.default.settings]
min_run_s = 0
"""


def queues(cluster: Cluster, token: str) -> dict[str, dict[str, Any]]:
    response = cluster.curl("GET", "/v1/queues", token)
    assert response.status == 200, response.text
    return {q["name"]: q for q in response.body["queues"]}


def test_a_queue_reclaims_its_guarantee_from_a_borrower(cluster: Cluster) -> None:
    cluster.extra_schedd_config = QUEUES
    cluster.start_schedd()
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    alice, bob = cluster.token("alice"), cluster.token("bob")

    # An unknown queue is refused, naming the field and the queues there are.
    refused = cluster.curl("POST", "/v1/jobs", bob, {"name": "x", "script": "true", "queue": "c"})
    assert (refused.status, refused.body["field"]) == (400, "queue")
    assert refused.body["known"] == ["a", "b"]

    bobs = [cluster.submit(bob, script="sleep 300", gpus=1, queue="b") for _ in range(4)]
    for job_id in bobs:
        cluster.wait_state(bob, job_id, "running")
    b = queues(cluster, bob)["b"]
    assert (b["usage"]["gpus"], b["borrowed"]["gpus"]) == (4, 2)
    assert "b " in cluster.schedctl(bob, "queues")

    theirs = cluster.submit(alice, script="sleep 300", gpus=1, queue="a")
    cluster.wait_state(alice, theirs, "running")

    def preempted() -> list[dict[str, Any]]:
        jobs = [cluster.job(bob, j) for j in bobs]
        return [j for j in jobs if j["state"] == "pending"]

    victims = wait_until(preempted, timeout=20, what="a job of bob's requeued")
    assert len(victims) == 1  # alice needed one GPU: one job of bob's made room
    victim = victims[0]
    moves = [(e["from"], e["to"]) for e in victim["events"]]
    assert moves[-3:] == [
        ("assigned", "running"),
        ("running", "preempting"),
        ("preempting", "pending"),
    ]
    reclaim = f"preempted: queue a reclaims its guarantee for job {theirs}"
    assert victim["events"][-2]["reason"] == reclaim
    assert victim["events"][-1]["reason"].startswith(f"requeued after preemption ({reclaim})")
    assert victim["attempt"] == 1 and victim["attained_gpu_s"] > 0
    # It waits: b holds 3 GPUs and nothing is free, and a is within its guarantee.
    assert victim["pending_reason"]["code"] in ("no_capacity", "reserved")
    explained = cluster.schedctl(bob, "explain", victim["id"])
    assert explained.startswith(f"job {victim['id']} (e2e) of bob: pending")

    after = queues(cluster, alice)
    assert (after["a"]["usage"]["gpus"], after["b"]["usage"]["gpus"]) == (1, 3)
    assert after["b"]["pending"] == 1

    log = [json.loads(line) for line in cluster.log("schedd").splitlines() if line[:1] == "{"]
    (logged,) = [e for e in log if e.get("event") == "job preempted"]
    assert (logged["job_id"], logged["queue"], logged["reason"]) == (victim["id"], "b", reclaim)
