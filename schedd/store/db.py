"""The asyncpg pool and the numbered SQL migrations, applied under an advisory lock."""

from __future__ import annotations

import re
from importlib import resources

import asyncpg
import orjson

from shared import logging

log = logging.get("store")

_MIGRATION = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """(version, file name, SQL) for every migration shipped with the package, in order."""
    found = []
    for entry in resources.files("schedd.store").joinpath("migrations").iterdir():
        m = _MIGRATION.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry.name, entry.read_text()))
    return sorted(found)


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply what is missing; concurrent starters wait on the lock, so each runs once."""
    applied_now: list[str] = []
    # One lock per schema, so separate schemas (tests) migrate independently.
    await conn.execute("SELECT pg_advisory_lock(hashtext('gpusched.migrate.' || current_schema()))")
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in migrations():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name
                )
            applied_now.append(name)
            log.info("migration applied", migration=name)
    finally:
        await conn.execute(
            "SELECT pg_advisory_unlock(hashtext('gpusched.migrate.' || current_schema()))"
        )
    return applied_now


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb",
        encoder=lambda v: orjson.dumps(v).decode(),
        decoder=orjson.loads,
        schema="pg_catalog",
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without the default reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET).

    asyncpg still rolls back an open transaction before calling this. Pooled connections
    hold no other session state: no LISTEN, SET, cursor or advisory lock (migrations run on
    their own connection). The default reset doubled the round trips of every statement.
    """


async def connect(dsn: str, size: int = 10) -> asyncpg.Pool:
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()  # also drops the advisory lock should the unlock have failed
    pool = await asyncpg.create_pool(
        dsn, min_size=min(2, size), max_size=size, init=_init_connection, reset=_keep_session
    )
    assert pool is not None
    return pool
