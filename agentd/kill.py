"""A kill from schedd: SIGTERM, then SIGKILL after the grace; a preemption saves first.

A preempted job that can save a checkpoint (schedd sends `checkpoint_s` only for such a
job: one whose shim reports mini-batches) is asked through its shim to save at its next
mini-batch and exit, and is signalled only if it has not by `checkpoint_s`: its save
failed, or took too long. Its checkpointed exit then carries the checkpoint to schedd,
where the job resumes from it. A kill sent again meanwhile leaves the one under way to it.
"""

from __future__ import annotations

import asyncio

from agentd.job_controls import JobControls
from agentd.runner import Runner
from shared import logging
from shared.protocol import Kill

log = logging.get("kill")


async def kill(runner: Runner, controls: JobControls | None, command: Kill) -> None:
    job = runner.jobs.get((command.job_id, command.attempt))
    if controls is not None and controls.saving(command.job_id, command.attempt):
        # Sent again (schedd does so when its link to this agent came back while the
        # job was stopping): the kill under way signals it if its save does not come.
        log.info("kill under way", job_id=command.job_id, attempt=command.attempt)
        return
    if command.checkpoint_s > 0 and controls is not None and job is not None:
        failed = controls.save_before_kill(command.job_id, command.attempt)
        if failed is not None:
            waits = [asyncio.ensure_future(e.wait()) for e in (job.done, failed)]
            try:
                await asyncio.wait(
                    waits, timeout=command.checkpoint_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for wait in waits:
                    wait.cancel()
                controls.save_over(command.job_id, command.attempt)
            if job.done.is_set():
                return
            late = f"none within {command.checkpoint_s} s"
            log.info(
                "no checkpoint before kill",
                job_id=command.job_id,
                attempt=command.attempt,
                why="its save failed" if failed.is_set() else late,
            )
    await runner.kill(command.job_id, command.attempt, command.grace_s)
