"""Fixtures of the in-process tests: schedd's parts on a real database and server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.integration.inprocess import Schedd, start_schedd


@pytest.fixture
async def schedd(pool: asyncpg.Pool) -> AsyncIterator[Schedd]:
    """schedd with the default config (fifo); a test file needing another defines its own."""
    async with start_schedd(pool) as s:
        yield s
