"""A preemption's kill on the agent, with real job processes, shims and runner: a job
whose shim can save exits with its checkpoint and gets no signal; one whose save fails,
and one without a shim, get SIGTERM without waiting out `checkpoint_s`."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentd.job_controls import JobControls
from agentd.kill import kill
from agentd.runner import Runner
from shared.protocol import JobControlled, JobExited, JobProgress, JobStarted, Kill, Launch
from shared.shim_protocol import EXIT_CHECKPOINTED
from tests.integration.agent_parts import agent_parts
from tests.integration.test_runner import Outbox

ROOT = Path(__file__).resolve().parents[2]
# Far longer than any test here may take: a kill that waited it out would time out.
CHECKPOINT_S = 600.0
# A training loop whose checkpoints cannot be saved: it never says how.
NO_SAVE = "import shim\nwhile True:\n    with shim.step():\n        sum(range(10_000))\n"

Agent = tuple[Runner, JobControls, Outbox, Path]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    work = tmp_path / "job"
    work.mkdir()
    shutil.copy(ROOT / "shared" / "shim.py", work / "shim.py")
    shutil.copy(ROOT / "tests" / "integration" / "shim_job.py", work / "shim_job.py")
    (work / "no_save.py").write_text(NO_SAVE)
    async with agent_parts(tmp_path / "state", interval_s=0.05) as (runner, controls, out):
        progress = asyncio.create_task(controls.run())
        try:
            yield runner, controls, out, work
        finally:
            progress.cancel()


async def stepping(agent: Agent, *argv: str) -> None:
    """Job `j` runs `argv` (python -S, in the job's directory) and its shim has stepped."""
    runner, _, out, work = agent
    command = [sys.executable, "-S", *argv]
    await runner.start(Launch(job_id="j", attempt=1, user="u", argv=command, cwd=str(work)))
    await out.wait_for(JobProgress, within_s=30.0)


async def stopped(agent: Agent, command: Kill) -> JobExited:
    runner, controls, out, _ = agent
    async with asyncio.timeout(60):
        await kill(runner, controls, command)
        ended = await out.wait_for(JobExited)
    assert isinstance(ended, JobExited)
    return ended


def controlled(out: Outbox) -> list[str]:
    return [m.event for m in out.messages if isinstance(m, JobControlled)]


async def test_a_job_that_can_save_exits_with_its_checkpoint_and_no_signal(agent: Agent) -> None:
    await stepping(agent, "shim_job.py", "0", "20000")
    ended = await stopped(agent, Kill(job_id="j", attempt=1, checkpoint_s=CHECKPOINT_S))
    assert (ended.exit_code, ended.signal) == (EXIT_CHECKPOINTED, None)
    assert ended.checkpoint is not None
    assert (Path(ended.checkpoint) / "state.json").is_file()
    assert "checkpointed" in controlled(agent[2])


async def test_a_job_whose_save_fails_is_terminated(agent: Agent) -> None:
    await stepping(agent, "no_save.py")
    ended = await stopped(agent, Kill(job_id="j", attempt=1, checkpoint_s=CHECKPOINT_S))
    assert ended.signal == signal.SIGTERM and ended.checkpoint is None
    assert "checkpoint_failed" in controlled(agent[2])


async def test_without_checkpoint_s_a_job_that_could_save_is_terminated(agent: Agent) -> None:
    await stepping(agent, "shim_job.py", "0", "20000")
    ended = await stopped(agent, Kill(job_id="j", attempt=1))
    assert ended.signal == signal.SIGTERM and ended.checkpoint is None
    assert controlled(agent[2]) == []


async def test_a_job_without_a_shim_is_terminated(agent: Agent) -> None:
    runner, _, out, _ = agent
    code = "import time\nwhile True: time.sleep(0.01)"
    await runner.start(Launch(job_id="j", attempt=1, user="u", argv=[sys.executable, "-c", code]))
    await out.wait_for(JobStarted)
    ended = await stopped(agent, Kill(job_id="j", attempt=1, checkpoint_s=CHECKPOINT_S))
    assert ended.signal == signal.SIGTERM and ended.checkpoint is None
    assert controlled(out) == []  # nothing asked of a shim that is not there


async def test_a_kill_sent_again_while_the_job_saves_leaves_it_to_save(agent: Agent) -> None:
    runner, controls, _, _ = agent
    # Two seconds between steps: the save waits for the next mini-batch's end.
    await stepping(agent, "shim_job.py", "0", "20000", "2")
    first = asyncio.create_task(
        kill(runner, controls, Kill(job_id="j", attempt=1, checkpoint_s=CHECKPOINT_S))
    )
    async with asyncio.timeout(10):
        while not controls.saving("j", 1):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await kill(runner, controls, Kill(job_id="j", attempt=1))  # as after a reconnect
    ended = await stopped(agent, Kill(job_id="j", attempt=1))  # and once more, later
    await first
    assert (ended.exit_code, ended.signal) == (EXIT_CHECKPOINTED, None)
    assert ended.checkpoint is not None
    assert not controls.saving("j", 1)


@pytest.mark.parametrize("keep", [2, 1])
async def test_a_job_preempted_again_and_again_keeps_its_newest_checkpoints(
    agent: Agent, keep: int
) -> None:
    """Each preemption saves a checkpoint, and each attempt resumes from the last one:
    the job's checkpoint directory keeps the newest `checkpoint_keep` of them."""
    runner, controls, out, work = agent
    runner.checkpoint_keep = keep
    command = [sys.executable, "-S", "shim_job.py", "0", "20000"]
    saved: list[Path] = []
    for attempt in (1, 2, 3):
        out.messages.clear()
        resume = str(saved[-1]) if saved else None
        await runner.start(
            Launch(
                job_id="j",
                attempt=attempt,
                user="u",
                argv=command,
                cwd=str(work),
                resume_from=resume,
            )
        )
        async with asyncio.timeout(30):  # its shim steps (the last attempt's may report late)
            while not any(
                isinstance(m, JobProgress) and m.attempt == attempt for m in out.messages
            ):
                out.arrived.clear()
                await out.arrived.wait()
        async with asyncio.timeout(60):
            await kill(
                runner, controls, Kill(job_id="j", attempt=attempt, checkpoint_s=CHECKPOINT_S)
            )
            ended = await out.wait_for(JobExited)
        assert isinstance(ended, JobExited) and ended.checkpoint is not None, ended
        saved.append(Path(ended.checkpoint))
    steps = sorted(p.name for p in saved[0].parent.iterdir() if p.name.startswith("step-"))
    assert steps == [p.name for p in saved[-keep:]]
    assert all(a.name < b.name for a, b in itertools.pairwise(saved))  # resumed
