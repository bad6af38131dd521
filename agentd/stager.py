"""The node's data stager: Liquid's pre-scheduled data transfer.

`prefetch` starts copying a job's inputs into the node's cache before the job is due;
`stage` (before the launch) waits for the same work and returns the inputs' local paths;
`release` (when the job ends) lets them be evicted again. An input is an absolute local
path, a `file://` URL (a file or a directory tree) or an `http(s)://` URL
(`agentd.stage_sources`); the cache on disk is `agentd.stage_cache`.

Identical inputs share one transfer while it runs and one cache entry afterwards: an http
input is keyed by its normalised URL, a local one by its real path and a fingerprint of
its size and modification times, so a changed source is copied again. Entries used by a
job are pinned and never evicted; when the pinned entries leave no room, staging fails at
once with "cache full" instead of waiting, since the wait could last as long as another
job's training and would hold a GPU idle without saying why.

Cached inputs are shared between jobs: jobs must treat them as read-only.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from agentd.accounts import Account, may_not_read
from agentd.stage_cache import CacheFull, StageCache
from agentd.stage_sources import (
    Source,
    StageError,
    copy_local,
    download,
    fingerprint,
    os_reason,
    parse_input,
)
from shared import logging

__all__ = ["StageError", "StageProgress", "Stager"]

log = logging.get("stager")

# Whose rights the copies of a job's local inputs are judged by (`Stager.stage`).
Reader = Account | str | None


@dataclass(frozen=True)
class StageProgress:
    """One input of one job. The last report of each input has `done` set, and `error`
    (the reason) when it failed."""

    job_key: str
    input: str
    bytes_done: int
    bytes_total: int | None
    done: bool
    error: str | None = None


@dataclass(eq=False)
class _Transfer:
    """The one copy of one input in progress, shared by every job that asked for it."""

    key: str
    source: Source
    origin: str  # the real path or URL: a newer version of it supersedes the entry
    bytes_total: int | None
    bytes_done: int = 0
    reserved: int = 0
    stop: bool = False  # read by a copy thread: the transfer was cancelled
    jobs: dict[str, str] = field(default_factory=dict)  # job key -> the input as it wrote it
    waiters: int = 0
    task: asyncio.Task[Path] | None = None
    last_report: float = float("-inf")
    last_tenth: int = -1

    def fail(self, reason: str) -> StageError:
        return StageError(self.source.raw, reason)


@dataclass(eq=False)
class _JobRun:
    inputs: tuple[str, ...]
    task: asyncio.Task[list[Path]]


class Stager:
    def __init__(
        self,
        cache_dir: Path,
        max_bytes: int,
        on_progress: Callable[[StageProgress], None] | None = None,
        *,
        http_timeout_s: float = 3600.0,
        progress_interval_s: float = 0.5,
    ) -> None:
        self.cache = StageCache(cache_dir, max_bytes)
        self._on_progress = on_progress
        self._http_timeout_s = http_timeout_s
        self._interval = progress_interval_s
        self._loaded = False
        self._load_lock = asyncio.Lock()
        self._index_lock = asyncio.Lock()
        self._save_pending = False
        self._session: aiohttp.ClientSession | None = None
        self._inflight: dict[str, _Transfer] = {}
        self._jobs: dict[str, list[_JobRun]] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Finds the cache's entries again and deletes a crash's leftovers. `stage` and
        `prefetch` do it first if it was not called."""
        async with self._load_lock:
            if not self._loaded:
                report = await asyncio.to_thread(self.cache.load)
                self._loaded = True
                log.info("stage cache opened", path=str(self.cache.root), **asdict(report))

    async def stage(self, job_key: str, inputs: list[str], reader: Reader = None) -> list[Path]:
        """The local path of each input, in order, once all are in the cache and pinned
        for the job. Awaits a `prefetch` of the same inputs; retries a failed one.
        `reader`: the account the job runs as, which must be able to read each local
        input itself (the copy is agentd's, in a cache open to all), or why it has none
        (every input is refused); None: any input."""
        run = self._run(job_key, tuple(inputs), reader)
        try:
            return list(await asyncio.shield(run.task))
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            raise StageError("", "staging stopped: the job was released") from None

    def prefetch(self, job_key: str, inputs: list[str], reader: Reader = None) -> None:
        """Starts staging without waiting; progress goes to `on_progress`."""
        self._run(job_key, tuple(inputs), reader)

    def release(self, job_key: str) -> None:
        """The job no longer needs its inputs: they may be evicted, its staging stops."""
        for run in self._jobs.pop(job_key, []):
            run.task.cancel()
        if self.cache.unpin(job_key):
            self._save_soon()

    def pinned_jobs(self) -> set[str]:
        """The jobs holding inputs, also those found again after a restart."""
        return set(self.cache.pins)

    async def close(self) -> None:
        tasks: list[asyncio.Task[Any]] = [r.task for runs in self._jobs.values() for r in runs]
        tasks += [t.task for t in self._inflight.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # -- one job --

    def _run(self, job_key: str, inputs: tuple[str, ...], reader: Reader) -> _JobRun:
        runs = self._jobs.setdefault(job_key, [])
        runs[:] = [r for r in runs if not _failed(r.task)]
        for run in runs:
            if run.inputs == inputs:
                return run
        task = asyncio.create_task(
            self._stage_job(job_key, inputs, reader), name=f"stage {job_key}"
        )
        task.add_done_callback(_retrieve)
        runs.append(_JobRun(inputs, task))
        return runs[-1]

    async def _stage_job(self, job_key: str, inputs: tuple[str, ...], reader: Reader) -> list[Path]:
        await self.start()
        tasks: list[asyncio.Task[Path]] = []
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(self._stage_input(job_key, raw, reader)) for raw in inputs
                ]
        except ExceptionGroup:
            # The first failure in the job's own order, not in the order they happened.
            failures = [t.exception() for t in tasks if t.done() and not t.cancelled()]
            error = next(e for e in failures if e is not None)
            log.warning("staging failed", job_key=job_key, error=str(error))
            raise error from None
        log.info("inputs staged", job_key=job_key, inputs=len(inputs))
        return [t.result() for t in tasks]

    async def _stage_input(self, job_key: str, raw: str, reader: Reader) -> Path:
        transfer: _Transfer | None = None
        try:
            source = parse_input(raw)
            if isinstance(reader, str):
                raise StageError(raw, reader)
            if reader is not None and source.path is not None:
                closed = await asyncio.to_thread(may_not_read, reader, source.path)
                if closed is not None:
                    raise StageError(raw, f"user {reader.name!r} may not read {str(closed)!r}")
            key, origin, size = await self._identify(source)
            if job_key not in self._jobs:
                raise StageError(raw, "the job was released")  # and its pins dropped
            self.cache.pin(job_key, key)
            entry = self.cache.get(key)
            if entry is not None:
                self.cache.touch(key)
                self._save_soon()
                path, size = self.cache.path(entry), entry.size
            else:
                transfer = self._inflight.get(key) or self._start(key, source, origin, size)
                path = await self._wait(transfer, job_key, raw)
                size = transfer.bytes_done
        except StageError as exc:
            done = transfer.bytes_done if transfer else 0
            total = transfer.bytes_total if transfer else None
            self._emit(StageProgress(job_key, raw, done, total, True, exc.reason))
            raise StageError(raw, exc.reason) from None
        except Exception as exc:  # the cache's own files, or a bug: the job still fails cleanly
            reason = os_reason(exc) if isinstance(exc, OSError) else f"internal error: {exc!r}"
            if not isinstance(exc, OSError):
                log.exception("staging broke", job_key=job_key, input=raw)
            self._emit(StageProgress(job_key, raw, 0, None, True, reason))
            raise StageError(raw, reason) from None
        self._emit(StageProgress(job_key, raw, size, size, True))
        return path

    async def _identify(self, source: Source) -> tuple[str, str, int | None]:
        if source.url is not None:
            return f"url:{source.url}", source.url, None
        assert source.path is not None
        try:
            return await asyncio.to_thread(fingerprint, source.path)
        except OSError as exc:
            raise StageError(source.raw, os_reason(exc)) from None

    async def _wait(self, transfer: _Transfer, job_key: str, raw: str) -> Path:
        assert transfer.task is not None
        transfer.jobs[job_key] = raw
        transfer.waiters += 1
        self._emit(_progress(transfer, job_key, raw))
        try:
            return await asyncio.shield(transfer.task)
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            raise transfer.fail("transfer stopped") from None
        finally:
            transfer.waiters -= 1
            transfer.jobs.pop(job_key, None)
            if transfer.waiters == 0 and not transfer.task.done():
                # No job wants it any more (all were released): stop the copy.
                log.info("transfer no longer wanted", input=transfer.source.raw)
                self._forget(transfer)
                transfer.task.cancel()

    # -- one transfer --

    def _start(self, key: str, source: Source, origin: str, size: int | None) -> _Transfer:
        transfer = _Transfer(key, source, origin, size)
        transfer.task = asyncio.create_task(self._transfer(transfer), name=f"transfer {key}")
        transfer.task.add_done_callback(_retrieve)
        self._inflight[key] = transfer
        return transfer

    def _forget(self, transfer: _Transfer) -> None:
        if self._inflight.get(transfer.key) is transfer:
            del self._inflight[transfer.key]

    async def _transfer(self, t: _Transfer) -> Path:
        built = self.cache.temp_dir(t.key)
        staged: Path | None = built  # deleted at the end unless it became the entry
        try:
            await asyncio.to_thread(built.mkdir, parents=True)
            log.info("staging input", input=t.source.raw, bytes_total=t.bytes_total)
            if t.source.url is not None:
                await self._download(t, built / t.source.item)
            else:
                await self._copy(t, built / t.source.item)
            self.cache.unreserve(t.reserved)
            t.reserved = 0
            trash = self.cache.commit(t.key, built, t.source.item, t.bytes_done, t.origin)
            staged = None
            self._delete_soon(trash)
            self._save_soon()
            log.info("input staged", input=t.source.raw, bytes=t.bytes_done)
            entry = self.cache.get(t.key)
            assert entry is not None
            return self.cache.path(entry)
        except OSError as exc:
            raise t.fail(os_reason(exc)) from None
        finally:
            self.cache.unreserve(t.reserved)
            t.reserved = 0
            self._forget(t)
            if staged is not None:
                self._delete_soon([staged])

    def _make_room(self, t: _Transfer, n: int, total: int) -> None:
        """Reserves n more bytes for a transfer that reaches `total` bytes with them."""
        if total > self.cache.max_bytes:
            size = f"{total} >" if t.bytes_total is not None else "more than"
            raise t.fail(f"larger than the whole cache ({size} {self.cache.max_bytes} bytes)")
        try:
            trash = self.cache.reserve(n)
        except CacheFull as exc:
            raise t.fail(str(exc)) from None
        t.reserved += n
        if trash:
            log.info("evicted to make room", entries=len(trash), input=t.source.raw)
            self._delete_soon(trash)
            self._save_soon()

    async def _copy(self, t: _Transfer, dest: Path) -> None:
        assert t.source.path is not None and t.bytes_total is not None
        self._make_room(t, t.bytes_total, t.bytes_total)
        copy = functools.partial(copy_local, t.source.path, dest, t.key, t)
        copying = asyncio.ensure_future(asyncio.to_thread(copy))
        copying.add_done_callback(_retrieve)
        try:
            while not copying.done():
                await asyncio.wait({copying}, timeout=self._interval)
                self._progress(t)
        except asyncio.CancelledError:
            t.stop = True  # and wait, so the temp directory is not deleted under the thread
            await asyncio.wait({copying})
            raise
        copying.result()

    async def _download(self, t: _Transfer, dest: Path) -> None:
        assert t.source.url is not None
        await download(
            self._http(),
            t.source.url,
            dest,
            t,
            timeout_s=self._http_timeout_s,
            make_room=functools.partial(self._make_room, t),
            progress=functools.partial(self._progress, t),
        )

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        return self._session

    # -- reports and background work --

    def _progress(self, t: _Transfer) -> None:
        """Reports at most every `progress_interval_s`, or when another tenth is done."""
        now = asyncio.get_running_loop().time()
        tenth = 10 * t.bytes_done // t.bytes_total if t.bytes_total else -1
        if now - t.last_report < self._interval and tenth == t.last_tenth:
            return
        t.last_report, t.last_tenth = now, tenth
        for job_key, raw in list(t.jobs.items()):
            self._emit(_progress(t, job_key, raw))

    def _emit(self, report: StageProgress) -> None:
        if self._on_progress is None:
            return
        try:
            self._on_progress(report)
        except Exception:
            log.exception("progress callback failed", job_key=report.job_key)

    def _save_soon(self) -> None:
        """Writes the index in the background; changes made meanwhile join that write."""
        if not self._save_pending:
            self._save_pending = True
            self._spawn(self._save())

    async def _save(self) -> None:
        async with self._index_lock:
            self._save_pending = False
            data = self.cache.index_bytes()
            try:
                await asyncio.to_thread(self.cache.write_index, data)
            except OSError as exc:
                log.error("cannot write the stage cache index", error=str(exc))

    def _delete_soon(self, paths: list[Path]) -> None:
        if paths:
            self._spawn(asyncio.to_thread(self.cache.delete_trees, paths))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _progress(t: _Transfer, job_key: str, raw: str) -> StageProgress:
    return StageProgress(job_key, raw, t.bytes_done, t.bytes_total, False)


def _failed(task: asyncio.Task[Any]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Marks a failure as seen: a prefetch nobody awaits reports through on_progress.
    if not task.cancelled():
        task.exception()
