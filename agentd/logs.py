"""Serves a job's output log to schedd in chunks, following it while the job runs."""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentd.runner import Runner
from shared.protocol import LogChunk, LogRequest

CHUNK_BYTES = 64 * 1024
FOLLOW_IDLE_S = 0.2  # how often a followed log is read again when it has not grown
FOLLOW_START_WAIT_S = 60.0  # a follower may ask before the launch has reached this node


def _read(path: Path, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(CHUNK_BYTES)


async def serve(
    runner: Runner, req: LogRequest, send: Callable[[LogChunk], Awaitable[bool]]
) -> None:
    path = runner.job_dir(req.job_id, req.attempt) / "output.log"
    waited = 0.0
    while req.follow and not path.exists() and waited < FOLLOW_START_WAIT_S:
        await asyncio.sleep(FOLLOW_IDLE_S)
        waited += FOLLOW_IDLE_S
    if not path.exists():
        await send(
            LogChunk(
                request_id=req.request_id,
                eof=True,
                error=f"no log for job {req.job_id} attempt {req.attempt} on this node",
            )
        )
        return
    offset = req.offset
    # A chunk boundary may fall inside a character: decode across chunks.
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        job = runner.jobs.get((req.job_id, req.attempt))
        running = job is not None and job.ended is None
        data = await asyncio.to_thread(_read, path, offset)
        if data:
            offset += len(data)
            text = decoder.decode(data)
            if not await send(LogChunk(request_id=req.request_id, data=text)):
                return
            continue
        if not (req.follow and running):
            break
        await asyncio.sleep(FOLLOW_IDLE_S)
    await send(LogChunk(request_id=req.request_id, eof=True))
