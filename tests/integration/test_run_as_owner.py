"""Jobs run as their owners (`run_jobs_as = "owner"`), with real processes, a shim and
the runner as agentd wires them: the account's ids and groups, its environment, its
shim socket and checkpoints; users without an account, and root, are refused.

agentd must be root to start jobs as other users: so must these tests."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentd.job_controls import JobControls
from agentd.kill import kill
from agentd.link import inputs_staged, prefetch_for
from agentd.runner import Runner
from agentd.shim_server import ShimServer
from agentd.stager import Stager
from shared.protocol import (
    InputsStaged,
    JobExited,
    JobFailed,
    JobProgress,
    Kill,
    Launch,
    Prefetch,
)
from shared.shim_protocol import EXIT_CHECKPOINTED
from tests.integration.test_runner import Outbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="starting jobs as others needs root")

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
# A Python the job's user may run (the test's own may live under a home closed to it).
PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(p).exists()), "")

Parts = tuple[Runner, JobControls, Outbox, Path]


class Agent:
    """A runner with shims that starts jobs as their owners, its places open to them;
    `stop` and `start` again are an agent restart (its jobs run on)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def start(self) -> Parts:
        self.out = Outbox()
        self.shims = ShimServer(self.base / "s")
        # Its progress reaches the outbox as agentd sends it to schedd.
        self.stager = Stager(
            self.base / "stage", 2**20, on_progress=lambda r: self.out.post(inputs_staged(r))
        )
        self.runner = Runner(
            self.base / "state",
            self.out.post,
            shims=self.shims,
            checkpoint_root=self.base / "ckpt",
            run_as_owner=True,
            stager=self.stager,
        )
        self.controls = JobControls(self.shims, self.out.post, self.runner.pgid_of, 0.05)
        self.shims.on_event = self.controls.on_shim_event
        self.progress = asyncio.create_task(self.controls.run())
        return self.runner, self.controls, self.out, self.base / "job"

    async def stop(self) -> None:
        self.progress.cancel()
        self.runner.close()
        await self.shims.close()
        await self.stager.close()


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    base = Path(tempfile.mkdtemp(prefix="owner-"))  # pytest's tmp_path is closed to others
    os.chmod(base, 0o755)
    work = base / "job"
    work.mkdir()
    shutil.copy(ROOT / "shared" / "shim.py", work / "shim.py")
    shutil.copy(ROOT / "tests" / "integration" / "shim_job.py", work / "shim_job.py")
    node = Agent(base)
    try:
        yield node
    finally:
        for job in node.runner.jobs.values():
            if job.ended is None:
                await node.runner.kill(job.job_id, job.attempt, grace_s=1.0)
        await node.stop()
        shutil.rmtree(base)


@pytest.fixture
async def parts(agent: Agent) -> Parts:
    return agent.start()


def job(job_id: str, user: str, argv: list[str], cwd: Path | None = None) -> Launch:
    return Launch(job_id=job_id, attempt=1, user=user, argv=argv, cwd=str(cwd) if cwd else None)


async def test_a_job_runs_as_its_owner_with_the_accounts_environment(parts: Parts) -> None:
    runner, _, out, _ = parts
    script = 'echo "$(id -u) $(id -g) $(id -G) $USER $LOGNAME $HOME"'
    await runner.start(job("j1", "nobody", ["/bin/sh", "-c", script]))
    exited = await out.wait_for(JobExited)
    assert isinstance(exited, JobExited) and exited.exit_code == 0
    log = (runner.job_dir("j1", 1) / "output.log").read_text().split()
    assert log[:2] == [str(NOBODY), str(NOBODY)]
    assert "0" not in log[2:-3]  # no group of the agent's (root) kept
    assert log[-3:] == ["nobody", "nobody", "/nonexistent"]


@pytest.mark.parametrize(
    "user, reason",
    [
        ("no-such-user-7f3a", "user 'no-such-user-7f3a' has no account on this node"),
        ("root", "jobs do not run as root"),
    ],
)
async def test_a_job_of_a_user_it_cannot_run_as_fails_with_why(
    parts: Parts, user: str, reason: str
) -> None:
    runner, _, out, _ = parts
    await runner.start(job("j1", user, ["/bin/true"]))
    failed = await out.wait_for(JobFailed)
    assert isinstance(failed, JobFailed) and failed.reason.startswith(reason), failed
    assert not runner.job_dir("j1", 1).exists()  # nothing started


def closed_script(work: Path) -> str:
    """A script in a directory only root may enter (as a venv under /root)."""
    closed = work / "closed"
    closed.mkdir(mode=0o700)
    script = closed / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    return str(script)


async def test_a_command_the_owner_may_not_run_fails_the_start_saying_as_whom(
    parts: Parts,
) -> None:
    runner, _, out, work = parts
    script = closed_script(work)
    await runner.start(job("j1", "nobody", [script]))
    failed = await out.wait_for(JobFailed)
    assert isinstance(failed, JobFailed)
    assert failed.reason == f"cannot start {script!r}: Permission denied (as user 'nobody')"


@pytest.mark.skipif(not PYTHON, reason="no Python outside a home directory for the job")
async def test_the_owners_shim_reports_and_saves_its_checkpoint_as_the_owner(
    parts: Parts,
) -> None:
    runner, controls, out, work = parts
    argv = [PYTHON, "-S", "shim_job.py", "0", "20000"]
    await runner.start(job("j1", "nobody", argv, cwd=work))
    await out.wait_for(JobProgress, within_s=30.0)  # its shim reached the socket
    async with asyncio.timeout(60):
        await kill(runner, controls, Kill(job_id="j1", attempt=1, checkpoint_s=600.0))
        ended = await out.wait_for(JobExited)
    assert isinstance(ended, JobExited)
    assert (ended.exit_code, ended.signal) == (EXIT_CHECKPOINTED, None), (
        runner.job_dir("j1", 1) / "output.log"
    ).read_text()
    assert ended.checkpoint is not None
    saved = Path(ended.checkpoint)
    # The checkpoint, what the job wrote in it, and the job's checkpoint directory.
    assert owners(saved, saved / "state.json", saved.parent) == {NOBODY}


def owners(*paths: Path) -> set[int]:
    return {p.stat().st_uid for p in paths}


@pytest.mark.skipif(not PYTHON, reason="no Python outside a home directory for the job")
async def test_after_an_agent_restart_the_owners_shim_finds_its_socket_again(
    agent: Agent,
) -> None:
    runner, _, out, work = agent.start()
    await runner.start(job("j1", "nobody", [PYTHON, "-S", "shim_job.py", "0", "20000"], work))
    await out.wait_for(JobProgress, within_s=30.0)
    await agent.stop()  # the job runs on; its socket is gone

    runner, _, out, _ = agent.start()
    runner.recover()
    await runner.reopen_shims()  # as agentd does at start: the account's socket again
    progress = await out.wait_for(JobProgress, within_s=30.0)  # its shim reconnected
    assert isinstance(progress, JobProgress) and progress.job_id == "j1"


async def test_an_input_its_owner_could_not_read_is_not_copied_for_the_job(
    parts: Parts,
) -> None:
    """agentd copies inputs as root: a file anyone may read, but in a directory only
    root may enter, is refused to the job; one its owner can reach is copied and read."""
    runner, _, out, work = parts
    (work / "open.txt").write_text("open data\n")
    closed = work / "closed"
    closed.mkdir(mode=0o700)
    (closed / "weights.txt").write_text("not for nobody\n")
    show = 'for p in $(echo "$GPUSCHED_INPUTS" | tr : " "); do cat "$p"; done'

    await runner.start(
        Launch(
            job_id="j1", attempt=1, user="nobody", argv=["/bin/sh", "-c", show],
            inputs=[str(work / "open.txt")],
        )
    )  # fmt: skip
    exited = await out.wait_for(JobExited)
    assert isinstance(exited, JobExited) and exited.exit_code == 0
    assert (runner.job_dir("j1", 1) / "output.log").read_text() == "open data\n"

    secret = str(closed / "weights.txt")
    await runner.start(
        Launch(
            job_id="j2", attempt=1, user="nobody", argv=["/bin/sh", "-c", show],
            inputs=[str(work / "open.txt"), secret],
        )
    )  # fmt: skip
    failed = await out.wait_for(JobFailed)
    assert isinstance(failed, JobFailed)
    assert failed.reason == (
        f"staging inputs failed: {secret}: user 'nobody' may not read {str(closed)!r}"
    )
    assert not runner.job_dir("j2", 1).exists()


async def test_a_prefetch_copies_nothing_its_owner_could_not_read(agent: Agent) -> None:
    """The cache is open to every user of the node: a prefetch (ahead of any launch)
    checks the job's owner as a launch does, else a job's inputs would lie there for
    anyone to read."""
    _, _, out, work = agent.start()
    closed = work / "closed"
    closed.mkdir(mode=0o700)
    (closed / "weights.txt").write_text("not for nobody\n")
    (work / "open.txt").write_text("open data\n")
    secret = str(closed / "weights.txt")

    await prefetch_for(agent.runner, Prefetch(job_id="j1", inputs=[secret], user="nobody"))
    refused = await out.wait_for(InputsStaged)
    assert isinstance(refused, InputsStaged)
    assert (refused.input, refused.done) == (secret, True)
    assert refused.error == f"user 'nobody' may not read {str(closed)!r}"
    assert agent.stager.cache.entries == {}  # nothing copied

    out.messages.clear()
    await prefetch_for(agent.runner, Prefetch(job_id="j2", inputs=[secret], user="no-such-7f3a"))
    unknown = await out.wait_for(InputsStaged)
    assert isinstance(unknown, InputsStaged) and unknown.error is not None
    assert unknown.error.startswith("user 'no-such-7f3a' has no account on this node")

    open_input = str(work / "open.txt")
    await prefetch_for(agent.runner, Prefetch(job_id="j3", inputs=[open_input], user="nobody"))
    assert len(agent.stager.cache.entries) == 1  # what nobody may read is copied
