"""Jobs and their event log.

Every state change goes through `transition`: one statement that locks the row, moves
it only from a state the transition table allows (and, for agent reports, only for the
attempt the report is about), and appends the event, atomically.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from shared import logging
from shared.model import (
    HOLDS_RESOURCES,
    TERMINAL,
    IllegalTransition,
    JobSpec,
    JobState,
    check_transition,
    sources_of,
)

log = logging.get("store")

# SQL: the job's utilisation while it ran alone on its GPUs, weighted by time, the
# interval since its last such sample included (the figure holds until the next one);
# its last figure where no interval is complete yet; NULL where never sampled alone.
_OPEN_S = "coalesce(greatest(extract(epoch FROM now() - util_alone_at)::float8, 0), 0)"
_UTIL_ALONE = (
    f"coalesce((util_alone_sum + util_alone_pct * {_OPEN_S})"
    f" / nullif(util_alone_s + {_OPEN_S}, 0), util_alone_pct)"
)
# SQL SET: the job's last figure held until now, its open interval (if any) added to
# the weighted sums (a new sample then opens the next one: `nodes.record_samples`).
CLOSE_UTIL_ALONE = (
    f"util_alone_s = util_alone_s + {_OPEN_S},"
    f" util_alone_sum = util_alone_sum + coalesce(util_alone_pct * {_OPEN_S}, 0)"
)
# SQL SET: the job's run alone ends now (it is suspended, or its run ends): its last
# figure held until now, and no interval is open any longer.
_FOLD_UTIL_ALONE = f"{CLOSE_UTIL_ALONE}, util_alone_at = NULL"
JOB_COLUMNS = (
    "id, seq, user_name, name, queue, priority, kind, spec, state, attempt, node_id, gpu_uuids,"
    " gpus, cpus, memory_mib, gpu_memory_mib, exit_code, exit_signal, reason, submitted_at,"
    " started_at, finished_at, updated_at, attained_gpu_s, estimated_runtime_s,"
    " checkpoint_path, pin_node_id, migrate_to, progress, controls, resize_to, deadline,"
    " deadline_admitted, deadline_reason, prefetched_to, suspended_at, resumed_at, paused_s,"
    " migrate_gpu_uuids, checkpointable, min_gpus, max_gpus, progress_at,"
    f" {_UTIL_ALONE} AS util_alone"
)
# What a snapshot takes of every pending and placed job beyond its request: its
# deadline and answer, and what the resource estimator predicts from.
_PLANNING_COLUMNS = (
    "extract(epoch FROM deadline)::float8 AS deadline_s, deadline_admitted,"
    " spec->'labels' AS labels, (spec->>'iterations')::bigint AS iterations"
)
# Entering these ends an attempt's run: its GPU time is added up and the run recorded.
_RUN_ENDS = frozenset({JobState.PENDING, JobState.CHECKPOINTED, *TERMINAL})

# A job's controls before any was asked: full share, no memory cap, not suspended.
DEFAULT_CONTROLS: dict[str, Any] = {"share": 100, "memory_cap_mib": None, "suspended": False}
_CONTROLS = f"coalesce(controls, '{json.dumps(DEFAULT_CONTROLS)}'::jsonb)"  # SQL: as they stand


def _ran_s(t: str) -> str:
    """SQL: the seconds the current attempt of the row `t` has run, its suspensions
    (time-slicing, or a user's) left out: a suspended job attains no service."""
    return (
        f"greatest(extract(epoch FROM coalesce({t}.suspended_at, now()) - {t}.started_at)::float8"
        f" - {t}.paused_s, 0)"
    )


def _finished_run_s(t: str) -> str:
    """SQL: how long the last attempt of the ended job `t` ran, its suspensions left out
    (a time-sliced job's wall time is not its run time)."""
    return (
        f"(extract(epoch FROM coalesce({t}.suspended_at, {t}.finished_at) - {t}.started_at)"
        f"::float8 - {t}.paused_s)"
    )


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different spec."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def new_job_id() -> str:
    return "j-" + secrets.token_hex(8)


async def submit(
    pool: asyncpg.Pool, user: str, spec: JobSpec, idempotency_key: str | None
) -> tuple[asyncpg.Record, bool]:
    """Store a pending job and its first event; (job, True) if new, (existing, False) on a retry."""
    spec_json = msgspec.to_builtins(spec)
    row = await pool.fetchrow(
        f"""
        WITH j AS (
            INSERT INTO jobs (id, user_name, name, queue, priority, kind, spec, state,
                              gpus, cpus, memory_mib, gpu_memory_mib, idempotency_key,
                              estimated_runtime_s, deadline, min_gpus, max_gpus)
            VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $10, $11, $12, $13, $14,
                    $15, $16)
            ON CONFLICT (user_name, idempotency_key) DO NOTHING
            RETURNING {JOB_COLUMNS}
        ), e AS (
            INSERT INTO job_events (job_id, to_state, attempt, reason)
            SELECT id, 'pending', 0, 'submitted' FROM j
        )
        SELECT * FROM j
        """,
        new_job_id(),
        user,
        spec.name,
        spec.queue,
        spec.priority,
        spec.kind.value,
        spec_json,
        spec.gpus,
        spec.cpus,
        spec.memory_mib,
        spec.gpu_memory_mib,
        idempotency_key,
        spec.estimated_runtime_s,
        spec.deadline,
        spec.min_gpus,
        spec.gpus if spec.min_gpus is not None else None,
    )
    if row is not None:
        return row, True
    existing = await pool.fetchrow(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE user_name = $1 AND idempotency_key = $2",
        user,
        idempotency_key,
    )
    assert existing is not None
    if existing["spec"] != spec_json:
        raise IdempotencyConflict(existing["id"])
    return existing, False


async def get(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record | None:
    return await pool.fetchrow(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1", job_id)


async def events(pool: asyncpg.Pool, job_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT at, from_state, to_state, attempt, node_id, reason FROM job_events"
        " WHERE job_id = $1 ORDER BY id",
        job_id,
    )


async def list_jobs(
    pool: asyncpg.Pool,
    *,
    user: str | None,
    state: str | None,
    queue: str | None,
    after_seq: int,
    limit: int,
) -> list[asyncpg.Record]:
    """Jobs in submission order, filtered; keyset-paginated by `seq`."""
    return await pool.fetch(
        f"""
        SELECT {JOB_COLUMNS} FROM jobs
        WHERE seq > $1
          AND ($2::text IS NULL OR user_name = $2)
          AND ($3::text IS NULL OR state = $3)
          AND ($4::text IS NULL OR queue = $4)
        ORDER BY seq LIMIT $5
        """,
        after_seq,
        user,
        state,
        queue,
        limit,
    )


_PENDING_COLUMNS = (
    "id, seq, user_name, name, queue, priority, kind, gpus, cpus, memory_mib,"
    " gpu_memory_mib, extract(epoch FROM submitted_at)::float8 AS submitted_s,"
    f" estimated_runtime_s, attained_gpu_s, pin_node_id, {_PLANNING_COLUMNS},"
    " spec->'inputs' AS inputs, prefetched_to,"
    " coalesce((spec->>'stay_guaranteed')::boolean, false) AS stay_guaranteed,"
    " coalesce(spec->>'kind', 'guaranteed') AS spec_kind, min_gpus, max_gpus,"
    " migrate_gpu_uuids, claimant"
)


async def pending(pool: asyncpg.Pool, limit: int) -> list[asyncpg.Record]:
    """The oldest `limit` pending jobs, and the claimants behind them (the GPUs on
    their way out are theirs, whatever requeued jobs came before), in submission order.
    Each part is read by its own partial index: no pass over the table's history."""
    return await pool.fetch(
        f"WITH head AS (SELECT {_PENDING_COLUMNS} FROM jobs"
        " WHERE state = 'pending' ORDER BY seq LIMIT $1)"
        " SELECT * FROM head UNION ALL"
        f" SELECT {_PENDING_COLUMNS} FROM jobs WHERE claimant AND state = 'pending'"
        " AND seq > (SELECT max(seq) FROM head)"
        " ORDER BY seq",
        limit,
    )


async def keep_claimants(pool: asyncpg.Pool, claimants: set[str]) -> list[str]:
    """Mark these pending jobs as the plan's claimants, in place of those marked before;
    the jobs whose mark changed. Only pending jobs: one placed, cancelled or ended since
    the plan waits for nothing now (a job's next placement clears its mark)."""
    rows = await pool.fetch(
        "UPDATE jobs SET claimant = NOT claimant"
        " WHERE state = 'pending' AND claimant <> (id = ANY($1::text[])) RETURNING id",
        list(claimants),
    )
    return [r["id"] for r in rows]


async def pending_by_queue(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT queue, count(*) AS n FROM jobs WHERE state = 'pending' GROUP BY queue"
    )
    return {r["queue"]: r["n"] for r in rows}


async def placed(pool: asyncpg.Pool, node_id: str | None = None) -> list[asyncpg.Record]:
    """Jobs holding resources, on one node or everywhere; on one node, a gang whose part
    there has not ended too. `parts`: a gang's parts as (node, GPUs), by rank; NULL for
    a job on one node."""
    return await pool.fetch(
        "SELECT id, user_name, name, queue, priority, kind, state, attempt, node_id, gpu_uuids,"
        " (SELECT jsonb_agg(jsonb_build_array(p.node_id, p.gpu_uuids) ORDER BY p.rank)"
        "  FROM job_parts p WHERE p.job_id = jobs.id AND p.attempt = jobs.attempt) AS parts,"
        " gpus, cpus, memory_mib, gpu_memory_mib, started_at, estimated_runtime_s, attained_gpu_s,"
        f" {_PLANNING_COLUMNS}, controls, paused_s, migrate_to, migrate_gpu_uuids, checkpointable,"
        " resize_to, min_gpus, max_gpus, (progress->>'step_wall_s')::float8 AS step_wall_s,"
        " step_alone_s,"
        " extract(epoch FROM progress_at)::float8 AS progress_s,"
        f" {_UTIL_ALONE} AS util_alone,"
        " extract(epoch FROM suspended_at)::float8 AS suspended_s,"
        " extract(epoch FROM resumed_at)::float8 AS resumed_s FROM jobs"
        " WHERE state = ANY($1::text[])"
        f" AND ($2::text IS NULL OR node_id = $2 OR {part_runs_on('$2', 'jobs')})",
        [s.value for s in HOLDS_RESOURCES],
        node_id,
    )


# Runs that ended this many half-lives ago weigh under 1/32 of their size: no longer read.
USAGE_HORIZON_HALF_LIVES = 5.0


async def decayed_usage(
    pool: asyncpg.Pool, half_life_s: float, horizon_half_lives: float = USAGE_HORIZON_HALF_LIVES
) -> list[asyncpg.Record]:
    """Decayed GPU-seconds per (queue, user): every run of every job, the running ones too.

    A run of `gpus` GPUs from `start` to `end` weighs
    gpus * h/ln2 * (0.5^((now-end)/h) - 0.5^((now-start)/h)), the integral of
    gpus * 0.5^((now-t)/h) over the run. Runs that ended more than `horizon_half_lives`
    half-lives ago are left out (they weigh under 1/32 of their size). Every attempt
    counts: `job_runs` holds one row per attempt that ran (a preempted or requeued run
    included), and the attempt running now is read from `jobs`.

    Time a run spent suspended is left out, as if it had come first: the run counts
    from `start + paused` (a suspended job's from `start + paused` to its suspension).
    Only when it was paused is approximated, never how long it ran; with turns far
    shorter than the half-life the difference is small.
    """
    return await pool.fetch(
        """
        WITH runs AS (
            SELECT queue, user_name, gpus,
                   started_at + make_interval(secs => paused_s) AS started_at, ended_at
            FROM job_runs
            WHERE ended_at > now() - make_interval(secs => $1::float8 * $2::float8)
            UNION ALL
            SELECT queue, user_name, gpus, started_at + make_interval(secs => paused_s),
                   coalesce(suspended_at, now())
            FROM jobs
            WHERE state = ANY($3::text[]) AND started_at IS NOT NULL
        ), ages AS (
            -- In half-lives, capped so that power() cannot underflow.
            SELECT queue, user_name, gpus,
                   least(greatest(extract(epoch FROM now() - ended_at)::float8, 0) / $1, 1000)
                     AS end_age,
                   least(greatest(extract(epoch FROM now() - started_at)::float8, 0) / $1, 1000)
                     AS start_age
            FROM runs
        )
        SELECT queue, user_name,
               sum(gpus * $1 / ln(2) * (power(0.5, end_age) - power(0.5, start_age))) AS gpu_s
        FROM ages GROUP BY queue, user_name
        """,
        half_life_s,
        horizon_half_lives,
        [s.value for s in HOLDS_RESOURCES],
    )


async def prune_runs(
    pool: asyncpg.Pool, half_life_s: float, horizon_half_lives: float = USAGE_HORIZON_HALF_LIVES
) -> int:
    """Delete the `job_runs` rows `decayed_usage` no longer reads; how many went."""
    status = await pool.execute(
        "DELETE FROM job_runs WHERE ended_at <= now() - make_interval(secs => $1::float8 * $2)",
        half_life_s,
        horizon_half_lives,
    )
    return int(status.split()[-1])


async def service_taken(pool: asyncpg.Pool, last: int = 10_000) -> list[asyncpg.Record]:
    """GPU-seconds of service: of the `last` jobs that ended (`finished` true; any end
    counts, since the policy wants to know when jobs leave), and so far of every job
    not ended that has run (the attempt running now included, its suspensions not), as
    rows (gpu_s, finished)."""
    return await pool.fetch(
        f"""
        (SELECT attained_gpu_s AS gpu_s, true AS finished FROM jobs
         WHERE finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT $1)
        UNION ALL
        SELECT attained_gpu_s + CASE WHEN state = ANY($2::text[]) AND started_at IS NOT NULL
                   THEN gpus * {_ran_s("jobs")} ELSE 0 END,
               false
        FROM jobs WHERE NOT (state = ANY($3::text[]))
          AND (attained_gpu_s > 0 OR started_at IS NOT NULL)
        """,
        last,
        [s.value for s in HOLDS_RESOURCES],
        [s.value for s in TERMINAL],
    )


async def mean_runtimes(
    pool: asyncpg.Pool, keys: list[tuple[str, str]], last: int = 20
) -> dict[tuple[str, str], float | None]:
    """Per (user, job name): the mean run time of the user's `last` succeeded jobs of that
    name (their latest attempt, start to end, its suspensions left out), or None when
    there are none."""
    if not keys:
        return {}
    rows = await pool.fetch(
        f"""
        SELECT k.user_name, k.name, (
            SELECT avg(r.run_s)::float8 FROM (
                SELECT {_finished_run_s("j")} AS run_s FROM jobs j
                WHERE j.state = 'succeeded' AND j.user_name = k.user_name AND j.name = k.name
                  AND j.started_at IS NOT NULL
                ORDER BY j.finished_at DESC LIMIT $3
            ) r
        ) AS mean_s
        FROM unnest($1::text[], $2::text[]) AS k(user_name, name)
        """,
        [u for u, _ in keys],
        [n for _, n in keys],
        last,
    )
    return {(r["user_name"], r["name"]): r["mean_s"] for r in rows}


@dataclass(frozen=True, slots=True)
class Moved:
    """The outcome of `transition`: `ok` if it moved; else `current` says where it is."""

    ok: bool
    current: JobState | None  # None: no such job
    attempt: int | None
    detail: str = ""
    previous: JobState | None = None  # where it moved from, when it moved


# Which columns a transition may set besides state; values are bound, never spliced.
_SETTABLE = {
    "node_id",
    "gpu_uuids",
    "exit_code",
    "exit_signal",
    "reason",
    "started_at",
    "finished_at",
    "checkpoint_path",
    "pin_node_id",
    "migrate_to",
    "migrate_gpu_uuids",
    "resize_to",
    "gpus",
}


async def transition(
    db: asyncpg.Pool | asyncpg.Connection,
    job_id: str,
    to: JobState,
    why: str,
    *,
    attempt: int | None = None,
    node_id: str | None = None,
    only_from: tuple[JobState, ...] | None = None,
    **sets: Any,
) -> Moved:
    """Move a job to `to` if the table allows it from its current state; `why` is logged.

    `node_id` names the node in the event (and, entering `assigned`, the placement).
    `attempt` (when given) must match the job's current attempt: reports about an
    earlier placement are stale. `only_from` narrows the table's sources (e.g. cancel
    only a pending job). Entering `assigned` starts a new attempt; entering `pending`
    releases the placement.
    """
    unknown = set(sets) - _SETTABLE
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    sources = [s.value for s in sources_of(to) if only_from is None or s in only_from]
    assignments = ["state = $2", "updated_at = now()"]
    params: list[Any] = [job_id, to.value, sources, attempt, why, node_id]
    if to is JobState.ASSIGNED:
        if node_id is None:
            raise ValueError("a placement needs its node_id")
        # A new attempt: a migration's pin is used up, the last attempt's controls and
        # suspensions gone.
        assignments += [
            "attempt = j.attempt + 1",
            "node_id = $6",
            "pin_node_id = NULL",
            "controls = NULL",
            "suspended_at = NULL",
            "resumed_at = NULL",
            "paused_s = 0",
            "checkpointable = NULL",
            "step_alone_s = NULL",
            "util_alone_at = NULL",
            "claimant = false",
        ]
    if to is not JobState.RUNNING:
        # A move under way ends with the run it was for: requeued to move (its caller
        # says where to), ended, lost or stopped, the job holds no GPUs to move to.
        moves = ("migrate_to", "migrate_gpu_uuids", "resize_to")
        assignments += [f"{c} = NULL" for c in moves if c not in sets]
    if to is JobState.PENDING:
        sets = {**sets, "node_id": None, "gpu_uuids": [], "started_at": None}
        if "gpus" not in sets:
            # Requeued, not to move: an elastic job may start on its most GPUs again.
            assignments.append("gpus = coalesce(j.max_gpus, j.gpus)")
    if to is JobState.RUNNING:
        assignments.append("started_at = now()")
    if to in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assignments.append("finished_at = now()")
    record_run = ""
    if to in _RUN_ENDS:
        # The attempt's run ends here (SET sees the row as it was, started_at included);
        # the time it spent suspended is not service.
        assignments.append(
            "attained_gpu_s = j.attained_gpu_s + CASE WHEN j.started_at IS NULL THEN 0"
            f" ELSE j.gpus * {_ran_s('j')} END"
        )
        # Its run alone ends too: the figure sampled last held until now.
        assignments.append(_FOLD_UTIL_ALONE)
        record_run = """, run AS (
            INSERT INTO job_runs (job_id, attempt, queue, user_name, gpus, started_at, ended_at,
                                  paused_s)
            SELECT old.id, old.attempt, old.queue, old.user_name, old.gpus, old.started_at, now(),
                   old.paused_s
                   + coalesce(extract(epoch FROM now() - old.suspended_at)::float8, 0)
            FROM old, moved WHERE old.started_at IS NOT NULL
            ON CONFLICT DO NOTHING
        )"""
    for column, value in sets.items():
        params.append(value)
        assignments.append(f"{column} = ${len(params)}")
    row = await db.fetchrow(
        f"""
        WITH old AS (
            SELECT id, state, attempt, node_id, started_at, queue, user_name, gpus, paused_s,
                   suspended_at
            FROM jobs WHERE id = $1 FOR UPDATE
        ), moved AS (
            UPDATE jobs j SET {", ".join(assignments)}
            FROM old
            WHERE j.id = old.id AND old.state = ANY($3::text[])
              AND ($4::int IS NULL OR old.attempt = $4)
            RETURNING old.state AS from_state, j.attempt, j.node_id
        ), ev AS (
            INSERT INTO job_events (job_id, from_state, to_state, attempt, node_id, reason)
            SELECT $1, from_state, $2, attempt, coalesce($6, node_id, (SELECT node_id FROM old)), $5
            FROM moved
        ){record_run}
        SELECT (SELECT state FROM old) AS current, (SELECT attempt FROM old) AS attempt,
               (SELECT from_state FROM moved) AS from_state,
               (SELECT attempt FROM moved) AS new_attempt
        """,
        *params,
    )
    assert row is not None
    if row["current"] is None:
        return Moved(False, None, None, "no such job")
    if row["from_state"] is not None:
        src = JobState(row["from_state"])
        log.info(
            "job transition",
            job_id=job_id,
            from_state=src.value,
            to_state=to.value,
            attempt=row["new_attempt"],
            reason=why,
        )
        return Moved(True, to, row["new_attempt"], previous=src)
    current = JobState(row["current"])
    if current is to and attempt in (None, row["attempt"]):
        # Already there: a repeated report (a reconnect's hello, a gang's later part's
        # start), which is no news to an operator.
        detail = f"already {to.value}"
        log.debug("job transition refused", job_id=job_id, to_state=to.value, detail=detail)
        return Moved(False, current, row["attempt"], detail)
    if attempt is not None and row["attempt"] != attempt:
        detail = f"stale report for attempt {attempt}; the job is at attempt {row['attempt']}"
    else:
        try:
            check_transition(current, to)
            detail = "moved by someone else first"
        except IllegalTransition as exc:
            detail = str(exc)
    log.info("job transition refused", job_id=job_id, to_state=to.value, detail=detail)
    return Moved(False, current, row["attempt"], detail)


async def note(
    pool: asyncpg.Pool,
    job_id: str,
    attempt: int,
    reason: str,
    states: tuple[JobState, ...] | None = None,
    **sets: Any,
) -> bool:
    """Add an event to the job's history that does not change its state (a control it
    acted on, say), and set columns with it; False if the job is at another attempt, or
    in none of `states` where they are given."""
    unknown = set(sets) - _NOTE_SETTABLE
    if unknown:
        raise ValueError(f"note cannot set {sorted(unknown)}")
    assignments = ["updated_at = updated_at"]
    params: list[Any] = [job_id, attempt, reason, [s.value for s in states or ()]]
    for column, value in sets.items():
        params.append(value)
        if column == "controls":  # merged: a concurrent change of another control stays
            assignments.append(f"controls = {_CONTROLS} || ${len(params)}::jsonb")
        else:
            assignments.append(f"{column} = ${len(params)}")
    return await _update_with_event(
        pool,
        f"""
        UPDATE jobs SET {", ".join(assignments)} WHERE id = $1 AND attempt = $2
            AND (cardinality($4::text[]) = 0 OR state = ANY($4::text[]))
        """,
        *params,
    )


async def _update_with_event(
    pool: asyncpg.Pool, update: str, job_id: str, attempt: int, reason: str, *params: Any
) -> bool:
    """`update`, an UPDATE of one job ($1 its id, $2 its attempt, $4 on `params`), and
    the event `reason` ($3) in the history of the job it hit, which keeps its state, in
    one statement: False where it hit none, and nothing changed."""
    row = await pool.fetchrow(
        f"""
        WITH hit AS ({update} RETURNING id, state, attempt, node_id)
        INSERT INTO job_events (job_id, from_state, to_state, attempt, node_id, reason)
        SELECT id, state, state, attempt, node_id, $3 FROM hit RETURNING id
        """,
        job_id,
        attempt,
        reason,
        *params,
    )
    return row is not None


async def set_suspended(
    pool: asyncpg.Pool,
    job_id: str,
    attempt: int,
    suspended: bool,
    controls: dict[str, Any],
    reason: str,
    *,
    sliced: bool = False,
    not_suspended: bool = False,
) -> bool:
    """Record a suspend (or a resume) of a running job and its event, in one statement:
    `controls` merged into the job's, and the suspension's clock: a suspend starts it (a
    repeated one keeps the first's start), a resume adds it to `paused_s` and is the
    job's new `resumed_at`. Only if the job is still running at that attempt, is
    time-sliced or not as `sliced` says, and (with `not_suspended`) is not suspended at
    all: False otherwise, and nothing changed."""
    return await _update_with_event(
        pool,
        f"""
        UPDATE jobs SET
            controls = {_CONTROLS} || $5::jsonb,
            paused_s = paused_s + CASE WHEN NOT $4 AND suspended_at IS NOT NULL
                THEN greatest(extract(epoch FROM now() - suspended_at)::float8, 0)
                ELSE 0 END,
            resumed_at = CASE WHEN NOT $4 AND suspended_at IS NOT NULL
                THEN now() ELSE resumed_at END,
            suspended_at = CASE WHEN $4 THEN coalesce(suspended_at, now()) END,
            {_FOLD_UTIL_ALONE}
        WHERE id = $1 AND attempt = $2 AND state = 'running'
          AND ({suspended_sql()} AND {flag_sql("time_sliced")}) = $6
          AND NOT ($7 AND suspended_at IS NOT NULL)
        """,
        job_id,
        attempt,
        reason,
        suspended,
        controls,
        sliced,
        not_suspended,
    )


# What a note may set: the job's controls, where its checkpoint is, where its inputs
# went, its kind (AntMan's guaranteed or opportunistic).
_NOTE_SETTABLE = {
    "controls",
    "checkpoint_path",
    "prefetched_to",
    "kind",
}


# How many of its progress reports alone a job's step time alone is the median of.
STEPS_ALONE_KEPT = 20


def flag_sql(flag: str, t: str | None = None) -> str:
    """SQL: the job's (of the row `t`, or the one updated) boolean control `flag` is set."""
    controls = "controls" if t is None else f"{t}.controls"
    return f"coalesce(({controls}->>'{flag}')::boolean, false)"


def suspended_sql(t: str | None = None) -> str:
    """SQL: the job (of the row `t`, or the one updated) is suspended."""
    return flag_sql("suspended", t)


def part_runs_on(node: str, t: str) -> str:
    """SQL: the job of the row `t` is a gang whose current attempt has a part running on
    the node `node` (an SQL expression: a parameter, say)."""
    return (
        f"EXISTS (SELECT 1 FROM job_parts p WHERE p.job_id = {t}.id"
        f" AND p.attempt = {t}.attempt AND p.node_id = {node} AND p.ended_at IS NULL)"
    )


def runs_beside(t: str, suspended_too: bool = False) -> str:
    """SQL: another job runs on one of the GPUs of the row `t` (its process is placed
    there and not suspended: a packed job, its partner, an opportunistic job, one that
    is starting or being stopped); `suspended_too`: or is suspended there, which keeps
    its tensors in GPU memory (a suspend frees only PyTorch's cache)."""
    awake = "" if suspended_too else f" AND NOT {suspended_sql('o')}"
    return (
        f"EXISTS (SELECT 1 FROM jobs o WHERE o.id <> {t}.id AND o.node_id = {t}.node_id"
        " AND o.state IN ('assigned', 'running', 'preempting', 'cancelling')"
        f"{awake} AND o.gpu_uuids && {t}.gpu_uuids)"
    )


async def record_progress(
    pool: asyncpg.Pool,
    job_id: str,
    attempt: int,
    progress: dict[str, Any],
    step_wall_s: float | None = None,
) -> bool:
    """The job's latest progress and when it came; not history (it would be one event a
    second). With `step_wall_s` (the report's mean step time) it reported mini-batches
    through its shim, which can then save a checkpoint on request (unless one already
    failed this attempt); that time is kept among the job's step times alone (the last
    `STEPS_ALONE_KEPT`) where no other job runs on its GPUs. True when this report is
    the one that made the job known to save checkpoints."""
    became = await pool.fetchval(
        f"""
        UPDATE jobs j SET progress = $3, progress_at = now(),
            checkpointable = CASE WHEN $4::float8 IS NOT NULL
                THEN coalesce(checkpointable, true) ELSE checkpointable END,
            step_alone_s = CASE
                WHEN $4::float8 IS NULL OR $4::float8 <= 0
                    OR {suspended_sql("j")}
                    OR {runs_beside("j")}
                THEN j.step_alone_s
                ELSE (array_append(coalesce(j.step_alone_s, '{{}}'), $4::float8))[
                    greatest(coalesce(cardinality(j.step_alone_s), 0) + 2 - $5, 1):]
                END
        FROM (SELECT checkpointable AS was FROM jobs WHERE id = $1) old
        WHERE j.id = $1 AND j.attempt = $2 AND j.state = 'running'
        RETURNING old.was IS NULL AND j.checkpointable IS TRUE
        """,
        job_id,
        attempt,
        progress,
        step_wall_s,
        STEPS_ALONE_KEPT,
    )
    return bool(became)


async def ask_move(
    pool: asyncpg.Pool,
    job_id: str,
    attempt: int,
    reason: str,
    node_id: str | None,
    gpu_uuids: list[str] | None,
    resize_to: int | None = None,
) -> bool:
    """Record that the running job is to move to `node_id` once it has saved a
    checkpoint (onto `gpu_uuids` there, which snapshots hold for it meanwhile; None: a
    user's migration, which names only the node), and, with `resize_to`, to restart on
    that many GPUs (a resize; `node_id` None: a user's, on any node), and its event, in
    one statement. Only if it still runs at that attempt and no move is under way:
    False otherwise, and nothing changed."""
    return await _update_with_event(
        pool,
        """
        UPDATE jobs SET migrate_to = $4, migrate_gpu_uuids = $5, resize_to = $6
        WHERE id = $1 AND attempt = $2 AND state = 'running' AND migrate_to IS NULL
          AND resize_to IS NULL
        """,
        job_id,
        attempt,
        reason,
        node_id,
        gpu_uuids,
        resize_to,
    )


async def hold_gpus(pool: asyncpg.Pool, job_id: str, attempt: int, reason: str) -> bool:
    """A packed job whose partner left becomes its GPUs' holder: no longer packed, its
    turn on them timed from now, with its event, in one statement. Only if it is still
    running and packed at that attempt: False otherwise, and nothing changed."""
    return await _update_with_event(
        pool,
        f"""
        UPDATE jobs SET controls = {_CONTROLS} || $4::jsonb, resumed_at = now(),
            util_alone_at = NULL
        WHERE id = $1 AND attempt = $2 AND state = 'running'
          AND {flag_sql("packed")}
          AND NOT {suspended_sql()}
        """,
        job_id,
        attempt,
        reason,
        {"packed": False, "packed_beside": None},
    )


async def call_off_move(
    pool: asyncpg.Pool,
    job_id: str,
    attempt: int,
    reason: str,
    *,
    checkpointable: bool | None = None,
    set_checkpointable: bool = False,
) -> bool:
    """The checkpoint a move waits for will not come (it failed, or was never sent):
    the move (a migration's target and GPUs, a resize) is dropped, with its event, in
    one statement, so that no snapshot holds GPUs for it; with `set_checkpointable`,
    `checkpointable` is recorded too. False if the job is at another attempt."""
    return await _update_with_event(
        pool,
        """
        UPDATE jobs SET migrate_to = NULL, migrate_gpu_uuids = NULL, resize_to = NULL,
            checkpointable = CASE WHEN $5 THEN $4 ELSE checkpointable END
        WHERE id = $1 AND attempt = $2
        """,
        job_id,
        attempt,
        reason,
        checkpointable,
        set_checkpointable,
    )


async def succeeded_mark(pool: asyncpg.Pool) -> tuple[int, str | None]:
    """How many jobs have succeeded and the latest of them: changes when one more does."""
    row = await pool.fetchrow(
        "SELECT count(*) AS n, (SELECT id FROM jobs WHERE state = 'succeeded'"
        " ORDER BY finished_at DESC LIMIT 1) AS latest FROM jobs WHERE state = 'succeeded'"
    )
    assert row is not None
    return row["n"], row["latest"]


async def finished_for_estimates(pool: asyncpg.Pool, last: int) -> list[asyncpg.Record]:
    """The last `last` succeeded jobs, with what they took, for the resource estimator."""
    return await pool.fetch(
        "SELECT id, user_name, name, queue, gpus, cpus, memory_mib, spec, attained_gpu_s,"
        " gpu_memory_peak_mib,"
        " gpu_util_samples, gpu_util_sum, gpu_util_sumsq,"
        f" {_finished_run_s('jobs')} AS wall_s"
        " FROM jobs WHERE state = 'succeeded' ORDER BY finished_at DESC LIMIT $1",
        last,
    )


async def decide_deadline(pool: asyncpg.Pool, job_id: str, admitted: bool, reason: str) -> bool:
    """Record the policy's answer on a job's deadline; False if the job is gone or ended."""
    done = await pool.execute(
        "UPDATE jobs SET deadline_admitted = $2, deadline_reason = $3"
        " WHERE id = $1 AND deadline IS NOT NULL AND NOT (state = ANY($4::text[]))",
        job_id,
        admitted,
        reason,
        [s.value for s in TERMINAL],
    )
    return bool(done != "UPDATE 0")


def spec_of(row: asyncpg.Record) -> JobSpec:
    return msgspec.convert(row["spec"], JobSpec)


def as_dict(row: asyncpg.Record) -> dict[str, Any]:
    """A job as the API shows it."""
    out: dict[str, Any] = {
        "id": row["id"],
        "name": row["name"],
        "user": row["user_name"],
        "queue": row["queue"],
        "priority": row["priority"],
        "kind": row["kind"],
        "state": row["state"],
        "attempt": row["attempt"],
        "spec": row["spec"],
        "placement": (
            {"node_id": row["node_id"], "gpu_uuids": list(row["gpu_uuids"])}
            if row["node_id"]
            else None
        ),
        "exit_code": row["exit_code"],
        "exit_signal": row["exit_signal"],
        "reason": row["reason"],
        "submitted_at": _iso(row["submitted_at"]),
        "started_at": _iso(row["started_at"]),
        "finished_at": _iso(row["finished_at"]),
        "attained_gpu_s": round(row["attained_gpu_s"], 3),
        "progress": row["progress"],
        "progress_at": _iso(row["progress_at"]),
        "controls": row["controls"],
        "checkpoint": row["checkpoint_path"],
    }
    # Suspended (time-sliced, or by a user): since when; the controls say by whom.
    if row["suspended_at"] is not None:
        out["suspended_at"] = _iso(row["suspended_at"])
    if row["resumed_at"] is not None:
        out["resumed_at"] = _iso(row["resumed_at"])
    if row["pin_node_id"] is not None:
        out["pinned_to"] = row["pin_node_id"]
    in_place = row["resize_to"] is not None and row["migrate_to"] == row["node_id"]
    if row["migrate_to"] is not None and not in_place:
        out["migrating_to"] = row["migrate_to"]
        if row.get("migrate_gpu_uuids"):  # the GPUs held for it there (a plan's move)
            out["migrating_to_gpus"] = list(row["migrate_gpu_uuids"])
    elif in_place and row.get("migrate_gpu_uuids"):  # a plan's resize where it runs
        out["resizing_to_gpus"] = list(row["migrate_gpu_uuids"])
    if row.get("checkpointable") is not None:
        out["checkpointable"] = row["checkpointable"]
    if row.get("prefetched_to") is not None:
        out["inputs_prefetched_to"] = row["prefetched_to"]
    if row["resize_to"] is not None:
        out["resizing_to"] = row["resize_to"]
    out["gpus"] = row["gpus"]  # the spec's, or what a resize or an elastic start made it
    if row.get("min_gpus") is not None:  # elastic: the least and most it may run on
        out["gpu_range"] = [row["min_gpus"], row["max_gpus"]]
    if row.get("util_alone") is not None:
        # How busy it kept its GPUs while it ran alone on them (packing reads it).
        out["utilization_alone_pct"] = round(row["util_alone"], 1)
    if row["deadline"] is not None:
        out["deadline"] = {
            "at": _iso(row["deadline"]),
            "guaranteed": row["deadline_admitted"],  # None: not decided yet
            "reason": row["deadline_reason"],
        }
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
