"""The store on a real PostgreSQL: migrations, idempotent submission, conditional transitions."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from schedd.store import db, jobs
from shared.model import JobSpec, JobState
from tests.unit.recording_log import RecordingLog


def spec(name: str = "train", **kw: object) -> JobSpec:
    return JobSpec(name=name, command=["python3", "-c", "print(1)"], **kw)  # type: ignore[arg-type]


async def test_migrations_from_empty_create_every_table(pool: asyncpg.Pool) -> None:
    tables = {
        r["tablename"]
        for r in await pool.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
    }
    assert {"jobs", "job_events", "nodes", "gpus", "users", "tokens", "schema_migrations"} <= tables
    versions = [r["version"] for r in await pool.fetch("SELECT version FROM schema_migrations")]
    assert versions == [v for v, _, _ in db.migrations()]


async def test_migrations_run_once_under_concurrent_starters(schema_dsn: str) -> None:
    conns = [await asyncpg.connect(schema_dsn) for _ in range(4)]
    try:
        applied = await asyncio.gather(*(db.migrate(c) for c in conns))
        assert sorted(len(a) for a in applied) == [0, 0, 0, len(db.migrations())]
        assert await db.migrate(conns[0]) == []
    finally:
        for c in conns:
            await c.close()


async def test_a_connection_released_inside_a_transaction_comes_back_clean(
    pool: asyncpg.Pool,
) -> None:
    """The pool skips the default reset query; an open transaction must still be undone."""
    async with pool.acquire() as conn:
        await conn.execute("BEGIN")
        await conn.execute("INSERT INTO users (name) VALUES ('ghost')")
        pid = await conn.fetchval("SELECT pg_backend_pid()")
    for _ in range(pool.get_max_size()):  # find the same backend again
        async with pool.acquire() as conn:
            if await conn.fetchval("SELECT pg_backend_pid()") == pid:
                assert not conn.is_in_transaction()
                break
    else:
        pytest.fail("the released connection never came back")
    assert await pool.fetchval("SELECT count(*) FROM users WHERE name = 'ghost'") == 0


async def test_state_check_constraint_matches_the_transition_table(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    for state in JobState:
        await pool.execute("UPDATE jobs SET state = $2 WHERE id = $1", row["id"], state.value)
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("UPDATE jobs SET state = 'exploded' WHERE id = $1", row["id"])


async def test_submit_with_the_same_key_returns_the_same_job(pool: asyncpg.Pool) -> None:
    first, created = await jobs.submit(pool, "alice", spec(), "key-1")
    again, created_again = await jobs.submit(pool, "alice", spec(), "key-1")
    assert created and not created_again
    assert again["id"] == first["id"]
    # Keys are per user: bob's "key-1" is another job.
    bobs, bob_created = await jobs.submit(pool, "bob", spec(), "key-1")
    assert bob_created and bobs["id"] != first["id"]
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 2
    assert await pool.fetchval("SELECT count(*) FROM job_events") == 2


async def test_concurrent_retries_with_one_key_store_one_job(pool: asyncpg.Pool) -> None:
    results = await asyncio.gather(*(jobs.submit(pool, "alice", spec(), "k") for _ in range(20)))
    assert len({r["id"] for r, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 1


async def test_same_key_with_another_spec_is_a_conflict(pool: asyncpg.Pool) -> None:
    first, _ = await jobs.submit(pool, "alice", spec(), "k")
    with pytest.raises(jobs.IdempotencyConflict) as err:
        await jobs.submit(pool, "alice", spec(gpus=2), "k")
    assert err.value.job_id == first["id"]
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 1


async def test_concurrent_transitions_apply_once(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    outcomes = await asyncio.gather(
        *(
            jobs.transition(pool, row["id"], JobState.ASSIGNED, f"racer {i}", node_id=f"n{i}")
            for i in range(20)
        )
    )
    assert sum(o.ok for o in outcomes) == 1
    job = await jobs.get(pool, row["id"])
    assert job["state"] == "assigned" and job["attempt"] == 1
    events = await jobs.events(pool, row["id"])
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        (None, "pending"),
        ("pending", "assigned"),
    ]
    winner = next(o for o in outcomes if o.ok)
    assert winner.attempt == 1
    assert events[1]["node_id"] == job["node_id"]


async def test_illegal_transition_is_refused_and_changes_nothing(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    moved = await jobs.transition(pool, row["id"], JobState.SUCCEEDED, "nonsense")
    assert not moved.ok and moved.current is JobState.PENDING
    assert "illegal transition pending -> succeeded" in moved.detail
    assert (await jobs.get(pool, row["id"]))["state"] == "pending"
    assert len(await jobs.events(pool, row["id"])) == 1


async def test_a_repeated_transition_is_refused_as_no_news(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second report of a state the job is in (a reconnect's hello, a gang's later
    part) changes nothing and is logged below info; an illegal one is logged at info."""
    recorded = RecordingLog()
    monkeypatch.setattr(jobs, "log", recorded)
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    moved = await jobs.transition(pool, row["id"], JobState.PENDING, "again")
    assert not moved.ok and moved.current is JobState.PENDING and moved.detail == "already pending"
    assert len(await jobs.events(pool, row["id"])) == 1
    assert recorded.events("info") == [] and recorded.events("debug") == ["job transition refused"]
    await jobs.transition(pool, row["id"], JobState.SUCCEEDED, "nonsense")
    assert recorded.events("info") == ["job transition refused"]


async def test_report_about_an_earlier_attempt_is_stale(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    await jobs.transition(pool, row["id"], JobState.ASSIGNED, "placed", node_id="a")
    await jobs.transition(pool, row["id"], JobState.PENDING, "lost", attempt=1)
    await jobs.transition(pool, row["id"], JobState.ASSIGNED, "placed again", node_id="b")
    stale = await jobs.transition(pool, row["id"], JobState.RUNNING, "started", attempt=1)
    assert not stale.ok and "stale" in stale.detail
    fresh = await jobs.transition(pool, row["id"], JobState.RUNNING, "started", attempt=2)
    assert fresh.ok
    job = await jobs.get(pool, row["id"])
    assert (job["state"], job["attempt"], job["node_id"]) == ("running", 2, "b")


async def test_requeue_releases_the_placement(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    await jobs.transition(
        pool, row["id"], JobState.ASSIGNED, "placed", node_id="a", gpu_uuids=["g0"]
    )
    await jobs.transition(pool, row["id"], JobState.PENDING, "lost", attempt=1)
    job = await jobs.get(pool, row["id"])
    assert job["node_id"] is None and list(job["gpu_uuids"]) == []
    assert await jobs.placed(pool) == []


async def test_event_log_is_append_only(pool: asyncpg.Pool) -> None:
    row, _ = await jobs.submit(pool, "alice", spec(), None)
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute(
            "UPDATE job_events SET reason = 'rewritten' WHERE job_id = $1", row["id"]
        )
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("DELETE FROM job_events WHERE job_id = $1", row["id"])


async def test_the_pending_window_keeps_the_claimants_behind_it(pool: asyncpg.Pool) -> None:
    """A claimant is read for planning even when older jobs (requeued ones, say) fill
    the window before it: the GPUs on their way out are for it."""
    ids = [(await jobs.submit(pool, "alice", spec(f"j{i}"), None))[0]["id"] for i in range(5)]
    assert [r["id"] for r in await jobs.pending(pool, 2)] == ids[:2]
    await jobs.keep_claimants(pool, {ids[3], ids[0]})
    rows = await jobs.pending(pool, 2)
    assert [r["id"] for r in rows] == [ids[0], ids[1], ids[3]]
    assert [r["claimant"] for r in rows] == [True, False, True]
    # Once it is no longer pending, it is not read, marked or not.
    await pool.execute("UPDATE jobs SET state = 'cancelled' WHERE id = $1", ids[3])
    assert [r["id"] for r in await jobs.pending(pool, 2)] == ids[:2]
