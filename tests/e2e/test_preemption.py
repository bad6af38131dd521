"""Two queues on real daemons: one borrows the whole cluster, the other reclaims its
guarantee; a preempted job whose shim can save resumes from the checkpoint it saved."""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import ROOT, reasons, step_of
from tests.e2e.test_migration import TRAIN, WAIT_S

pytestmark = pytest.mark.e2e


def two_queues(guarantee: int) -> str:
    """schedd.toml: queues a and b, each guaranteed `guarantee` GPUs and borrowing up to
    twice that, under the default profile with no minimum run before a preemption."""
    return f"""
policy = "default"
[queues."a"]
guarantee_gpus = {guarantee}
max_gpus = {2 * guarantee}
[queues."b"]
guarantee_gpus = {guarantee}
max_gpus = {2 * guarantee}
[profiles.default.settings]
min_run_s = 0
"""


def queues(cluster: Cluster, token: str) -> dict[str, dict[str, Any]]:
    response = cluster.curl("GET", "/v1/queues", token)
    assert response.status == 200, response.text
    return {q["name"]: q for q in response.body["queues"]}


def test_a_queue_reclaims_its_guarantee_from_a_borrower(cluster: Cluster) -> None:
    cluster.extra_schedd_config = two_queues(2)
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


def test_a_preempted_job_saves_a_checkpoint_and_resumes_from_it(cluster: Cluster) -> None:
    cluster.extra_schedd_config = two_queues(1)
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=2)
    alice, bob = cluster.token("alice"), cluster.token("bob")
    where = cluster.root / "job"
    where.mkdir()
    shutil.copy(ROOT / "shared" / "shim.py", where / "shim.py")
    (where / "train.py").write_text(TRAIN)
    stop = cluster.root / "stop"
    command = [sys.executable, "-S", "train.py", str(stop), "5"]

    # Bob's two training jobs take both GPUs (one borrowed), and step through their shims.
    bobs = [cluster.submit(bob, command=command, cwd=str(where), gpus=1, queue="b") for _ in "xy"]
    for job_id in bobs:
        cluster.wait_state(bob, job_id, "running", timeout=WAIT_S)
        wait_until(lambda j=job_id: step_of(cluster, bob, j) > 3, WAIT_S, "steps")
        wait_until(lambda j=job_id: cluster.job(bob, j).get("checkpointable"), WAIT_S)

    # Alice's queue reclaims its guarantee: one of bob's jobs saves, then makes room.
    theirs = cluster.submit(alice, script="sleep 2", gpus=1, queue="a")

    def victim() -> str | None:
        return next((j for j in bobs if cluster.job(bob, j)["attempt"] == 2), None)

    moved = wait_until(victim, WAIT_S, "a job of bob's requeued")
    said = reasons(cluster, bob, moved)
    saved_words = next(r for r in said if r.startswith("checkpointed: checkpoint of step"))
    saved = int(saved_words.split()[-2])
    assert saved > 3
    job = cluster.job(bob, moved)
    assert job["checkpoint"].endswith(f"step-{saved:09d}")
    reclaim = f"preempted: queue a reclaims its guarantee for job {theirs}"
    assert (
        f"requeued after preemption ({reclaim}): checkpoint saved, resumes from {job['checkpoint']}"
        in said
    ), said
    assert not any("SIGTERM" in r for r in said)  # it exited on its own, having saved

    # Once alice's job is done, it runs again from the step it saved, not from 0.
    done = cluster.wait_state(alice, theirs, "succeeded", "failed", timeout=WAIT_S)
    assert done["state"] == "succeeded", done
    cluster.wait_state(bob, moved, "running", timeout=WAIT_S)
    wait_until(lambda: step_of(cluster, bob, moved) > saved, WAIT_S, "steps after the resume")
    log = cluster.curl("GET", f"/v1/jobs/{moved}/logs", bob).text
    assert f'{{"started_at": {saved}, "gpus": 1}}' in log, log

    stop.touch()
    for job_id in bobs:
        ended = cluster.wait_state(bob, job_id, "succeeded", "failed", timeout=WAIT_S)
        assert ended["state"] == "succeeded", ended
