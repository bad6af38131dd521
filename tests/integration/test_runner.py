"""The runner and launcher with real processes: start, exit codes, kill, restart recovery."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentd.runner import Runner
from agentd.shim_server import ShimServer
from shared.protocol import Gang, JobExited, JobFailed, JobStarted, Launch, Msg
from tests.processes import alive


class Outbox:
    def __init__(self) -> None:
        self.messages: list[Msg] = []
        self.arrived = asyncio.Event()

    def post(self, msg: Msg) -> None:
        self.messages.append(msg)
        self.arrived.set()

    async def wait_for(self, kind: type, within_s: float = 10.0) -> Msg:
        async with asyncio.timeout(within_s):
            while True:
                for msg in self.messages:
                    if isinstance(msg, kind):
                        return msg
                self.arrived.clear()
                await self.arrived.wait()


def launch(job_id: str, code: str, attempt: int = 1, **kw: object) -> Launch:
    return Launch(
        job_id=job_id, attempt=attempt, user="alice", argv=[sys.executable, "-c", code], **kw
    )  # type: ignore[arg-type]


async def test_exit_code_and_output_are_recorded(tmp_path: Path) -> None:
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    code = "import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); raise SystemExit(3)"
    await runner.start(launch("j1", code, gpu_uuids=["GPU-a", "GPU-b"]))
    exited = await out.wait_for(JobExited)
    assert [type(m) for m in out.messages] == [JobStarted, JobExited]
    assert (exited.exit_code, exited.signal) == (3, None)
    log = (runner.job_dir("j1", 1) / "output.log").read_text()
    assert log == "gpus GPU-a,GPU-b\n"


async def test_a_gangs_part_is_told_its_rank_and_where_the_head_listens(tmp_path: Path) -> None:
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    names = ["GPUSCHED_GANG_RANK", "GPUSCHED_GANG_SIZE", "GPUSCHED_GANG_HEAD",
             "GPUSCHED_GANG_PORT", "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT",
             "PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR", "PET_MASTER_PORT"]  # fmt: skip
    code = f"import os; print(' '.join(os.environ.get(n, '-') for n in {names!r}))"
    gang = Gang(rank=1, size=3, head="10.0.0.7", port=29417)
    await runner.start(launch("j1", code, gang=gang, env={"MASTER_PORT": "1"}))
    await out.wait_for(JobExited)
    log = (runner.job_dir("j1", 1) / "output.log").read_text()
    assert log.split() == ["1", "3", "10.0.0.7", "29417"] * 3
    # A job on one node is told nothing of gangs.
    alone = Outbox()
    runner = Runner(tmp_path / "alone", alone.post)
    await runner.start(launch("j2", code))
    await alone.wait_for(JobExited)
    assert (runner.job_dir("j2", 1) / "output.log").read_text().split() == ["-"] * 12


async def test_a_command_that_cannot_start_fails_with_the_reason(tmp_path: Path) -> None:
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    await runner.start(Launch(job_id="j", attempt=1, user="u", argv=["/no/such/binary"]))
    failed = await out.wait_for(JobFailed)
    assert "/no/such/binary" in failed.reason
    assert not any(isinstance(m, JobStarted) for m in out.messages)


async def test_kill_takes_down_the_whole_process_group(tmp_path: Path) -> None:
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    code = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60']);"
        "open('child.pid', 'w').write(str(p.pid)); time.sleep(60)"
    )
    await runner.start(launch("j", code, cwd=str(tmp_path)))
    started = await out.wait_for(JobStarted)
    child_file = tmp_path / "child.pid"
    async with asyncio.timeout(10):
        while not child_file.exists() or not child_file.read_text():  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.02)
    grandchild = int(child_file.read_text())
    await runner.kill("j", 1, grace_s=5)
    exited = await out.wait_for(JobExited)
    assert exited.signal == signal.SIGTERM
    await asyncio.sleep(0.1)
    assert not alive(started.pid) and not alive(grandchild)


async def test_a_job_that_ignores_sigterm_is_killed_when_the_grace_period_ends(
    tmp_path: Path,
) -> None:
    """A job may ignore SIGTERM or hang in its handler; the GPUs must come back anyway,
    a grace period later and not before."""
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "open('ready', 'w'); time.sleep(60)"
    )
    await runner.start(launch("j", code, cwd=str(tmp_path)))
    started = await out.wait_for(JobStarted)
    async with asyncio.timeout(10):
        while not (tmp_path / "ready").exists():  # noqa: ASYNC110 - a file, not an event
            await asyncio.sleep(0.02)
    began = time.monotonic()
    await runner.kill("j", 1, grace_s=1)
    try:
        exited = await out.wait_for(JobExited, within_s=5)
    finally:
        if alive(started.pid):  # no escalation: leave no sleeper behind
            os.kill(started.pid, signal.SIGKILL)
    assert time.monotonic() - began >= 1.0  # SIGTERM alone did not end it
    assert exited.signal == signal.SIGKILL
    await asyncio.sleep(0.1)
    assert not alive(started.pid)


async def test_a_job_survives_a_runner_restart_and_its_exit_is_found(tmp_path: Path) -> None:
    first = Outbox()
    runner = Runner(tmp_path, first.post)
    await runner.start(launch("j", "import time; time.sleep(1.0); raise SystemExit(7)"))
    await first.wait_for(JobStarted)
    runner.close()  # the agent goes away; the launcher does not

    second = Outbox()
    again = Runner(tmp_path, second.post)
    again.recover()
    reports = again.reports()
    assert [(r.job_id, r.attempt, r.status) for r in reports] == [("j", 1, "running")]
    exited = await second.wait_for(JobExited)
    assert exited.exit_code == 7
    assert not any(isinstance(m, JobExited) for m in first.messages)


async def test_an_exit_while_no_agent_watched_is_reported_after_restart(tmp_path: Path) -> None:
    first = Outbox()
    runner = Runner(tmp_path, first.post)
    await runner.start(launch("j", "raise SystemExit(5)"))
    await first.wait_for(JobExited)
    runner.close()
    again = Runner(tmp_path, Outbox().post)
    again.recover()
    [report] = again.reports()
    assert (report.status, report.exit_code) == ("exited", 5)
    again.ack("j", 1)
    assert again.reports() == []
    third = Runner(tmp_path, Outbox().post)
    third.recover()
    assert third.reports() == []  # acknowledged exits are forgotten for good


async def test_a_repeated_launch_does_not_start_the_job_twice(tmp_path: Path) -> None:
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    code = "open('runs', 'a').write('x'); import time; time.sleep(0.5)"
    await runner.start(launch("j", code, cwd=str(tmp_path)))
    await runner.start(launch("j", code, cwd=str(tmp_path)))
    await out.wait_for(JobExited)
    assert (tmp_path / "runs").read_text() == "x"
    assert sum(isinstance(m, JobStarted) for m in out.messages) == 2  # the same start, told twice


async def test_a_kill_before_the_launch_means_it_never_starts(tmp_path: Path) -> None:
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    await runner.kill("j", 1, grace_s=1)
    await runner.start(launch("j", "open('ran', 'w')", cwd=str(tmp_path)))
    exited = await out.wait_for(JobExited)
    assert exited.signal == signal.SIGKILL
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("image", ["pytorch:2"])
async def test_images_are_refused_until_containers_are_supported(
    tmp_path: Path, image: str
) -> None:
    out = Outbox()
    await Runner(tmp_path, out.post).start(launch("j", "pass", image=image))
    failed = await out.wait_for(JobFailed)
    assert "image" in failed.reason


async def test_logs_are_served_whole_across_chunks_and_characters(tmp_path: Path) -> None:
    from agentd import logs
    from shared.protocol import LogChunk, LogRequest

    runner = Runner(tmp_path, Outbox().post)
    job_dir = runner.job_dir("j", 1)
    job_dir.mkdir(parents=True)
    text = "a" * (logs.CHUNK_BYTES - 1) + "é" + "z" * 10  # 'é' straddles the first boundary
    (job_dir / "output.log").write_text(text)
    chunks: list[LogChunk] = []

    async def send(chunk: LogChunk) -> bool:
        chunks.append(chunk)
        return True

    await logs.serve(runner, LogRequest(request_id="r", job_id="j", attempt=1), send)
    assert "".join(c.data for c in chunks) == text
    assert chunks[-1].eof and chunks[-1].error is None
    missing: list[LogChunk] = []

    async def record(chunk: LogChunk) -> bool:
        missing.append(chunk)
        return True

    await logs.serve(runner, LogRequest(request_id="r", job_id="j", attempt=2), record)
    assert missing[0].eof and "no log" in (missing[0].error or "")


async def test_the_directories_of_acknowledged_jobs_go_after_the_retention(tmp_path: Path) -> None:
    """A job's directory holds its log until schedd has its end and the retention has
    passed; a job not acknowledged yet keeps it whatever its age."""
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    for job_id in ("old", "recent", "unacked"):
        await runner.start(launch(job_id, "print('hi')"))
    async with asyncio.timeout(10):
        while sum(isinstance(m, JobExited) for m in out.messages) < 3:
            out.arrived.clear()
            await out.arrived.wait()
    runner.ack("old", 1)
    runner.ack("recent", 1)
    day = 86400.0
    acked = runner.job_dir("old", 1) / "acked"
    os.utime(acked, (acked.stat().st_mtime - 8 * day,) * 2)
    assert runner.prune(7 * day) == 1
    assert not runner.job_dir("old", 1).exists()
    assert (runner.job_dir("recent", 1) / "output.log").read_text() == "hi\n"
    assert runner.job_dir("unacked", 1).exists()
    assert runner.prune(7 * day, now=time.time() + 30 * day) == 1  # "recent", in a month
    assert [p.name for p in runner.jobs_dir.iterdir()] == ["unacked.1"]
    # Kept forever: the task returns at once and nothing goes.
    await asyncio.wait_for(runner.prune_every(0), 1)
    assert runner.job_dir("unacked", 1).exists()


async def test_a_checkpoint_directory_that_cannot_be_made_fails_the_job_saying_so(
    tmp_path: Path,
) -> None:
    out = Outbox()
    sockets = Path(tempfile.mkdtemp(prefix="rn-"))  # a socket's path must be short
    shims = ShimServer(sockets)
    in_the_way = tmp_path / "checkpoints"
    in_the_way.write_text("a file where the checkpoint root should be")
    runner = Runner(tmp_path / "state", out.post, shims=shims, checkpoint_root=in_the_way)
    try:
        await runner.start(launch("j1", "print('never')"))
        failed = await out.wait_for(JobFailed)
        assert isinstance(failed, JobFailed)
        assert failed.reason.startswith(
            "cannot prepare the job's shim socket or checkpoint directory: [Errno 20] Not a"
            " directory"
        ), failed.reason
        assert not runner.job_dir("j1", 1).exists() and os.listdir(sockets) == []
        # The launch sent again (as after a reconnect) fails the same, and starts nothing.
        await runner.start(launch("j1", "print('never')"))
        assert [type(m) for m in out.messages] == [JobFailed, JobFailed]
    finally:
        runner.close()
        await shims.close()
        shutil.rmtree(sockets)


async def test_a_job_that_ended_for_good_takes_its_checkpoints_with_its_directory(
    tmp_path: Path,
) -> None:
    """An attempt schedd acknowledged as the job's last (`ExitAck.final`) takes the
    job's checkpoint directory with its own at the retention; one after which the job
    was requeued leaves them for the next attempt."""
    out = Outbox()
    runner = Runner(tmp_path, out.post)
    for job_id in ("done", "requeued"):
        await runner.start(launch(job_id, "print('hi')"))
        (runner.checkpoint_root / job_id / "step-000000007").mkdir(parents=True)
    async with asyncio.timeout(10):
        while sum(isinstance(m, JobExited) for m in out.messages) < 2:
            out.arrived.clear()
            await out.arrived.wait()
    runner.ack("done", 1, final=True)
    runner.ack("requeued", 1)
    assert (runner.checkpoint_root / "done").exists()  # not before the retention
    assert runner.prune(0.0, now=time.time() + 1) == 2
    assert os.listdir(runner.checkpoint_root) == ["requeued"]
