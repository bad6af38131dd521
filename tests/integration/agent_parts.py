"""An agent's runner, shim server and job controls wired as agentd wires them, without a
link to schedd: what they would send goes to an `Outbox`."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from agentd.job_controls import JobControls
from agentd.runner import Runner
from agentd.shim_server import ShimServer
from tests.integration.test_runner import Outbox


@asynccontextmanager
async def agent_parts(
    state_dir: Path, interval_s: float = 1.0
) -> AsyncIterator[tuple[Runner, JobControls, Outbox]]:
    """Jobs still running at the end are killed."""
    sockets = Path(tempfile.mkdtemp(prefix="ag-"))  # a socket's path must be short
    out = Outbox()
    shims = ShimServer(sockets)
    runner = Runner(state_dir, out.post, shims=shims)
    controls = JobControls(shims, out.post, runner.pgid_of, interval_s=interval_s)
    shims.on_event = controls.on_shim_event
    try:
        yield runner, controls, out
    finally:
        for job in runner.jobs.values():
            if job.ended is None:
                await runner.kill(job.job_id, job.attempt, grace_s=1.0)
        runner.close()
        await shims.close()
        shutil.rmtree(sockets, ignore_errors=True)
