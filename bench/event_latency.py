"""Event latency of a real schedd: an agent's job_exited to the launch of the next job.

Starts schedd (log_level "warning") on a fresh database and submits --jobs + 1 one-GPU
jobs over HTTP. Then a fake agent, written here, connects to /v1/agents/ws with the join
token and speaks the real protocol (shared/protocol.py) over a real websocket: Hello with
an inventory of one GPU, Welcome back; then for every Launch it answers JobStarted,
lets the job "run" --run-ms, sends JobExited (exit code 0) and measures the time until
the next Launch arrives for the freed GPU. ExitAck messages are not needed by the
protocol here; the time to each one is recorded as the commit part of the latency.

    .venv/bin/python bench/event_latency.py [--jobs 1000] [--run-ms 5]
        [--dsn postgresql://127.0.0.1:5432/test]

Figures only: nothing here asserts on a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

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

from shared import protocol
from shared.protocol import (
    ExitAck,
    GpuInfo,
    Hello,
    Inventory,
    JobExited,
    JobStarted,
    Launch,
    Welcome,
)

SPEC = b'{"name":"b","command":["true"],"gpus":1}'
NODE_ID = "bench-node-0"
GPU_UUID = "GPU-bench-0000"
RECEIVE_TIMEOUT_S = 30.0


async def submit(schedd: Schedd, count: int, concurrency: int = 16) -> int:
    """Submit `count` jobs, the last one alone, and wait until the scheduler is idle.

    schedd publishes a connecting agent's link before it sends Welcome and reconciles the
    node's jobs, so a scheduling cycle in flight at that moment can send a Launch before
    the Welcome, or launch a job that the reconciliation then requeues as lost (and kills
    when the agent reports it started). To measure the steady state, not that race, the
    agent connects only once the cycle that saw the last job has finished.
    """
    headers = {"Authorization": f"Bearer {schedd.token}", "Content-Type": "application/json"}
    remaining = count - 1
    created = 0
    last_id = ""

    async def post(session: aiohttp.ClientSession) -> str:
        nonlocal created
        async with session.post(schedd.url + "/v1/jobs", data=SPEC, headers=headers) as resp:
            body = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"submit answered {resp.status}: {body}")
            created += 1
            return str(body["id"])

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await post(session)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        last_id = await post(session)
        started = time.monotonic()
        while True:
            async with session.get(f"{schedd.url}/v1/jobs/{last_id}", headers=headers) as resp:
                reason = (await resp.json()).get("pending_reason") or {}
            if reason.get("code") == "no_nodes":
                break
            # A scheduler that reads only part of the queue never considers the last job:
            # then wait for schedd to be idle instead.
            if time.monotonic() - started > 3 and await schedd_idle(schedd):
                break
            if time.monotonic() - started > 60:
                raise RuntimeError(f"the scheduler never considered job {last_id}: {reason}")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # a cycle woken during that one, if any, is over too
    return created


async def schedd_idle(schedd: Schedd, window_s: float = 0.3) -> bool:
    """Whether schedd's event loop used under 3% of a core over `window_s`."""
    schedd.cpu.start()
    await asyncio.sleep(window_s)
    running = schedd.cpu.stop().loop_running_pct
    return running is not None and running < 3


class FakeAgent:
    """One node with one GPU, speaking shared/protocol.py over the websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.acks: dict[tuple[str, int], float] = {}  # (job, attempt) -> perf_counter at arrival

    async def send(self, msg: protocol.Msg) -> None:
        await self.ws.send_bytes(protocol.encode(msg))

    async def receive(self) -> protocol.SchedMessage:
        msg = await self.ws.receive(timeout=RECEIVE_TIMEOUT_S)
        if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
            raise RuntimeError(f"websocket {msg.type.name}: {msg.data!r} {msg.extra!r}")
        return protocol.decode_from_sched(msg.data)

    async def next_launch(self) -> tuple[Launch, float]:
        """The next Launch and when it arrived; ExitAcks on the way are recorded, not answered."""
        while True:
            msg = await self.receive()
            now = time.perf_counter()
            if isinstance(msg, Launch):
                return msg, now
            if isinstance(msg, ExitAck):
                self.acks[(msg.job_id, msg.attempt)] = now
                continue
            raise RuntimeError(f"unexpected message from schedd: {msg!r}")

    async def wait_ack(self, job_id: str, attempt: int) -> float:
        while (job_id, attempt) not in self.acks:
            msg = await self.receive()
            if not isinstance(msg, ExitAck):
                raise RuntimeError(f"unexpected message from schedd: {msg!r}")
            self.acks[(msg.job_id, msg.attempt)] = time.perf_counter()
        return self.acks[(job_id, attempt)]


async def run_agent(schedd: Schedd, jobs: int, run_s: float) -> list[tuple[float, float]]:
    """(exit -> ack, exit -> next launch) in seconds, for each of `jobs` exits."""
    hello = Hello(
        protocol=protocol.PROTOCOL_VERSION,
        node_id=NODE_ID,
        inventory=Inventory(
            gpus=[GpuInfo(index=0, uuid=GPU_UUID, model="Bench-GPU", memory_mib=81920)],
            cpus=64.0,
            memory_mib=512 * 1024,
            gpu_backend="simulated",
        ),
    )
    samples: list[tuple[float, float]] = []
    headers = {"Authorization": f"Bearer {schedd.join_token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(schedd.ws_url, headers=headers) as ws,
    ):
        agent = FakeAgent(ws)
        await agent.send(hello)
        welcome = await agent.receive()
        if not isinstance(welcome, Welcome):
            raise RuntimeError(f"expected welcome, got {welcome!r}")
        launch, _ = await agent.next_launch()
        for i in range(jobs + 1):
            if launch.gpu_uuids != [GPU_UUID]:
                raise RuntimeError(f"launch on unexpected GPUs {launch.gpu_uuids}")
            await agent.send(
                JobStarted(job_id=launch.job_id, attempt=launch.attempt, pid=10_000 + i)
            )
            await asyncio.sleep(run_s)
            t0 = time.perf_counter()
            await agent.send(JobExited(job_id=launch.job_id, attempt=launch.attempt, exit_code=0))
            if i == jobs:
                await agent.wait_ack(launch.job_id, launch.attempt)
                break
            done = launch
            launch, t1 = await agent.next_launch()
            acked = agent.acks.pop((done.job_id, done.attempt), None)
            samples.append((acked - t0 if acked is not None else float("nan"), t1 - t0))
    return samples


def _ms(values: list[float], pct: float) -> str:
    return f"{percentile(values, pct) * 1000:.2f}"


async def bench(args: argparse.Namespace) -> int:
    install_sigterm(asyncio.current_task())  # type: ignore[arg-type]
    async with running_schedd(args.dsn) as schedd:
        print("event latency: agent's job_exited -> schedd's launch of the next job on that GPU")
        for line in conditions(schedd):
            print("  " + line)
        print(
            "  agent: fake agent in the benchmark process (not schedd's), aiohttp websocket, "
            f"1 node with 1 GPU; each job runs {args.run_ms:g} ms between JobStarted and JobExited"
        )
        t = time.perf_counter()
        created = await submit(schedd, args.jobs + 1)
        print(
            f"  pre-submitted {created} jobs over HTTP in {time.perf_counter() - t:.1f}s "
            f"(queue depth falls from {args.jobs} to 0 during the run)"
        )
        print()
        schedd.cpu.start()
        samples = await run_agent(schedd, args.jobs, args.run_ms / 1000)
        cpu = schedd.cpu.stop()
        to_launch = sorted(s[1] for s in samples)
        to_ack = sorted(s[0] for s in samples if s[0] == s[0])  # no NaN
        to_next = sorted(s[1] - s[0] for s in samples if s[0] == s[0])
        rows = [
            ["exit -> next launch (total)", *_stats(to_launch)],
            ["  exit -> ExitAck (exit committed)", *_stats(to_ack)],
            ["  ExitAck -> launch (schedule, commit, send)", *_stats(to_next)],
        ]
        print(table(["", "n", "p50 ms", "p99 ms", "max ms", "mean ms"], rows))
        print(by_depth(samples, args.jobs))
        slowest = sorted(range(len(samples)), key=lambda i: samples[i][1], reverse=True)[:10]
        print(
            "  the 10 slowest (ms @ pending jobs at the exit): "
            + ", ".join(f"{samples[i][1] * 1000:.1f} @ {args.jobs - i}" for i in slowest)
        )
        print(f"  during the {cpu.wall_s:.1f}s agent run: {cpu.describe()}")
        conn = await asyncpg.connect(schedd.db_dsn)
        try:
            succeeded = await conn.fetchval("SELECT count(*) FROM jobs WHERE state = 'succeeded'")
            total = await conn.fetchval("SELECT count(*) FROM jobs")
        finally:
            await conn.close()
        ok = succeeded == total == args.jobs + 1 and len(samples) == args.jobs
        print()
        print(
            f"check: {len(samples)} latencies measured, {succeeded} of {total} jobs succeeded: "
            + ("OK" if ok else "MISMATCH")
        )
        return 0 if ok else 1


def by_depth(samples: list[tuple[float, float]], jobs: int, parts: int = 10) -> str:
    """p50 of exit -> next launch for consecutive tenths of the run, i.e. by queue depth."""
    size = max(1, len(samples) // parts)
    cells = []
    for start in range(0, len(samples), size):
        chunk = sorted(s[1] for s in samples[start : start + size])
        cells.append(f"{jobs - start}: {_ms(chunk, 50)}")
    return "  p50 ms by pending jobs at the exit, each over the next " + (
        f"{size} exits:\n    " + ", ".join(cells)
    )


def _stats(values: list[float]) -> list[str]:
    mean = sum(values) / len(values) if values else float("nan")
    return [
        str(len(values)),
        _ms(values, 50),
        _ms(values, 99),
        f"{values[-1] * 1000:.2f}" if values else "nan",
        f"{mean * 1000:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="exits measured (jobs + 1 run)")
    parser.add_argument(
        "--run-ms", type=float, default=5.0, help="how long each fake job runs (default 5)"
    )
    parser.add_argument("--dsn", default=default_dsn(), help=dsn_help())
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        sys.exit(asyncio.run(bench(args)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; schedd stopped and its database removed", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
