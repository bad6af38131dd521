"""Jobs spread over nodes (gangs) in the live system: their parts start and end together.

A job larger than any one node is placed by the policy all or nothing, one shard per
node; the executor launches one part on each (`launches`), rank 0 on the head node,
each told where the head listens so that the processes find each other (torch's
rendezvous). Each node reports its part as it would any job; here the job's state
follows from its parts':
- it is running from its first part's start;
- when a part fails (exits other than 0, is killed, cannot start), the other parts are
  stopped, and the job fails with the first failure's words once they have;
- when a part is lost with its node, the others are stopped too and the job is
  requeued, as a job on one node would be;
- a cancel or a preemption stops every part, and the job is cancelled or requeued once
  none is left;
- it succeeds when every part exited 0.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from schedd.exits import describe_exit
from schedd.policy.snapshot import Request, Shard, shard_requests
from schedd.store import gangs as parts_store
from schedd.store import jobs
from shared import logging
from shared.model import HOLDS_RESOURCES, JobSpec, JobState
from shared.protocol import Gang, Kill, Launch, Msg

log = logging.get("gangs")

SendFn = Callable[[str, Msg], Awaitable[bool]]

# The head's rendezvous port: one of PORT_SPAN from PORT_BASE, by the job's submission
# number, so that gangs sharing a head node seldom ask for the same one.
PORT_BASE = 29400
PORT_SPAN = 1000


def rendezvous_port(seq: int) -> int:
    return PORT_BASE + seq % PORT_SPAN


def head_address(job_id: str, head_node: str, addresses: Sequence[str | None]) -> str:
    """Where the parts find the head (rank 0): its agent's address. `addresses` are the
    agents' of the job's nodes, the head's first (None: not connected). Where no address
    is advertised it is the one schedd sees, which on schedd's own host is loopback:
    nodes elsewhere cannot reach that, and the log says how to fix it."""
    head = addresses[0] or ""
    if _loopback(head) and any(a is not None and not _loopback(a) for a in addresses[1:]):
        log.warning(
            "gang head unreachable from other nodes",
            job_id=job_id,
            node_id=head_node,
            address=head,
            fix="set advertise_address in that node's agentd.toml",
        )
    return head


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def launches(
    row: asyncpg.Record,
    spec: JobSpec,
    attempt: int,
    shards: Sequence[Shard],
    head_address: str,
) -> list[tuple[str, Launch]]:
    """(node, message) for each part of a job placed on `shards`: the job's CPUs and
    memory split over its parts in proportion to their GPUs, as the policy counted
    them. A job on one shard gets one message and no gang."""
    request = Request(sum(len(s.gpu_uuids) for s in shards), spec.cpus, spec.memory_mib)
    out = []
    for rank, (shard, part) in enumerate(
        zip(shards, shard_requests(request, tuple(shards)), strict=True)
    ):
        gang = (
            Gang(rank=rank, size=len(shards), head=head_address, port=rendezvous_port(row["seq"]))
            if len(shards) > 1
            else None
        )
        out.append(
            (
                shard.node_id,
                Launch(
                    job_id=row["id"],
                    attempt=attempt,
                    user=row["user_name"],
                    argv=spec.argv(),
                    env=spec.env,
                    cwd=spec.cwd,
                    gpu_uuids=list(shard.gpu_uuids),
                    cpus=part.cpus,
                    memory_mib=part.memory_mib,
                    inputs=spec.inputs,
                    image=spec.image,
                    kind=row["kind"],
                    resume_from=row["checkpoint_path"],
                    gang=gang,
                ),
            )
        )
    return out


async def live_nodes(pool: asyncpg.Pool, row: asyncpg.Record) -> list[str]:
    """The nodes where the job's current attempt still runs something: its parts that
    have not ended, or its one node."""
    parts = await parts_store.parts(pool, row["id"], row["attempt"])
    if not parts:
        return [row["node_id"]] if row["node_id"] is not None else []
    return [p["node_id"] for p in parts_store.running(parts)]


async def part_ended(
    pool: asyncpg.Pool,
    send: SendFn,
    grace_s: float,
    row: asyncpg.Record,
    node_id: str,
    *,
    exit_code: int | None = None,
    exit_signal: int | None = None,
    reason: str | None = None,
    lost: bool = False,
) -> bool:
    """The part of the job's current attempt on `node_id` ended (or was lost with its
    node): record it, stop the other parts if it failed, and settle the job once no
    part is left. False where the attempt has no part there (a job on one node)."""
    job_id, attempt = row["id"], row["attempt"]
    parts = await parts_store.ended(
        pool,
        job_id,
        attempt,
        node_id,
        exit_code=exit_code,
        exit_signal=exit_signal,
        reason=reason,
        lost=lost,
    )
    if parts is None:
        return False
    left = parts_store.running(parts)
    if left:
        # The first failure breaks the gang up; later ones are its other parts stopping.
        first = first_failure(parts)
        if first is not None and first["node_id"] == node_id:
            await _break_up(pool, send, grace_s, row, first, left)
        return True
    await _settle(pool, job_id, attempt, parts)
    return True


def first_failure(parts: Sequence[asyncpg.Record]) -> asyncpg.Record | None:
    """The part whose failure came first (lowest rank among equal times), if any did."""
    failures = [p for p in parts if parts_store.failed(p)]
    return min(failures, key=lambda p: (p["ended_at"], p["rank"]), default=None)


async def broken(pool: asyncpg.Pool, job_id: str, attempt: int) -> str | None:
    """Why the attempt's gang is broken (its first failed part), or None: not broken, or
    a job on one node."""
    first = first_failure(await parts_store.parts(pool, job_id, attempt))
    return None if first is None else _words(first)


def _words(part: asyncpg.Record) -> str:
    ended = part["reason"] or describe_exit(part["exit_code"], part["exit_signal"])
    return f"part {part['rank']} on node {part['node_id']}: {ended}"


async def _break_up(
    pool: asyncpg.Pool,
    send: SendFn,
    grace_s: float,
    row: asyncpg.Record,
    failed: asyncpg.Record,
    left: Sequence[asyncpg.Record],
) -> None:
    """One part failed while others run: the gang cannot go on without it."""
    job_id, attempt = row["id"], row["attempt"]
    why = _words(failed)
    if failed["lost"]:
        # Requeued once the others have stopped (`_settle`), as a lost job is.
        moved = await jobs.transition(
            pool,
            job_id,
            JobState.PREEMPTING,
            f"{why}; its other parts are stopped, then it is requeued",
            attempt=attempt,
            only_from=(JobState.RUNNING, JobState.ASSIGNED),
            reason=why,
        )
        stop = moved.ok
    else:
        fresh = await jobs.get(pool, job_id)
        stop = fresh is not None and fresh["state"] in (JobState.RUNNING, JobState.ASSIGNED)
    if not stop:
        return  # cancelled or preempted already: its parts have their kill
    log.info("gang broken", job_id=job_id, attempt=attempt, reason=why, stopping=len(left))
    for part in left:
        await send(
            part["node_id"],
            Kill(job_id=job_id, attempt=attempt, grace_s=grace_s, reason=f"gang broken: {why}"),
        )


_SETTLE_TRIES = 5  # a cancel or preemption at most per try: a few reach any end


async def _settle(
    pool: asyncpg.Pool, job_id: str, attempt: int, parts: Sequence[asyncpg.Record]
) -> None:
    """Every part has ended: the job ends, or is requeued, accordingly. A cancel or a
    preemption committed meanwhile changes the outcome: read again, and try again."""
    for _ in range(_SETTLE_TRIES):
        row = await jobs.get(pool, job_id)
        if row is None or row["attempt"] != attempt or row["state"] not in HOLDS_RESOURCES:
            return  # settled already, or moved on
        state = JobState(row["state"])
        target, words, sets = _outcome(state, row, parts)
        moved = await jobs.transition(
            pool, job_id, target, words, attempt=attempt, only_from=(state,), **sets
        )
        if moved.ok:
            return
    log.warning("gang not settled", job_id=job_id, attempt=attempt, tries=_SETTLE_TRIES)


def _outcome(
    state: JobState, row: asyncpg.Record, parts: Sequence[asyncpg.Record]
) -> tuple[JobState, str, dict[str, Any]]:
    """What a job whose parts have all ended becomes: (state, words, columns to set)."""
    first = first_failure(parts)
    words = "every part exited with code 0" if first is None else _words(first)
    if state is JobState.CANCELLING:
        return JobState.CANCELLED, words, {}
    if state is JobState.PREEMPTING or (first is not None and first["lost"]):
        # Preempted, or broken up by the loss of a node: requeued, as a job on one node.
        why = (row["reason"] or "preempted") if state is JobState.PREEMPTING else words
        requeued = f"requeued ({why}): every part has stopped"
        return JobState.PENDING, requeued, {"reason": requeued}
    if first is None:
        return JobState.SUCCEEDED, words, {"exit_code": 0}
    return (
        JobState.FAILED,
        words,
        {"exit_code": first["exit_code"], "exit_signal": first["exit_signal"], "reason": words},
    )
