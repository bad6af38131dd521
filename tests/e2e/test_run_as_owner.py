"""A node whose jobs run as their owners (`run_jobs_as = "owner"`), through the real
daemons and curl: agentd refuses places a job could not reach, a job runs as its user's
account, and a user without one on the node gets a failed job saying so."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="starting jobs as others needs root"),
]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="gs-own-"))  # pytest's tmp_path is closed to others
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_jobs_run_as_their_owners_accounts(cluster: Cluster, open_dir: Path) -> None:
    cluster.start_schedd()
    # The test's shim socket directory is closed to other users (as one under agentd's
    # state directory is, which systemd makes 0700): a job could not reach its socket
    # there, and agentd says so and stops, as for any bad configuration.
    refused = cluster.start_agent("node-a", wait=False, extra_config='run_jobs_as = "owner"\n')
    assert refused.wait(30) == 2
    said = [json.loads(line) for line in cluster.log("node-a").splitlines()]
    error = next(e["error"] for e in said if e.get("event") == "cannot start")
    assert error.startswith(
        'shim_socket_dir: jobs running as their owners (run_jobs_as = "owner") cannot reach'
    ), error
    opened = (
        'run_jobs_as = "owner"\n'
        f'shim_socket_dir = "{open_dir / "s"}"\n'
        f'checkpoint_root = "{open_dir / "checkpoints"}"\n'
        f'stage_cache_dir = "{open_dir / "stage"}"\n'
    )
    cluster.start_agent("node-a", extra_config=opened)

    nobody = cluster.token("nobody")
    job_id = cluster.submit(nobody, script='echo "$(id -un) $(id -u) $HOME"', gpus=1)
    done = cluster.wait_state(nobody, job_id, "succeeded", "failed")
    assert done["state"] == "succeeded", done
    logs = cluster.curl("GET", f"/v1/jobs/{job_id}/logs", nobody)
    assert logs.text == "nobody 65534 /nonexistent\n"

    alice = cluster.token("alice-7f3a")  # no account of that name on the node
    job_id = cluster.submit(alice, script="true", gpus=1)
    failed = cluster.wait_state(alice, job_id, "failed", "succeeded")
    assert failed["state"] == "failed"
    assert failed["reason"] == (
        "user 'alice-7f3a' has no account on this node (run_jobs_as = \"owner\")"
    ), failed
