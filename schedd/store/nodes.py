"""Nodes and their GPUs as agents registered them, and GPU samples as they arrive."""

from __future__ import annotations

from typing import Any

import asyncpg

from schedd.store.jobs import CLOSE_UTIL_ALONE, part_runs_on, runs_beside, suspended_sql
from shared.protocol import GpuSample, Inventory


async def register(pool: asyncpg.Pool, node_id: str, inv: Inventory) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            """
            INSERT INTO nodes (node_id, labels, cpus, memory_mib, gpu_backend, coordinator,
                               connected)
            VALUES ($1, $2, $3, $4, $5, $6, true)
            ON CONFLICT (node_id) DO UPDATE SET labels = $2, cpus = $3, memory_mib = $4,
                gpu_backend = $5, coordinator = $6, connected = true, last_seen = now()
            """,
            node_id,
            inv.labels,
            inv.cpus,
            inv.memory_mib,
            inv.gpu_backend,
            inv.coordinator,
        )
        # A GPU gone from the inventory (it fell off the bus, say) keeps its row while it
        # has a fault: the fault stands until an admin clears it.
        await conn.execute(
            "DELETE FROM gpus WHERE node_id = $1 AND NOT uuid = ANY($2::text[]) AND fault IS NULL",
            node_id,
            [g.uuid for g in inv.gpus],
        )
        await conn.executemany(
            """
            INSERT INTO gpus (uuid, node_id, index, model, memory_mib) VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (uuid) DO UPDATE SET node_id = $2, index = $3, model = $4,
                memory_mib = $5, updated_at = now()
            """,
            [(g.uuid, node_id, g.index, g.model, g.memory_mib) for g in inv.gpus],
        )


async def set_connected(pool: asyncpg.Pool, node_id: str, connected: bool) -> None:
    await pool.execute(
        "UPDATE nodes SET connected = $2, last_seen = now() WHERE node_id = $1", node_id, connected
    )


async def disconnect_all(pool: asyncpg.Pool, recent_s: float) -> list[asyncpg.Record]:
    """At start-up no agent is connected yet, whatever the last run left behind. Returns
    the nodes that may yet come back (`node_id`, `gpus` without a fault, `away_since`):
    those connected when the last run ended (away since now) and those seen within
    `recent_s`."""
    return await pool.fetch(
        """
        WITH was AS (
            SELECT node_id, connected, last_seen FROM nodes
            WHERE connected OR last_seen > now() - make_interval(secs => $1)
        ), off AS (
            UPDATE nodes SET connected = false WHERE connected
        )
        SELECT w.node_id, count(g.uuid) FILTER (WHERE g.fault IS NULL)::int AS gpus,
               extract(epoch FROM CASE WHEN w.connected THEN now() ELSE w.last_seen END)::float8
                   AS away_since
        FROM was w LEFT JOIN gpus g USING (node_id)
        GROUP BY w.node_id, w.connected, w.last_seen
        """,
        recent_s,
    )


async def record_samples(pool: asyncpg.Pool, node_id: str, samples: list[GpuSample]) -> None:
    """The GPUs' last samples, and the usage so far of each job running on the node
    alone on its GPUs: the peak memory on any of them (not while a job is suspended
    there either: it keeps its tensors in GPU memory), and their utilisation averaged
    into one sample per report. A sample is of the whole GPU: where another job runs
    on one of the job's GPUs (packed, or an opportunistic job beside it) it shows both,
    and is not the job's."""
    # A GPU that could not be read is reported fully busy: not what its job did.
    read = [s for s in samples if s.error is None]
    uuids = [s.uuid for s in read]
    utils = [s.utilization_pct for s in read]
    async with pool.acquire() as conn, conn.transaction():
        await conn.executemany(
            "UPDATE gpus SET utilization_pct = $2, memory_used_mib = $3, updated_at = now()"
            " WHERE uuid = $1",
            [(s.uuid, s.utilization_pct, s.memory_used_mib) for s in samples],
        )
        await conn.execute(
            f"""
            WITH s AS (
                SELECT j.id, max(s.mem) AS mem, avg(s.util)::float8 AS util
                FROM unnest($1::text[], $2::int[], $3::int[]) AS s(uuid, util, mem)
                JOIN jobs j
                  ON j.state = 'running' AND s.uuid = ANY(j.gpu_uuids)
                  AND (j.node_id = $4 OR {part_runs_on("$4", "j")})
                  -- A suspended job's GPUs show what another job does there.
                  AND NOT {suspended_sql("j")}
                  AND NOT {runs_beside("j")}
                GROUP BY j.id
            )
            UPDATE jobs j SET
                -- A job taking turns shares GPU memory with the one suspended there.
                gpu_memory_peak_mib = CASE WHEN {runs_beside("j", suspended_too=True)}
                    THEN j.gpu_memory_peak_mib
                    ELSE greatest(coalesce(j.gpu_memory_peak_mib, 0), s.mem) END,
                gpu_util_samples = j.gpu_util_samples + 1,
                gpu_util_sum = j.gpu_util_sum + s.util,
                gpu_util_sumsq = j.gpu_util_sumsq + s.util * s.util
            FROM s WHERE j.id = s.id
            """,
            uuids,
            utils,
            [s.memory_used_mib for s in read],
            node_id,
        )
        await conn.execute(_MEASURE_UTIL_ALONE, uuids, utils, node_id)


# How busy each running job keeps its GPUs while it runs alone on them (packing reads
# it): a job that runs, not suspended, with no other job running on any of its GPUs
# (one placed there and not suspended) and every one of them read, takes its GPUs'
# mean utilisation as its figure, and the previous figure as having held since the
# previous sample, if it ran alone since (`util_alone_at` is cleared whenever that run
# is broken: by this statement for a job that is not alone at a sample, and by a
# suspend or resume). A figure is thus only ever what the GPUs did with the job alone.
_MEASURE_UTIL_ALONE = f"""
WITH s AS (
    SELECT * FROM unnest($1::text[], $2::int[]) AS s(uuid, util)
), alone AS (
    SELECT j.id, avg(s.util)::float8 AS util
    FROM jobs j JOIN s ON s.uuid = ANY(j.gpu_uuids)
    -- (The states of the index of placed jobs, `jobs_placed`, in every subquery.)
    WHERE j.state = 'running' AND j.node_id = $3 AND cardinality(j.gpu_uuids) > 0
      AND NOT {suspended_sql("j")}
      AND NOT {runs_beside("j")}
    GROUP BY j.id, j.gpu_uuids
    HAVING count(*) = cardinality(j.gpu_uuids)
), measured AS (
    UPDATE jobs j SET {CLOSE_UTIL_ALONE}, util_alone_pct = a.util, util_alone_at = now()
    FROM alone a WHERE j.id = a.id
)
UPDATE jobs j SET util_alone_at = NULL
WHERE j.node_id = $3 AND j.state IN ('assigned', 'running', 'preempting', 'cancelling')
  AND j.util_alone_at IS NOT NULL AND j.id NOT IN (SELECT id FROM alone)
"""


async def record_fault(
    pool: asyncpg.Pool, node_id: str, uuid: str, xid: int | None, error: str
) -> bool:
    """Take the node's GPU out of placement with this fault; False if it is out already
    (its first fault is kept) or the node has no such GPU."""
    return (
        await pool.fetchval(
            "UPDATE gpus SET fault = $3, fault_xid = $4, fault_at = now()"
            " WHERE node_id = $1 AND uuid = $2 AND fault IS NULL RETURNING true",
            node_id,
            uuid,
            error,
            xid,
        )
        is True
    )


async def clear_fault(pool: asyncpg.Pool, node_id: str, uuid: str) -> asyncpg.Record | None:
    """Put the node's GPU back into placement; its fault as it was, None if it had none
    (or the node has no such GPU)."""
    # Locked first: of two clears at once, the second finds nothing left to clear.
    return await pool.fetchrow(
        "WITH old AS (SELECT uuid, fault, fault_xid, fault_at FROM gpus"
        " WHERE node_id = $1 AND uuid = $2 AND fault IS NOT NULL FOR UPDATE)"
        " UPDATE gpus g SET fault = NULL, fault_xid = NULL, fault_at = NULL FROM old"
        " WHERE g.uuid = old.uuid RETURNING old.fault, old.fault_xid, old.fault_at",
        node_id,
        uuid,
    )


async def faulty_gpus(pool: asyncpg.Pool) -> set[str]:
    """The GPUs out of placement for a fault."""
    return {r["uuid"] for r in await pool.fetch("SELECT uuid FROM gpus WHERE fault IS NOT NULL")}


async def drain(pool: asyncpg.Pool, node_id: str, reason: str, by: str) -> asyncpg.Record | None:
    """Take the node out of placement; its drain as it stands (a node drained already
    keeps its first drain), or None: no such node."""
    return await pool.fetchrow(
        "UPDATE nodes SET drain_reason = coalesce(drain_reason, $2),"
        " drained_by = coalesce(drained_by, $3), drained_at = coalesce(drained_at, now())"
        " WHERE node_id = $1 RETURNING drain_reason, drained_by, drained_at",
        node_id,
        reason,
        by,
    )


async def undrain(pool: asyncpg.Pool, node_id: str) -> asyncpg.Record | None:
    """Put the node back into placement; its drain as it was, None if it had none."""
    # Locked first: of two at once, the second finds nothing left to undo.
    return await pool.fetchrow(
        "WITH old AS (SELECT node_id, drain_reason, drained_by, drained_at FROM nodes"
        " WHERE node_id = $1 AND drained_at IS NOT NULL FOR UPDATE)"
        " UPDATE nodes n SET drain_reason = NULL, drained_by = NULL, drained_at = NULL FROM old"
        " WHERE n.node_id = old.node_id"
        " RETURNING old.drain_reason, old.drained_by, old.drained_at",
        node_id,
    )


async def drained_nodes(pool: asyncpg.Pool) -> set[str]:
    return {
        r["node_id"]
        for r in await pool.fetch("SELECT node_id FROM nodes WHERE drained_at IS NOT NULL")
    }


async def has_node(pool: asyncpg.Pool, node_id: str) -> bool:
    return bool(await pool.fetchval("SELECT 1 FROM nodes WHERE node_id = $1", node_id))


async def has_gpu(pool: asyncpg.Pool, node_id: str, uuid: str) -> bool:
    return bool(
        await pool.fetchval("SELECT 1 FROM gpus WHERE node_id = $1 AND uuid = $2", node_id, uuid)
    )


async def list_nodes(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    nodes = await pool.fetch(
        "SELECT node_id, labels, cpus, memory_mib, gpu_backend, coordinator, connected,"
        " first_seen, last_seen, drain_reason, drained_by, drained_at FROM nodes ORDER BY node_id"
    )
    gpus = await pool.fetch(
        "SELECT g.uuid, g.node_id, g.index, g.model, g.memory_mib, g.utilization_pct,"
        " g.memory_used_mib, g.fault, g.fault_xid, g.fault_at, j.id AS job_id FROM gpus g"
        " LEFT JOIN jobs j ON j.state IN ('assigned', 'running', 'preempting', 'cancelling')"
        "   AND g.uuid = ANY(j.gpu_uuids)"
        " ORDER BY g.node_id, g.index"
    )
    by_node: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        entry = dict(g)
        entry["fault_at"] = g["fault_at"].isoformat() if g["fault_at"] else None
        by_node.setdefault(entry.pop("node_id"), []).append(entry)
    return [
        {
            **dict(n),
            "first_seen": n["first_seen"].isoformat(),
            "last_seen": n["last_seen"].isoformat(),
            "drained_at": n["drained_at"].isoformat() if n["drained_at"] else None,
            "gpus": by_node.get(n["node_id"], []),
        }
        for n in nodes
    ]
