"""A figure read from the store for every cycle, served from memory between readings.

The first `get` waits for the query; after that the value in memory is returned at
once, and a reading older than `max_age_s` starts one background re-read, so that no
scheduling cycle waits for a slow aggregate. A failed re-read is logged and the old
value kept until the next try.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import asyncpg

from shared import logging
from shared.tasks import Supervisor

T = TypeVar("T")
log = logging.get("scheduler")


class CachedRead(Generic[T]):
    def __init__(
        self, name: str, read: Callable[[], Awaitable[T]], max_age_s: float, tasks: Supervisor
    ) -> None:
        self.name = name
        self._read = read
        self.max_age_s = max_age_s
        self._tasks = tasks
        self._value: tuple[float, T] | None = None
        self._refresh: asyncio.Task[None] | None = None

    async def get(self) -> T:
        if self._value is None:
            return await self._fetch()
        stale = time.monotonic() - self._value[0] >= self.max_age_s
        refreshing = self._refresh is not None and not self._refresh.done()
        if stale and not refreshing and not self._tasks.closing:
            self._refresh = self._tasks.spawn(self._background(), name=self.name)
        return self._value[1]

    async def _fetch(self) -> T:
        began = time.monotonic()
        value = await self._read()
        self._value = (began, value)
        return value

    async def _background(self) -> None:
        try:
            await self._fetch()
        except (asyncpg.PostgresError, OSError) as exc:
            log.warning(f"reading {self.name} failed", error=str(exc))
