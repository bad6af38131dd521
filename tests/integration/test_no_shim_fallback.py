"""A job without a shim, through the agent's runner and job controls: suspend stops its
process group with SIGSTOP, resume continues it, and a checkpoint is refused as such."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentd.job_controls import JobControls
from agentd.runner import Runner
from shared.protocol import JobControlled, JobStarted, Launch
from tests.integration.agent_parts import agent_parts
from tests.integration.test_runner import Outbox


def state_of(pid: int) -> str:
    """The process's state letter in /proc: R, S, T (stopped), Z..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def socket_offered(job_dir: Path) -> bool:
    env = json.loads((job_dir / "launch.json").read_text())["env"]
    return os.path.exists(env["GPUSCHED_SHIM_SOCKET"])


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[Runner, JobControls, Outbox]]:
    async with agent_parts(tmp_path) as parts:
        yield parts


async def test_suspend_and_resume_without_a_shim_use_sigstop_and_sigcont(
    agent: tuple[Runner, JobControls, Outbox],
) -> None:
    runner, controls, out = agent
    code = "import time\nwhile True: time.sleep(0.01)"
    await runner.start(Launch(job_id="j", attempt=1, user="u", argv=[sys.executable, "-c", code]))
    started = await out.wait_for(JobStarted)
    assert isinstance(started, JobStarted)
    assert socket_offered(runner.job_dir("j", 1))  # offered, never used by this job

    controls.suspend("j", 1, free_memory=False)
    for _ in range(100):
        if state_of(started.pid) == "T":
            break
        await asyncio.sleep(0.02)
    assert state_of(started.pid) == "T"
    controls.resume("j", 1)
    for _ in range(100):
        if state_of(started.pid) != "T":
            break
        await asyncio.sleep(0.02)
    assert state_of(started.pid) in ("R", "S")

    controls.checkpoint("j", 1)
    events = [(m.event, m.detail) for m in out.messages if isinstance(m, JobControlled)]
    assert events == [
        ("suspended", "suspended with SIGSTOP: no shim"),
        ("resumed", "resumed with SIGCONT"),
        ("checkpoint_failed", "not checkpointable: the job has no shim connected"),
    ]
