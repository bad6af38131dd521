"""A job's life through the real processes, driven with the real curl binary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_until
from tests.processes import alive

pytestmark = pytest.mark.e2e
PY = sys.executable


def test_job_runs_to_success_and_its_output_is_readable(running: Cluster) -> None:
    alice = running.token("alice")
    code = "import time\nfor i in range(3):\n    print('step', i, flush=True); time.sleep(0.3)"
    job_id = running.submit(alice, command=[PY, "-c", code], gpus=1)
    # Following the log streams until the job ends, then the response ends too.
    follow = running.curl("GET", f"/v1/jobs/{job_id}/logs?follow=1", alice, None, "-N")
    assert follow.status == 200
    assert follow.text.splitlines() == ["step 0", "step 1", "step 2"]
    job = running.wait_state(alice, job_id, "succeeded")
    assert job["exit_code"] == 0 and job["placement"]["node_id"] in {"node-a", "node-b"}
    assert [(e["from"], e["to"]) for e in job["events"]] == [
        (None, "pending"),
        ("pending", "assigned"),
        ("assigned", "running"),
        ("running", "succeeded"),
    ]
    logs = running.curl("GET", f"/v1/jobs/{job_id}/logs", alice)
    assert logs.text == "step 0\nstep 1\nstep 2\n"


def test_failing_job_ends_failed_with_its_exit_code(running: Cluster) -> None:
    alice = running.token("alice")
    job_id = running.submit(alice, script="echo broken >&2; exit 42", gpus=1)
    job = running.wait_state(alice, job_id, "failed", "succeeded")
    assert (job["state"], job["exit_code"], job["reason"]) == ("failed", 42, "exited with code 42")
    assert running.curl("GET", f"/v1/jobs/{job_id}/logs", alice).text == "broken\n"


def test_jobs_get_the_gpus_they_were_given(running: Cluster, tmp_path: Path) -> None:
    alice = running.token("alice")
    out = tmp_path / "env.txt"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])"
    job_id = running.submit(alice, command=[PY, "-c", code], gpus=2)
    job = running.wait_state(alice, job_id, "succeeded")
    assert out.read_text().split(",") == job["placement"]["gpu_uuids"]
    assert len(job["placement"]["gpu_uuids"]) == 2


def test_two_agents_share_the_work(running: Cluster) -> None:
    alice = running.token("alice")
    ids = [running.submit(alice, script="sleep 1.5", gpus=2) for _ in range(2)]
    jobs = [running.wait_state(alice, j, "running", "succeeded") for j in ids]
    assert {j["placement"]["node_id"] for j in jobs} == {"node-a", "node-b"}


def test_cancel_of_a_running_job_leaves_no_process_behind(running: Cluster, tmp_path: Path) -> None:
    alice = running.token("alice")
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(300)\n"
    )
    job_id = running.submit(alice, command=[PY, "-c", code], gpus=1)
    running.wait_state(alice, job_id, "running")
    wait_until(lambda: pids.exists() and pids.read_text(), what="job wrote its pids")
    job_pid, child_pid = map(int, pids.read_text().split())
    cancel = running.curl("POST", f"/v1/jobs/{job_id}/cancel", alice)
    assert cancel.status in (200, 202) and cancel.body["state"] in ("cancelling", "cancelled")
    job = running.wait_state(alice, job_id, "cancelled")
    assert job["exit_signal"] == 15
    for pid in (job_pid, child_pid):
        wait_until(lambda p=pid: not alive(p), timeout=5, what=f"pid {pid} gone")


def test_a_job_too_large_for_the_cluster_waits_with_the_reason(running: Cluster) -> None:
    """Larger than any node it would run as a gang (test_gangs.py); larger than every
    node together, it waits for more to join."""
    alice = running.token("alice")
    job_id = running.submit(alice, script="true", gpus=5)

    def reason() -> dict[str, str] | None:
        job = running.job(alice, job_id)
        return job["pending_reason"] if job["pending_reason"]["code"] != "not_considered" else None

    why = wait_until(reason, what="a pending reason")
    assert why == {
        "code": "too_large",
        "reason": "asks for 5 GPUs; the cluster has 4",
    }
    # It does not hold up jobs that fit.
    small = running.submit(alice, script="true", gpus=1)
    running.wait_state(alice, small, "succeeded")
    assert running.job(alice, job_id)["state"] == "pending"


def test_users_see_only_their_own_jobs_and_admins_see_all(running: Cluster) -> None:
    alice, bob = running.token("alice"), running.token("bob")
    admin = running.token("root", admin=True)
    job_id = running.submit(alice, script="true", gpus=0)
    assert running.curl("GET", f"/v1/jobs/{job_id}", bob).status == 404
    assert running.curl("POST", f"/v1/jobs/{job_id}/cancel", bob).status == 404
    assert [j["id"] for j in running.curl("GET", "/v1/jobs", bob).body["jobs"]] == []
    assert job_id in [j["id"] for j in running.curl("GET", "/v1/jobs", admin).body["jobs"]]
    assert running.curl("GET", f"/v1/jobs/{job_id}", admin).status == 200
