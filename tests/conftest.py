"""Shared fixtures: a real PostgreSQL for the whole run, a fresh schema for each test.

The server is the one named by GPUSCHED_DSN when set, else an embedded one started
once for the session in a temporary directory.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from schedd.store import db, embedded


def with_search_path(dsn: str, schema: str) -> str:
    """The DSN with `search_path` set (asyncpg passes unknown query keys to the server)."""
    parts = urlsplit(dsn)
    extra = urlencode({"search_path": schema})
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit(parts._replace(query=query))


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dsn = os.environ.get("GPUSCHED_DSN")
    if dsn:
        yield dsn
        return
    data_dir: Path = tmp_path_factory.mktemp("pg")
    os.chmod(data_dir, 0o755)
    pg = embedded.start(data_dir)
    try:
        yield pg.dsn
    finally:
        pg.stop(only_if_started_here=False)


@pytest.fixture
async def schema_dsn(server_dsn: str) -> AsyncIterator[str]:
    """A DSN whose search_path is a new, empty schema, dropped after the test."""
    schema = "t_" + secrets.token_hex(6)
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f"CREATE SCHEMA {schema}")
    finally:
        await conn.close()
    yield with_search_path(server_dsn, schema)
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
    finally:
        await conn.close()


@pytest.fixture
async def pool(schema_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await db.connect(schema_dsn, size=30)
    try:
        yield p
    finally:
        await p.close()
