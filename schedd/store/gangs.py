"""The parts of jobs spread over nodes (gangs): one row per node and attempt.

A gang is placed in one transaction with its parts (`place`); each part's start and end
is recorded as its node reports it; the job's own state follows from its parts'
(`schedd.gangs`). A job on one node has no parts.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from schedd.store import jobs
from shared.model import JobState

_PART_COLUMNS = (
    "job_id, attempt, rank, node_id, gpu_uuids, started_at, ended_at, exit_code, exit_signal,"
    " reason, lost"
)


async def place(
    pool: asyncpg.Pool, job_id: str, reason: str, parts: Sequence[tuple[str, Sequence[str]]]
) -> jobs.Moved:
    """Move a pending job to `assigned` on its nodes: `parts` is (node, GPUs) per part,
    the head first; one part for a job on one node, several for a gang, whose parts are
    recorded. The job holds every part's GPUs, and its count is theirs (an elastic job
    may start on fewer than it asked for); its node is the head's."""
    everything = [u for _, uuids in parts for u in uuids]
    async with pool.acquire() as conn, conn.transaction():
        moved = await jobs.transition(
            conn,
            job_id,
            JobState.ASSIGNED,
            reason,
            node_id=parts[0][0],
            gpu_uuids=everything,
            gpus=len(everything),
        )
        if moved.ok and len(parts) > 1:
            await conn.executemany(
                "INSERT INTO job_parts (job_id, attempt, rank, node_id, gpu_uuids)"
                " VALUES ($1, $2, $3, $4, $5)",
                [
                    (job_id, moved.attempt, rank, node_id, list(uuids))
                    for rank, (node_id, uuids) in enumerate(parts)
                ],
            )
    return moved


async def parts(
    db: asyncpg.Pool | asyncpg.Connection, job_id: str, attempt: int
) -> list[asyncpg.Record]:
    """The attempt's parts, by rank (none for a job on one node)."""
    return await db.fetch(
        f"SELECT {_PART_COLUMNS} FROM job_parts WHERE job_id = $1 AND attempt = $2 ORDER BY rank",
        job_id,
        attempt,
    )


async def started(pool: asyncpg.Pool, job_id: str, attempt: int, node_id: str) -> None:
    """Record that the part on `node_id` started, if the attempt has one there (a job on
    one node has none: nothing changes)."""
    await pool.execute(
        "UPDATE job_parts SET started_at = coalesce(started_at, now())"
        " WHERE job_id = $1 AND attempt = $2 AND node_id = $3",
        job_id,
        attempt,
        node_id,
    )


async def has_parts(pool: asyncpg.Pool, job_id: str, attempt: int) -> bool:
    """Whether the attempt runs as a gang (parts over several nodes)."""
    return bool(
        await pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM job_parts WHERE job_id = $1 AND attempt = $2)",
            job_id,
            attempt,
        )
    )


async def ended(
    pool: asyncpg.Pool,
    job_id: str,
    attempt: int,
    node_id: str,
    *,
    exit_code: int | None = None,
    exit_signal: int | None = None,
    reason: str | None = None,
    lost: bool = False,
) -> list[asyncpg.Record] | None:
    """Record how the part on `node_id` ended, once, and return every part of the
    attempt as it stands now; None if the attempt has no part there (a job on one
    node). A part already recorded as ended keeps its first ending."""
    # Most jobs run on one node: one read tells, before any lock or transaction.
    if not await has_parts(pool, job_id, attempt):
        return None
    async with pool.acquire() as conn, conn.transaction():
        # Parts end at once on their nodes: each ending waits for the one before it, so
        # that the last sees every other ended (and settles the job) whatever the order.
        await conn.execute(
            "SELECT 1 FROM job_parts WHERE job_id = $1 AND attempt = $2 ORDER BY rank FOR UPDATE",
            job_id,
            attempt,
        )
        found = await conn.fetchrow(
            "UPDATE job_parts SET"
            # In the order the endings took the lock: the first failure is the first here.
            " ended_at = coalesce(ended_at, clock_timestamp()),"
            " exit_code = CASE WHEN ended_at IS NULL THEN $4 ELSE exit_code END,"
            " exit_signal = CASE WHEN ended_at IS NULL THEN $5 ELSE exit_signal END,"
            " reason = CASE WHEN ended_at IS NULL THEN $6 ELSE reason END,"
            " lost = CASE WHEN ended_at IS NULL THEN $7 ELSE lost END"
            " WHERE job_id = $1 AND attempt = $2 AND node_id = $3 RETURNING rank",
            job_id,
            attempt,
            node_id,
            exit_code,
            exit_signal,
            reason,
            lost,
        )
        if found is None:
            return None
        return await parts(conn, job_id, attempt)


def running(rows: Sequence[asyncpg.Record]) -> list[asyncpg.Record]:
    """The parts that have not ended."""
    return [p for p in rows if p["ended_at"] is None]


def failed(part: asyncpg.Record) -> bool:
    """Whether the part ended other than by exiting 0 (lost, killed, could not run)."""
    return part["ended_at"] is not None and (
        part["lost"]
        or part["reason"] is not None
        or part["exit_signal"] is not None
        or part["exit_code"] != 0
    )


def as_dict(part: asyncpg.Record) -> dict[str, object]:
    """A part as the API shows it (in its job's `placement.parts`)."""
    return {
        "rank": part["rank"],
        "node_id": part["node_id"],
        "gpu_uuids": list(part["gpu_uuids"]),
        "started_at": part["started_at"].isoformat() if part["started_at"] else None,
        "ended_at": part["ended_at"].isoformat() if part["ended_at"] else None,
        "exit_code": part["exit_code"],
        "exit_signal": part["exit_signal"],
        "reason": part["reason"],
        "lost": part["lost"],
    }
