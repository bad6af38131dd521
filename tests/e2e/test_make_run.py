"""`make run`'s script brings up the system on embedded PostgreSQL, and its curl line works."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cluster import free_port, wait_until

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).parents[2] / "scripts" / "run_local.py"


def test_the_printed_curl_line_submits_a_job_that_succeeds(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_DSN"}  # the embedded path
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--dir", str(tmp_path / "run"), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        # Ctrl-C at a terminal: a SIGINT the suite inherited as ignored (a background
        # job's, under a non-interactive shell) would be ignored by the script too.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("curl "):
                break
        export = next(x for x in lines if x.startswith("export GPUSCHED_TOKEN="))
        curl = lines[-1]
        assert curl.startswith("curl "), "\n".join(lines)
        out = subprocess.run(
            ["bash", "-c", f"{export}\n{curl}"], capture_output=True, text=True, check=True
        )
        job = json.loads(out.stdout)
        assert job["state"] == "pending"
        token = export.split("=", 1)[1]

        def finished() -> dict[str, object] | None:
            got = subprocess.run(
                [
                    "curl",
                    "-s",
                    "-H",
                    f"Authorization: Bearer {token}",
                    f"http://127.0.0.1:{port}/v1/jobs/{job['id']}",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            body = json.loads(got.stdout)
            return body if body["state"] in ("succeeded", "failed") else None

        done = wait_until(finished, timeout=60, what="the demo job to finish")
        assert done["state"] == "succeeded"
        logs = subprocess.run(
            [
                "curl",
                "-s",
                "-H",
                f"Authorization: Bearer {token}",
                f"http://127.0.0.1:{port}/v1/jobs/{job['id']}/logs",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert logs.stdout == "42\n"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    # Ctrl-C stopped the daemons and the embedded PostgreSQL they started.
    assert not (tmp_path / "run" / "schedd" / "postgres" / "postmaster.pid").exists()
