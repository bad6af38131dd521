"""The shim in a real training-loop process, driven through the real shim server.

The job runs as `python -S` with a copy of shared/shim.py beside it, as in a job image.
Rates are compared with rates measured in the same test, never with a clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentd.shim_server import ShimServer
from shared import shim
from shared.shim_protocol import (
    EXIT_CHECKPOINTED,
    CapApplied,
    Checkpointed,
    CheckpointFailed,
    FromShim,
    Hello,
    Resumed,
    Step,
    Suspended,
)

ROOT = Path(__file__).resolve().parents[2]
WORK = 100_000  # loop turns per step: a few milliseconds of pure Python


class Events:
    """What the shims said, as the agent receives it, with the time it arrived."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str, FromShim]] = []
        self._arrived = asyncio.Event()

    def __call__(self, key: str, msg: FromShim) -> None:
        self.seen.append((time.monotonic(), key, msg))
        self._arrived.set()

    def mark(self) -> int:
        return len(self.seen)

    async def wait_for(
        self,
        key: str,
        kind: type[Any],
        where: Callable[[Any], bool] = lambda m: True,
        after: int = 0,
        within_s: float = 10.0,
    ) -> Any:
        async with asyncio.timeout(within_s):
            while True:
                for _, k, msg in self.seen[after:]:
                    if k == key and isinstance(msg, kind) and where(msg):
                        return msg
                self._arrived.clear()
                await self._arrived.wait()

    def steps(self, key: str, after: int = 0) -> list[tuple[float, int]]:
        return [(t, m.step) for t, k, m in self.seen[after:] if k == key and isinstance(m, Step)]


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
async def server(events: Events) -> AsyncIterator[ShimServer]:
    # Short: a socket's path may have at most 107 bytes, and tmp_path can be long.
    socket_dir = Path(tempfile.mkdtemp(prefix="shim-"))
    srv = ShimServer(socket_dir / "sockets", on_event=events)
    yield srv
    await srv.close()
    shutil.rmtree(socket_dir)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A job image: the job script and the one-file shim, nothing else."""
    directory = tmp_path / "image"
    directory.mkdir()
    shutil.copy(ROOT / "shared" / "shim.py", directory)
    shutil.copy(Path(__file__).with_name("shim_job.py"), directory)
    return directory


class Jobs:
    def __init__(self, image: Path) -> None:
        self.image = image
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, steps: int, **env: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            # -S: no site-packages, so the shim must live on the standard library alone.
            *(sys.executable, "-E", "-s", "-S", str(self.image / "shim_job.py")),
            *(str(steps), str(WORK)),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self.procs.append(proc)
        return proc

    async def kill_all(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
            await proc.communicate()


@pytest.fixture
async def jobs(image: Path) -> AsyncIterator[Jobs]:
    j = Jobs(image)
    yield j
    await j.kill_all()


async def finish(proc: asyncio.subprocess.Process, within_s: float = 20.0) -> tuple[list[Any], str]:
    """Wait for the job's end: its stdout lines, parsed, and its stderr."""
    out, err = await asyncio.wait_for(proc.communicate(), within_s)
    assert proc.returncode is not None
    return [json.loads(line) for line in out.decode().splitlines()], err.decode()


def env_for(path: Path, kind: str = shim.GUARANTEED, **more: str) -> dict[str, str]:
    return {shim.ENV_SOCKET: str(path), shim.ENV_JOB_KIND: kind, **more}


async def step_rate(events: Events, key: str, seconds: float) -> float:
    """Steps per second over the next `seconds`, from the steps' numbers and arrival."""
    await events.wait_for(key, Step, after=events.mark())  # a step under the new setting
    await events.wait_for(key, Step, after=events.mark())
    start = events.mark()
    await asyncio.sleep(seconds)
    seen = events.steps(key, after=start)
    assert len(seen) >= 3, seen
    (t0, s0), (t1, s1) = seen[0], seen[-1]
    return (s1 - s0) / (t1 - t0)


# ---- the mechanisms ---------------------------------------------------------------


async def test_share_25_quarters_the_step_rate_and_100_restores_it(
    server: ShimServer, events: Events, jobs: Jobs
) -> None:
    """The band is wide, and a noisy measurement is taken again, because the CPU is shared:
    a throttled step often runs slower than a busy one (a cold core), and under contention
    faster (the scheduler favours a process that sleeps). A throttle that is off, or
    sleeps far too long, misses the band every time."""
    path = await server.open_job("j-1.1")
    await jobs.start(0, **env_for(path))
    await events.wait_for("j-1.1", Hello)
    for _ in range(3):
        full = await step_rate(events, "j-1.1", 0.8)
        server.set_limits("j-1.1", share=25)
        quarter = await step_rate(events, "j-1.1", 0.8)
        server.set_limits("j-1.1", share=100)
        back = await step_rate(events, "j-1.1", 0.8)
        if 0.15 < quarter / full < 0.40 and back / full > 0.6:
            break
    assert 0.15 < quarter / full < 0.40, (full, quarter)
    assert back / full > 0.6, (full, back)


async def test_suspend_stops_progress_and_resume_continues_it(
    server: ShimServer, events: Events, jobs: Jobs
) -> None:
    path = await server.open_job("j-1.1")
    proc = await jobs.start(0, **env_for(path))
    await events.wait_for("j-1.1", Step, where=lambda m: m.step >= 3)
    server.suspend("j-1.1")
    suspended = await events.wait_for("j-1.1", Suspended)
    mark = events.mark()
    await asyncio.sleep(0.5)
    assert events.steps("j-1.1", after=mark) == []
    report = server.report("j-1.1")
    assert report is not None and report.step == suspended.step
    assert proc.returncode is None
    server.resume("j-1.1")
    resumed = await events.wait_for("j-1.1", Resumed, after=mark)
    assert resumed.step == suspended.step
    await events.wait_for("j-1.1", Step, where=lambda m: m.step >= suspended.step + 3, after=mark)


async def test_checkpoint_exits_with_its_status_and_a_new_process_resumes(
    server: ShimServer, events: Events, jobs: Jobs, tmp_path: Path
) -> None:
    checkpoints = str(tmp_path / "checkpoints")
    path = await server.open_job("j-1.1")
    proc = await jobs.start(0, **env_for(path, GPUSCHED_CHECKPOINT_DIR=checkpoints))
    await events.wait_for("j-1.1", Step, where=lambda m: m.step >= 5)
    server.checkpoint("j-1.1")
    lines, _ = await finish(proc)
    assert proc.returncode == EXIT_CHECKPOINTED
    assert lines == [{"started_at": 0}]  # no finish line: it stopped at the boundary
    saved = await events.wait_for("j-1.1", Checkpointed)
    assert saved.step >= 5
    assert json.loads((Path(saved.path) / "state.json").read_text())["step"] == saved.step
    assert shim.read_checkpoint(checkpoints) == shim.ResumeState(saved.path, saved.step)

    path2 = await server.open_job("j-1.2")
    env = env_for(path2, GPUSCHED_CHECKPOINT_DIR=checkpoints, GPUSCHED_RESUME_FROM=saved.path)
    proc2 = await jobs.start(saved.step + 5, **env)
    lines, _ = await finish(proc2)
    assert proc2.returncode == 0
    assert lines == [{"started_at": saved.step}, {"finished_at": saved.step + 5}]
    assert (await events.wait_for("j-1.2", Hello)).step == saved.step
    last = await events.wait_for("j-1.2", Step, where=lambda m: m.step == saved.step + 5)
    assert last.step == saved.step + 5


async def test_a_failed_checkpoint_is_reported_and_the_job_runs_on(
    server: ShimServer, events: Events, jobs: Jobs
) -> None:
    path = await server.open_job("j-1.1")
    proc = await jobs.start(40, **env_for(path))  # no checkpoint directory given
    await events.wait_for("j-1.1", Hello)
    server.checkpoint("j-1.1")
    failed = await events.wait_for("j-1.1", CheckpointFailed)
    assert shim.ENV_CHECKPOINT_DIR in failed.reason
    lines, _ = await finish(proc)
    assert proc.returncode == 0
    assert lines[-1] == {"finished_at": 40}


async def test_controls_set_before_the_shim_connects_arrive_latest_only(
    server: ShimServer, events: Events, jobs: Jobs
) -> None:
    path = await server.open_job("j-1.1")
    server.set_limits("j-1.1", memory_cap_mib=500, share=10)
    server.set_limits("j-1.1", memory_cap_mib=300)
    server.set_limits("j-1.1", share=100)
    server.resume("j-1.1")
    server.suspend("j-1.1")
    proc = await jobs.start(20, **env_for(path))
    suspended = await events.wait_for("j-1.1", Suspended)
    caps = [m for _, _, m in events.seen if isinstance(m, CapApplied)]
    assert [c.memory_cap_mib for c in caps] == [300]
    assert caps[0].met is None  # no GPU here: nothing to cap
    assert suspended.step == 0  # what was set before the job was up holds from its start
    server.resume("j-1.1")
    lines, _ = await finish(proc)
    assert (proc.returncode, lines[-1]) == (0, {"finished_at": 20})


# ---- without the agent -------------------------------------------------------------


@pytest.mark.parametrize("socket_path", [None, "no/such/socket"], ids=["unset", "missing"])
async def test_a_job_without_an_agent_runs_to_its_end(
    jobs: Jobs, tmp_path: Path, socket_path: str | None
) -> None:
    env = {} if socket_path is None else {shim.ENV_SOCKET: str(tmp_path / socket_path)}
    proc = await jobs.start(30, **env)
    lines, err = await finish(proc)
    assert (proc.returncode, lines[-1], err) == (0, {"finished_at": 30}, "")


@pytest.mark.parametrize("kind", [shim.GUARANTEED, shim.OPPORTUNISTIC])
async def test_when_the_socket_vanishes_guaranteed_runs_free_opportunistic_stays(
    server: ShimServer, events: Events, jobs: Jobs, kind: str
) -> None:
    path = await server.open_job("j-1.1")
    server.suspend("j-1.1")
    proc = await jobs.start(30, **env_for(path, kind))
    await events.wait_for("j-1.1", Suspended)
    await server.close_job("j-1.1")
    assert not path.exists()
    if kind == shim.GUARANTEED:
        lines, err = await finish(proc)
        assert (proc.returncode, lines[-1]) == (0, {"finished_at": 30})
        assert "unthrottled" in err
    else:
        await asyncio.sleep(0.5)
        assert proc.returncode is None  # still suspended: its last setting
        proc.send_signal(signal.SIGTERM)
        await finish(proc)


async def test_the_shim_reconnects_and_tells_a_new_agent_where_it_is(
    server: ShimServer, events: Events, jobs: Jobs
) -> None:
    path = await server.open_job("j-1.1")
    server.set_limits("j-1.1", share=50)
    server.suspend("j-1.1")
    proc = await jobs.start(20, **env_for(path, shim.OPPORTUNISTIC))
    suspended = await events.wait_for("j-1.1", Suspended)
    await server.close_job("j-1.1")  # the agent restarts: its state is gone
    await asyncio.sleep(0.2)
    mark = events.mark()
    await server.open_job("j-1.1")
    hello = await events.wait_for("j-1.1", Hello, after=mark)
    assert (hello.step, hello.share, hello.suspended) == (suspended.step, 50, True)
    server.set_limits("j-1.1", share=100)
    server.resume("j-1.1")
    lines, _ = await finish(proc)
    assert (proc.returncode, lines[-1]) == (0, {"finished_at": 20})
