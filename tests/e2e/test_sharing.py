"""AntMan on real daemons: a job that waited past the mark runs opportunistically on the
GPU of a little-used guaranteed job, the agent's coordinator throttles it there, and it
is upgraded to guaranteed, without a restart, once that GPU is its own."""

from __future__ import annotations

import sys

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import WORK, events_with, job_files, step_of

pytestmark = pytest.mark.e2e

ANTMAN = """
policy = "antman"
[profiles.antman.settings]
opportunistic_after_s = 2
"""
PAUSE = "0.05"  # seconds between steps: the guaranteed job keeps its GPU little used


def test_a_waiting_job_shares_a_little_used_gpu_then_is_upgraded(cluster: Cluster) -> None:
    cluster.extra_schedd_config = ANTMAN
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=1)
    alice, bob = cluster.token("alice"), cluster.token("bob")
    where = job_files(cluster)
    train = [sys.executable, "-S", "train.py", "0", str(WORK), PAUSE]

    owner = cluster.submit(alice, command=train, cwd=str(where), gpus=1)
    held = cluster.wait_state(alice, owner, "running")["placement"]["gpu_uuids"]
    sharer = cluster.submit(bob, command=train, cwd=str(where), gpus=1)
    waiter = cluster.submit(bob, command=train, cwd=str(where), gpus=1, stay_guaranteed=True)

    # Past the mark, bob's job turns opportunistic and starts beside alice's job.
    job = cluster.wait_state(bob, sharer, "running", timeout=30)
    assert job["kind"] == "opportunistic"
    assert job["placement"]["gpu_uuids"] == held
    assert events_with(cluster, bob, sharer, "now opportunistic, by the scheduler: waited")
    # The agent's coordinator steers it: the guaranteed job keeps its pace.
    wait_until(
        lambda: events_with(cluster, bob, sharer, "limits: coordinator on GPU"),
        what="the coordinator's first setting",
    )
    assert step_of(cluster, alice, owner) > 0
    # The job that opted out still waits, guaranteed (and would take the GPU before
    # bob's sharer is upgraded: a GPU only an opportunistic job holds is free for it).
    stays = cluster.job(bob, waiter)
    assert (stays["state"], stays["kind"]) == ("pending", "guaranteed")
    assert cluster.curl("POST", f"/v1/jobs/{waiter}/cancel", bob).status == 200  # at once

    # Alice's job ends: the GPU is bob's job's own now, and it is upgraded where it runs.
    assert cluster.curl("POST", f"/v1/jobs/{owner}/cancel", alice).status == 202
    upgraded = wait_until(
        lambda: (j := cluster.job(bob, sharer))["kind"] == "guaranteed" and j,
        what="the upgrade",
    )
    assert upgraded["attempt"] == 1 and upgraded["state"] == "running"
    assert events_with(cluster, bob, sharer, "now guaranteed, by the scheduler")
    wait_until(lambda: "job kind changed" in cluster.log("node-a"), what="the agent's word")
    before = step_of(cluster, bob, sharer)
    wait_until(lambda: step_of(cluster, bob, sharer) > before + 5, what="steps after the upgrade")
    assert cluster.curl("POST", f"/v1/jobs/{sharer}/cancel", bob).status == 202
