"""A job's inputs through the runner and the stager: real processes, files, HTTP server."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from agentd.runner import Runner
from agentd.stager import Stager
from shared.protocol import JobExited, JobFailed, Launch
from tests.integration.test_runner import Outbox

# The job prints its inputs' local paths and the first line of each.
SHOW = (
    "import os; paths = os.environ['GPUSCHED_INPUTS'].split(os.pathsep);"
    "[print(p, open(p).readline().strip()) for p in paths]"
)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP server with /data.txt; the list records each request's path."""
    hits: list[str] = []

    async def data(request: web.Request) -> web.Response:
        hits.append(request.path)
        await asyncio.sleep(0.2)  # long enough for a second job to ask meanwhile
        return web.Response(text="weights v1\n" * 1000)

    app = web.Application()
    app.router.add_get("/data.txt", data)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", hits
    finally:
        await runner.cleanup()


def job(job_id: str, inputs: list[str]) -> Launch:
    return Launch(
        job_id=job_id, attempt=1, user="alice", argv=[sys.executable, "-c", SHOW], inputs=inputs
    )


async def ended(out: Outbox, job_id: str) -> JobExited | JobFailed:
    async with asyncio.timeout(20):
        while True:
            for msg in out.messages:
                if isinstance(msg, JobExited | JobFailed) and msg.job_id == job_id:
                    return msg
            out.arrived.clear()
            await out.arrived.wait()


def staged_runner(tmp_path: Path) -> tuple[Outbox, Stager, Runner]:
    """A runner whose jobs' inputs go through a 10 MiB node cache."""
    out = Outbox()
    stager = Stager(tmp_path / "cache", 10 * 2**20)
    return out, stager, Runner(tmp_path / "agent", out.post, stager=stager)


async def test_two_jobs_with_the_same_input_copy_it_once(
    tmp_path: Path, server: tuple[str, list[str]]
) -> None:
    url, hits = server
    local = tmp_path / "labels.csv"
    local.write_text("cat,dog\n")
    out, stager, runner = staged_runner(tmp_path)
    inputs = [f"{url}/data.txt", str(local)]
    await asyncio.gather(runner.start(job("j1", inputs)), runner.start(job("j2", inputs)))
    for job_id in ("j1", "j2"):
        exited = await ended(out, job_id)
        assert isinstance(exited, JobExited) and exited.exit_code == 0
    assert hits == ["/data.txt"]  # one download for both jobs
    logs = [(runner.job_dir(j, 1) / "output.log").read_text().splitlines() for j in ("j1", "j2")]
    assert logs[0] == logs[1]  # the same copies
    (remote, first), (copied, line) = (row.split(" ", 1) for row in logs[0])
    assert first == "weights v1" and line == "cat,dog"
    assert Path(remote).is_relative_to(tmp_path / "cache")
    assert Path(copied).is_relative_to(tmp_path / "cache") and Path(copied) != local
    await stager.close()


async def test_a_failing_url_fails_the_job_with_the_reason(
    tmp_path: Path, server: tuple[str, list[str]]
) -> None:
    url, _ = server
    out, stager, runner = staged_runner(tmp_path)
    await runner.start(job("j", [f"{url}/missing.bin"]))
    failed = await ended(out, "j")
    assert isinstance(failed, JobFailed)
    assert f"{url}/missing.bin" in failed.reason and "404" in failed.reason
    assert failed.reason.startswith("staging inputs failed")
    assert not runner.job_dir("j", 1).exists()  # it never started
    assert "j" not in stager.pinned_jobs()
    await stager.close()


async def test_a_job_cancelled_while_its_inputs_copy_never_starts(
    tmp_path: Path, server: tuple[str, list[str]]
) -> None:
    url, _ = server
    out, stager, runner = staged_runner(tmp_path)
    start = asyncio.create_task(runner.start(job("j", [f"{url}/data.txt"])))
    await asyncio.sleep(0.05)
    await runner.kill("j", 1, grace_s=1.0)
    await start
    exited = await ended(out, "j")
    assert isinstance(exited, JobExited) and exited.signal is not None
    assert not runner.job_dir("j", 1).exists()
    assert os.listdir(tmp_path / "agent" / "jobs") == []
    await stager.close()
