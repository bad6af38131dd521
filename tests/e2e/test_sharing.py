"""AntMan on real daemons: a job that waited past the mark runs opportunistically on the
GPU of a little-used guaranteed job, the agent's coordinator steers it there, and it is
upgraded to guaranteed, without a restart, once that GPU is its own; an agent that
restarts is told the upgrade again."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.test_job_controls import WORK, events_with, job_files

pytestmark = pytest.mark.e2e

# A short GPU window and a high mark: on a loaded machine a step of CPU work takes
# longer, and one busy burst of step reports must not bar sharing for long. What is
# tested is the mechanism; the mark itself is the unit tests' (tests/unit/test_sharing.py).
SHARING = """
policy = "{profile}"
gpu_window_s = 5
[profiles.{profile}.settings]
opportunistic_after_s = 2
share_after_s = 1
share_below_pct = 90
"""
PAUSE = "0.1"  # seconds between steps: the guaranteed job keeps its GPU little used
STEERED = "limits: coordinator on GPU"
FULL_SHARE = 100  # agentd.coordinator: a job's whole compute


def throttled(cluster: Cluster, token: str, job_id: str) -> None:
    """The agent's coordinator gave the job less than the whole GPU's compute and a memory
    cap below the GPU's, and the job's shim said it applied the cap."""

    def limits() -> tuple[list[int], list[int]] | None:
        said = " | ".join(e["reason"] for e in events_with(cluster, token, job_id, STEERED))
        shares = [int(s) for s in re.findall(r"share \d+ -> (\d+)", said)]
        caps = [int(c) for c in re.findall(r"memory cap (?:none|\d+ MiB) -> (\d+) MiB", said)]
        return (shares, caps) if shares and caps else None

    shares, caps = wait_until(limits, what="the coordinator's share and cap")
    assert all(share < FULL_SHARE for share in shares), shares
    gpu_mib = _gpu_memory_mib(cluster)
    assert all(0 < cap < gpu_mib for cap in caps), (caps, gpu_mib)
    applied = wait_until(
        lambda: events_with(cluster, token, job_id, "cap_applied: memory cap"),
        what="the shim applying the cap",
    )
    assert any(f"memory cap {cap} MiB" in e["reason"] for e in applied for cap in caps), applied


def _gpu_memory_mib(cluster: Cluster) -> int:
    admin = cluster.token("e2e-admin", admin=True)
    nodes: list[dict[str, Any]] = cluster.curl("GET", "/v1/nodes", admin).body["nodes"]
    return int(nodes[0]["gpus"][0]["memory_mib"])


# AntMan's own profile, and the default, which takes its kinds over time.
@pytest.mark.parametrize("profile", ["antman", "default"])
def test_a_waiting_job_shares_a_little_used_gpu_then_is_upgraded(
    cluster: Cluster, profile: str
) -> None:
    cluster.extra_schedd_config = SHARING.format(profile=profile)
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=1)
    alice, bob = cluster.token("alice"), cluster.token("bob")
    where = job_files(cluster)
    train = [sys.executable, "-S", "train.py", "0", str(WORK), PAUSE]

    owner = cluster.submit(alice, command=train, cwd=str(where), gpus=1)
    held = cluster.wait_state(alice, owner, "running")["placement"]["gpu_uuids"]
    waiter = cluster.submit(bob, command=train, cwd=str(where), gpus=1, stay_guaranteed=True)
    sharer = cluster.submit(bob, command=train, cwd=str(where), gpus=1)

    # Past the mark, bob's job turns opportunistic and starts beside alice's job, where
    # the agent's coordinator steers it (it joined a GPU with a guaranteed job).
    job = cluster.wait_state(bob, sharer, "running", timeout=60)
    assert job["kind"] == "opportunistic" and job["spec"].get("kind") is None
    assert job["placement"]["gpu_uuids"] == held
    assert events_with(cluster, bob, sharer, "now opportunistic, by the scheduler: waited")
    throttled(cluster, bob, sharer)
    # The job that opted out, past its mark before the sharer's, still waits guaranteed
    # (it would take the GPU before bob's sharer is upgraded: a GPU only an
    # opportunistic job holds is free for it).
    stays = cluster.job(bob, waiter)
    assert (stays["state"], stays["kind"]) == ("pending", "guaranteed")
    assert not events_with(cluster, bob, waiter, "now opportunistic")
    assert cluster.curl("POST", f"/v1/jobs/{waiter}/cancel", bob).status == 200  # at once

    # Alice's job ends: the GPU is bob's job's own now, and it is upgraded where it runs.
    assert cluster.curl("POST", f"/v1/jobs/{owner}/cancel", alice).status == 202
    upgraded = wait_until(
        lambda: (j := cluster.job(bob, sharer))["kind"] == "guaranteed" and j,
        what="the upgrade",
    )
    assert (upgraded["attempt"], upgraded["state"]) == (1, "running")
    assert events_with(cluster, bob, sharer, "now guaranteed, by the scheduler")
    wait_until(lambda: events_with(cluster, bob, sharer, "kind: guaranteed: taken by"))

    # The agent restarts and recovers the job as it was launched; schedd tells it the
    # upgrade again, so a new opportunistic job on that GPU is steered beside it.
    cluster.kill9(cluster.agents["node-a"])
    cluster.start_agent("node-a", gpus=1)
    wait_until(lambda: len(events_with(cluster, bob, sharer, "kind: guaranteed")) >= 2)
    guest = cluster.submit(alice, command=train, cwd=str(where), gpus=1, kind="opportunistic")
    try:
        started = cluster.wait_state(alice, guest, "running", timeout=60)
    except AssertionError:
        admin = cluster.token("e2e-admin", admin=True)
        gpus = [g for n in cluster.curl("GET", "/v1/nodes", admin).body["nodes"] for g in n["gpus"]]
        every = cluster.curl("GET", "/v1/jobs", admin).body["jobs"]
        jobs = [(j["id"], j["state"], j["kind"], j["started_at"]) for j in every]
        raise AssertionError(
            f"guest not started: {cluster.job(alice, guest)['pending_reason']}; GPUs: {gpus};"
            f" jobs: {jobs}; schedd: {cluster.log('schedd')[-1500:]}"
        ) from None
    assert started["placement"]["gpu_uuids"] == held
    throttled(cluster, alice, guest)
    for job_id, token in ((guest, alice), (sharer, bob)):
        assert cluster.curl("POST", f"/v1/jobs/{job_id}/cancel", token).status == 202
