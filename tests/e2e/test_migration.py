"""Gandiva's migration on real daemons, a migration on departure: two nodes of two GPUs
each run a long and a short training job apiece, and a job asking for two GPUs waits
(no node has them, and no job of two GPUs runs to take turns with). When the short jobs
have ended, each node has one GPU free: one long job saves a checkpoint, is requeued
pinned to the other node and resumes there from the step it saved, and the waiting job
starts on the node it left. Everything is asked and read over HTTP with curl."""

from __future__ import annotations

import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import ROOT, reasons, step_of

pytestmark = pytest.mark.e2e

# No minimum run before a move (the jobs here run for seconds). A move costs the default
# 60 s of its GPUs: far less than the hour the waiting job would otherwise wait for the
# long jobs' GPUs, by their estimates.
GANDIVA = """
policy = "gandiva"
[profiles.gandiva.settings]
min_run_s = 1
"""
LONG_S = 3600.0  # the long jobs' estimated run time: what the waiting job would wait
# Steps until a file exists (and at least a few were done), each a short sleep (the
# shim's boundaries come often whatever the machine's load), saying on how many GPUs.
TRAIN = """
import json, os, sys, time
from pathlib import Path

import shim

stop, least = Path(sys.argv[1]), int(sys.argv[2])
state = {"step": 0}
resumed = shim.resume_state()
if resumed is not None:
    state = json.loads((Path(resumed.path) / "state.json").read_text())
shim.on_checkpoint(lambda d: (Path(d) / "state.json").write_text(json.dumps(state)))
gpus = len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
print(json.dumps({"started_at": state["step"], "gpus": gpus}), flush=True)
while state["step"] < least or not stop.exists():
    with shim.step():
        time.sleep(0.02)
        state["step"] += 1
    time.sleep(0.03)
print(json.dumps({"finished_at": state["step"]}), flush=True)
"""
WAIT_S = 120  # any one step of the scenario, on a loaded 2-core machine


def node_of(job: dict[str, Any]) -> str:
    return str(job["placement"]["node_id"])


def test_a_long_job_moves_so_that_a_wide_job_starts(cluster: Cluster) -> None:
    cluster.extra_schedd_config = GANDIVA
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=2)
    cluster.start_agent("node-b", gpus=2)
    alice = cluster.token("alice")
    where = cluster.root / "job"
    where.mkdir()
    shutil.copy(ROOT / "shared" / "shim.py", where / "shim.py")
    (where / "train.py").write_text(TRAIN)
    short_stop, long_stop = cluster.root / "short-done", cluster.root / "long-done"

    def train(stop: Path, **spec: Any) -> str:
        command = [sys.executable, "-S", "train.py", str(stop), "5"]
        return cluster.submit(alice, command=command, cwd=str(where), gpus=1, **spec)

    def running(job_id: str) -> dict[str, Any]:
        return cluster.wait_state(alice, job_id, "running", timeout=WAIT_S)

    # One long and one short job on each node (placement fills the fullest node first).
    x = train(long_stop, estimated_runtime_s=LONG_S)
    node_x = node_of(running(x))
    w = train(short_stop)
    assert node_of(running(w)) == node_x
    y = train(long_stop, estimated_runtime_s=LONG_S)
    node_y = node_of(running(y))
    v = train(short_stop)
    assert node_of(running(v)) == node_y != node_x
    # The long jobs step through their shims: they can save a checkpoint on request.
    for job_id in (x, y):
        wait_until(lambda j=job_id: step_of(cluster, alice, j) > 3, WAIT_S, "steps")
        wait_until(lambda j=job_id: cluster.job(alice, j).get("checkpointable"), WAIT_S)

    z = cluster.submit(
        alice,
        command=[sys.executable, "-S", "train.py", str(short_stop), "20"],
        cwd=str(where),
        gpus=2,
    )

    def considered() -> dict[str, Any] | None:
        job = cluster.job(alice, z)
        code = (job.get("pending_reason") or {}).get("code")
        return job if job["state"] != "pending" or code not in (None, "not_considered") else None

    waiting = wait_until(considered, WAIT_S, "Z considered by a cycle")
    assert waiting["state"] == "pending", waiting
    assert all("migration" not in r for j in (x, y) for r in reasons(cluster, alice, j))

    # The short jobs end: one GPU free on each node, and one long job moves.
    short_stop.touch()
    for job_id in (w, v):
        done = cluster.wait_state(alice, job_id, "succeeded", "failed", timeout=WAIT_S)
        assert done["state"] == "succeeded", done

    def mover() -> str | None:
        for job_id in (x, y):
            if any(r.startswith("migration from node") for r in reasons(cluster, alice, job_id)):
                return job_id
        return None

    moved = wait_until(mover, WAIT_S, "a long job asked to migrate")
    left, other = (node_x, node_y) if moved == x else (node_y, node_x)
    said = reasons(cluster, alice, moved)
    asked = next(r for r in said if r.startswith("migration from node"))
    assert asked.startswith(
        f"migration from node {left} to node {other} asked by the scheduler:"
        f" to free 2 GPU(s) on node {left} for job {z}"
    ), asked

    # It resumes on the other node from the step it saved, not from 0.
    def resumed() -> dict[str, Any] | None:
        job = cluster.job(alice, moved)
        return job if job["state"] == "running" and job["attempt"] == 2 else None

    job = wait_until(resumed, WAIT_S, "the mover running again")
    assert node_of(job) == other
    said = reasons(cluster, alice, moved)
    saved_words = next(r for r in said if r.startswith("checkpointed: checkpoint of step"))
    saved = int(saved_words.split()[-2])
    assert saved > 3
    assert job["checkpoint"].endswith(f"step-{saved:09d}")
    assert f"moving from node {left} to node {other}: resumes from {job['checkpoint']}" in said
    wait_until(lambda: step_of(cluster, alice, moved) > saved, WAIT_S, "steps after the move")
    log = cluster.curl("GET", f"/v1/jobs/{moved}/logs", alice).text
    assert f'{{"started_at": {saved}, "gpus": 1}}' in log, log

    # The waiting job started on the node the mover left.
    started = cluster.wait_state(alice, z, "running", "succeeded", timeout=WAIT_S)
    assert node_of(started) == left
    admin = cluster.token("e2e-admin", admin=True)
    nodes = cluster.curl("GET", "/v1/nodes", admin).body["nodes"]
    whole = [g["uuid"] for n in nodes if n["node_id"] == left for g in n["gpus"]]
    assert sorted(started["placement"]["gpu_uuids"]) == sorted(whole)

    long_stop.touch()
    for job_id in (x, y, z):
        done = cluster.wait_state(alice, job_id, "succeeded", "failed", timeout=WAIT_S)
        assert done["state"] == "succeeded", done
    final = cluster.job(alice, moved)
    assert final["attempt"] == 2 and "migrating_to" not in final
    # Its service counts both runs: the one before the move is not lost.
    events = final["events"]
    began = next(e["at"] for e in events if e["to"] == "running" and e["attempt"] == 1)
    left_at = next(e["at"] for e in events if e["from"] == "running" and e["to"] == "pending")
    first_run_s = (datetime.fromisoformat(left_at) - datetime.fromisoformat(began)).total_seconds()
    assert final["attained_gpu_s"] > first_run_s > 0, (final["attained_gpu_s"], first_run_s)
    unmoved = y if moved == x else x
    assert cluster.job(alice, unmoved)["attempt"] == 1
