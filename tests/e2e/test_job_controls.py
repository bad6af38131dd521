"""A real training loop with the shim, controlled through schedd over curl: its step rate
follows its share, suspend stops it, resume goes on, and a migration resumes it on the
other node from the step it saved."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
WORK = 20_000  # loop turns in one step: a few milliseconds of CPU


def job_files(cluster: Cluster) -> Path:
    """The job as an image would hold it: the training script with shim.py beside it."""
    where = cluster.root / "job"
    where.mkdir()
    shutil.copy(ROOT / "shared" / "shim.py", where / "shim.py")
    shutil.copy(ROOT / "tests" / "integration" / "shim_job.py", where / "train.py")
    return where


def shim_jobs_on_one_gpu(
    cluster: Cluster, config: str, steps: str, pause: str
) -> tuple[str, Callable[[], str]]:
    """schedd with `config` and one agent with one GPU: alice's token, and a submit of her
    1-GPU training job through the shim (`steps` steps, each followed by `pause` s)."""
    cluster.extra_schedd_config = config
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=1)
    alice = cluster.token("alice")
    train = [sys.executable, "-S", "train.py", steps, str(WORK), pause]
    where = str(job_files(cluster))

    def submit() -> str:
        return cluster.submit(alice, command=train, cwd=where, gpus=1)

    return alice, submit


def step_of(cluster: Cluster, token: str, job_id: str) -> int:
    progress = cluster.job(token, job_id)["progress"]
    return int(progress["step"]) if progress else 0


def rate(cluster: Cluster, token: str, job_id: str, seconds: float) -> float:
    """Steps a second over `seconds`, from the steps the job reported to schedd."""
    first, began = step_of(cluster, token, job_id), time.monotonic()
    time.sleep(seconds)
    return (step_of(cluster, token, job_id) - first) / (time.monotonic() - began)


def gpu_of(cluster: Cluster, token: str, job_id: str) -> dict[str, Any]:
    nodes = cluster.curl("GET", "/v1/nodes", token).body["nodes"]
    return next(g for n in nodes for g in n["gpus"] if g["job_id"] == job_id)


def reasons(cluster: Cluster, token: str, job_id: str) -> list[str]:
    return [e["reason"] for e in cluster.job(token, job_id)["events"]]


def events_with(cluster: Cluster, token: str, job_id: str, words: str) -> list[dict[str, Any]]:
    return [e for e in cluster.job(token, job_id)["events"] if words in e["reason"]]


def control(cluster: Cluster, token: str, job_id: str, name: str, body: Any = None) -> None:
    response = cluster.curl("POST", f"/v1/jobs/{job_id}/{name}", token, body)
    assert response.status == 202, response.text


def test_share_suspend_resume_and_migration_of_a_training_job(running: Cluster) -> None:
    cluster = running
    alice = cluster.token("alice")
    where = job_files(cluster)
    job_id = cluster.submit(
        alice, command=[sys.executable, "-S", "train.py", "0", str(WORK)], cwd=str(where), gpus=1
    )
    job = cluster.wait_state(alice, job_id, "running")
    first_node = job["placement"]["node_id"]
    wait_until(lambda: step_of(cluster, alice, job_id) > 20, what="the job's first steps")

    full = rate(cluster, alice, job_id, 3.0)
    # The simulated GPU reads what the job's shim reports: busy while it steps.
    admin = cluster.token("e2e-admin", admin=True)
    wait_until(lambda: gpu_of(cluster, admin, job_id)["utilization_pct"] >= 50, what="busy GPU")
    control(cluster, alice, job_id, "limits", {"share": 25})
    wait_until(lambda: events_with(cluster, alice, job_id, "limits: share 25"), what="limits")
    time.sleep(1.5)  # the report in flight still counts steps at full speed
    quarter = rate(cluster, alice, job_id, 4.0)
    control(cluster, alice, job_id, "limits", {"share": 100})
    time.sleep(1.5)
    again = rate(cluster, alice, job_id, 3.0)
    assert 0.1 < quarter / full < 0.45, (full, quarter)
    assert again > 0.6 * full, (full, again)

    # Bad input names the field and changes nothing.
    bad = cluster.curl("POST", f"/v1/jobs/{job_id}/limits", alice, {"share": 101})
    assert (bad.status, bad.body["field"]) == (422, "share")

    control(cluster, alice, job_id, "suspend")
    wait_until(lambda: events_with(cluster, alice, job_id, "suspended: suspended at step"))
    wait_until(lambda: gpu_of(cluster, admin, job_id)["utilization_pct"] == 0, what="idle GPU")
    time.sleep(1.5)
    stopped = step_of(cluster, alice, job_id)
    time.sleep(2.0)
    assert step_of(cluster, alice, job_id) == stopped
    control(cluster, alice, job_id, "resume")
    wait_until(lambda: events_with(cluster, alice, job_id, "resumed: resumed at step"))
    wait_until(lambda: step_of(cluster, alice, job_id) > stopped + 10, what="steps after resume")

    other = "node-b" if first_node == "node-a" else "node-a"
    control(cluster, alice, job_id, "migrate", {"node": other})
    wait_until(lambda: events_with(cluster, alice, job_id, "checkpointed: checkpoint of step"))
    saved = int(events_with(cluster, alice, job_id, "checkpointed:")[0]["reason"].split()[-2])
    # The first attempt is still `running` until its exit after the save is recorded.
    wait_until(lambda: cluster.job(alice, job_id)["attempt"] == 2, what="the second attempt")
    job = cluster.wait_state(alice, job_id, "running", timeout=30)
    assert job["attempt"] == 2 and job["placement"]["node_id"] == other
    assert job["checkpoint"] and job["checkpoint"].endswith(f"step-{saved:09d}")
    wait_until(lambda: step_of(cluster, alice, job_id) > saved, what="steps on the new node")
    log = cluster.curl("GET", f"/v1/jobs/{job_id}/logs", alice).text
    assert f'{{"started_at": {saved}}}' in log  # the second attempt began at the saved step

    moves = [(e["from"], e["to"]) for e in cluster.job(alice, job_id)["events"]]
    assert ("running", "pending") in moves and moves[-1] == ("assigned", "running")
    reasons = " | ".join(e["reason"] for e in cluster.job(alice, job_id)["events"])
    moved = f"migration from node {first_node} to node {other} asked by alice"
    for words in ("share 25", "suspend asked by alice", moved):
        assert words in reasons
    assert cluster.curl("POST", f"/v1/jobs/{job_id}/cancel", alice).status == 202
