"""Job submission throughput of a real schedd over HTTP.

Starts schedd (log_level "warning") on a fresh database, then for each concurrency level
submits --jobs jobs with POST /v1/jobs from C concurrent clients that share one aiohttp
ClientSession (keep-alive, C connections). The clients run in separate worker processes
(multiprocessing, spawn), not in schedd's process nor in this one. No agent is connected,
so every job stays pending; every level starts from an empty queue (the earlier levels'
jobs are marked cancelled in SQL), plus --prefill pending jobs put in with SQL. Prints,
per level: jobs, seconds, jobs/s, p50/p99 request latency and where the CPU went; then
checks that the jobs table holds a row for every 201 received.

    .venv/bin/python bench/submit_throughput.py [--jobs 2000] [--concurrency 1,16,64]
        [--dsn postgresql://127.0.0.1:5432/test] [--client-procs 1] [--prefill 0]

Figures only: nothing here asserts on a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import aiohttp
import asyncpg
from _harness import (
    Schedd,
    conditions,
    default_dsn,
    dsn_help,
    install_sigterm,
    percentile,
    running_schedd,
    table,
)

SPEC = b'{"name":"b","command":["true"],"gpus":1}'
WARMUP_JOBS = 200
CPU_GROUPS = ("schedd", "client", "postgres", "other")


@dataclass
class Share:
    """What one client process did."""

    created: int
    statuses: dict[int, int]
    errors: dict[str, int]
    latencies_s: list[float]
    started: float  # time.time() of its first request
    finished: float  # time.time() after its last response


async def _clients(url: str, token: str, jobs: int, concurrency: int, start_at: float) -> Share:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    latencies: list[float] = []
    remaining = jobs

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            try:
                async with session.post(url + "/v1/jobs", data=SPEC, headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
            except (aiohttp.ClientError, OSError) as exc:
                errors[type(exc).__name__] += 1
                continue
            latencies.append(time.perf_counter() - t0)

    async def connect(session: aiohttp.ClientSession) -> None:
        async with session.get(url + "/healthz") as resp:
            await resp.read()

    async with aiohttp.ClientSession(connector=connector) as session:
        # Open the connections before the clock starts: keep-alive is what is measured.
        await asyncio.gather(*(connect(session) for _ in range(concurrency)))
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        started = time.time()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        finished = time.time()
    return Share(statuses[201], dict(statuses), dict(errors), latencies, started, finished)


def client_process(url: str, token: str, jobs: int, concurrency: int, start_at: float) -> Share:
    """Entry point of a worker process: its share of the clients, on its own event loop."""
    return asyncio.run(_clients(url, token, jobs, concurrency, start_at))


def _pct(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "?"


def _ready(_: int) -> None:
    """A no-op that makes the pool start its worker processes."""


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def run_level(
    pool: ProcessPoolExecutor, url: str, token: str, jobs: int, concurrency: int, procs: int
) -> list[Share]:
    procs = max(1, min(procs, concurrency))
    loop = asyncio.get_running_loop()
    start_at = time.time() + 0.5  # every worker starts together, connections already open
    futures = [
        loop.run_in_executor(pool, client_process, url, token, n_jobs, n_clients, start_at)
        for n_jobs, n_clients in zip(_split(jobs, procs), _split(concurrency, procs), strict=True)
    ]
    return list(await asyncio.gather(*futures))


async def reset_queue(conn: asyncpg.Connection, prefill: int) -> int:
    """Start a level from the same queue: earlier pending jobs out of the way, `prefill` in.

    Done in the database, behind schedd's back: schedd keeps no job in memory (each
    scheduling cycle reads the queue), and the schema is thrown away afterwards.
    """
    await conn.execute(
        "UPDATE jobs SET state = 'cancelled', reason = 'benchmark: queue cleared',"
        " finished_at = now(), updated_at = now() WHERE state = 'pending'"
    )
    if prefill:
        await conn.execute(
            "INSERT INTO jobs (id, user_name, name, queue, priority, kind, spec, state,"
            " gpus, cpus, memory_mib)"
            " SELECT 'j-prefill-' || md5(random()::text || g), 'bench', 'b', 'default', 0,"
            ' \'guaranteed\', \'{"name": "b", "command": ["true"]}\'::jsonb, \'pending\','
            " 1, 1.0, 1024 FROM generate_series(1, $1) AS g",
            prefill,
        )
    await conn.execute("VACUUM ANALYZE jobs")
    return prefill


async def bench(args: argparse.Namespace) -> int:
    install_sigterm(asyncio.current_task())  # type: ignore[arg-type]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.client_procs), mp_context=ctx) as pool:
        # Start the workers (imports) before schedd, so that it is not timed.
        list(pool.map(_ready, range(args.client_procs)))
        async with running_schedd(args.dsn) as schedd:
            conn = await asyncpg.connect(schedd.db_dsn)
            try:
                return await _levels(args, levels, pool, schedd, conn)
            finally:
                await conn.close()


async def _levels(
    args: argparse.Namespace,
    levels: list[int],
    pool: ProcessPoolExecutor,
    schedd: Schedd,
    conn: asyncpg.Connection,
) -> int:
    print("submit throughput: POST /v1/jobs", SPEC.decode())
    for line in conditions(schedd):
        print("  " + line)
    print(
        f"  client: {args.client_procs} separate process(es) (multiprocessing, spawn), one "
        "aiohttp ClientSession each, keep-alive,\n"
        "  one connection per concurrent client, on the same machine"
    )
    print(
        "  no agent connected: jobs stay pending; each submit wakes the scheduler,\n"
        "  whose cycle reads no queue while no node is connected.\n"
        "  Each level starts with the queue cleared"
        + (f" and {args.prefill} pending jobs put in it directly" if args.prefill else "")
        + f"; it holds up to {args.prefill + args.jobs} by the end."
    )
    print(f"  warm-up: {WARMUP_JOBS} jobs at concurrency 16, not counted below")
    print()
    warm = await run_level(pool, schedd.url, schedd.token, WARMUP_JOBS, 16, 1)
    created = sum(s.created for s in warm)
    prefilled = 0
    rows = []
    trouble: list[str] = []
    for c in levels:
        prefilled += await reset_queue(conn, args.prefill)
        schedd.cpu.start()
        shares = await run_level(pool, schedd.url, schedd.token, args.jobs, c, args.client_procs)
        cpu = schedd.cpu.stop()
        ok = sum(s.created for s in shares)
        created += ok
        seconds = max(s.finished for s in shares) - min(s.started for s in shares)
        lat = sorted(x for s in shares for x in s.latencies_s)
        statuses: Counter[int] = Counter()
        errors: Counter[str] = Counter()
        for s in shares:
            statuses.update(s.statuses)
            errors.update(s.errors)
        if set(statuses) - {201} or errors:
            trouble.append(f"c={c}: statuses {dict(statuses)}, errors {dict(errors)}")
        rows.append(
            [
                str(c),
                str(ok),
                f"{seconds:.2f}",
                f"{ok / seconds:.0f}",
                f"{percentile(lat, 50) * 1000:.2f}",
                f"{percentile(lat, 99) * 1000:.2f}",
                *(f"{cpu.groups[g]:.0f}" if cpu.groups else "?" for g in CPU_GROUPS),
                _pct(cpu.steal_pct),
                _pct(cpu.machine_pct),
                _pct(cpu.loop_running_pct),
                _pct(cpu.loop_waiting_pct),
            ]
        )
    header = ["clients", "jobs", "seconds", "jobs/s", "p50 ms", "p99 ms"]
    cpu_header = [f"{g} cpu%" for g in CPU_GROUPS]
    extra = ["steal%", "machine%", "loop run%", "loop wait%"]
    print(table([*header, *cpu_header, *extra], rows))
    print(
        "  cpu%: % of one core used while the level ran, by schedd, by the client\n"
        "  processes, by every postgres process, and by everything else on the machine;\n"
        "  steal%: % of one core the hypervisor gave to other guests (this machine is a VM);\n"
        f"  machine%: % of all {os.cpu_count()} cores busy; loop run% / loop wait%: share of\n"
        "  the time schedd's event-loop thread was on a core / runnable but waiting for one"
    )
    for line in trouble:
        print("  non-201 answers: " + line)
    in_table = await conn.fetchval("SELECT count(*) FROM jobs")
    expected = created + prefilled
    verdict = "OK" if in_table == expected else "MISMATCH"
    print()
    print(
        f"check: {created} answers 201 (warm-up included) + {prefilled} put in directly = "
        f"{expected}; {in_table} rows in jobs: {verdict}"
    )
    return 0 if verdict == "OK" and not trouble else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per concurrency level")
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated client counts")
    parser.add_argument("--dsn", default=default_dsn(), help=dsn_help())
    parser.add_argument(
        "--client-procs", type=int, default=1, help="client worker processes (default 1)"
    )
    parser.add_argument(
        "--prefill",
        type=int,
        default=0,
        help="pending jobs put in the queue (in SQL) before each level, to see queue depth",
    )
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(bench(args)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; schedd stopped and its database removed", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
