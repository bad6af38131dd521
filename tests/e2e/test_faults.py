"""Faults with real processes: kill -9 of each daemon while jobs run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e
PY = sys.executable


def test_agentd_killed_mid_job_the_job_finishes_and_its_exit_is_recorded(
    running: Cluster, tmp_path: Path
) -> None:
    alice = running.token("alice")
    gate = tmp_path / "gate"
    # The job waits for a file, so that it surely runs across the agent's death.
    code = (
        "import os, time\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print('done', flush=True)\nraise SystemExit(4)\n"
    )
    job_id = running.submit(alice, command=[PY, "-c", code], gpus=2)
    node = running.wait_state(alice, job_id, "running")["placement"]["node_id"]
    running.kill9(running.agents[node])
    running.wait_node(node, connected=False)
    gate.touch()  # the job ends while its agent is dead
    wait_until(lambda: list(tmp_path.glob(f"{node}/jobs/{job_id}.1/exit.json")), what="exit file")
    assert running.job(alice, job_id)["state"] == "running"
    running.start_agent(node)
    job = running.wait_state(alice, job_id, "failed", "succeeded")
    assert (job["state"], job["exit_code"], job["attempt"]) == ("failed", 4, 1)
    assert running.curl("GET", f"/v1/jobs/{job_id}/logs", alice).text == "done\n"


def test_agentd_restarted_while_the_job_still_runs(running: Cluster, tmp_path: Path) -> None:
    alice = running.token("alice")
    gate = tmp_path / "gate"
    code = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    job_id = running.submit(alice, command=[PY, "-c", code], gpus=2)
    node = running.wait_state(alice, job_id, "running")["placement"]["node_id"]
    running.kill9(running.agents[node])
    running.start_agent(node)  # finds the job still running and reports it
    assert running.job(alice, job_id)["state"] == "running"
    gate.touch()
    job = running.wait_state(alice, job_id, "succeeded", "failed")
    assert (job["state"], job["exit_code"], job["attempt"]) == ("succeeded", 0, 1)


def test_schedd_killed_with_jobs_pending_and_running_loses_and_repeats_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.start_schedd()
    cluster.start_agent("node-a", gpus=2)
    alice = cluster.token("alice")
    runs = tmp_path / "runs"
    gate = tmp_path / "gate"
    code = (
        "import os, time\n"
        f"open({str(runs)!r}, 'a').write(os.environ['GPUSCHED_JOB_ID'] + '\\n')\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    )
    ids = [cluster.submit(alice, command=[PY, "-c", code], gpus=1) for _ in range(5)]
    wait_until(lambda: runs.exists() and len(runs.read_text().split()) == 2, what="two running")
    assert cluster.schedd is not None
    cluster.kill9(cluster.schedd)
    gate.touch()  # the running pair ends while schedd is dead
    cluster.start_schedd()
    for job_id in ids:
        cluster.wait_state(alice, job_id, "succeeded", timeout=60)
    started = runs.read_text().split()
    assert sorted(started) == sorted(ids), "each job ran exactly once"
    for job_id in ids:
        job = cluster.job(alice, job_id)
        assert job["attempt"] == 1
        assert [e["to"] for e in job["events"]].count("assigned") == 1


def test_schedd_on_embedded_postgres_comes_back_after_kill9(tmp_path: Path) -> None:
    cluster = Cluster(root=tmp_path, dsn="")
    try:
        cluster.start_schedd()
        alice = cluster.token("alice")
        job_id = cluster.submit(alice, script="true", gpus=1)  # no agent: it stays pending
        assert cluster.schedd is not None
        cluster.kill9(cluster.schedd)
        pidfile = tmp_path / "schedd-data" / "postgres" / "postmaster.pid"
        assert pidfile.exists()  # the database outlives the crash...
        cluster.start_schedd()  # ...and the restart reuses it
        assert cluster.job(alice, job_id)["state"] == "pending"
        cluster.schedd.terminate()
        assert cluster.schedd.wait(30) == 0
        assert not pidfile.exists()  # a clean stop stops it, whoever started it
    finally:
        cluster.stop()
