"""schedd: the scheduler daemon (HTTP API, agent hub, scheduler loop)."""

from __future__ import annotations

import asyncio
import gc
import sys

import uvloop
from aiohttp import web

from schedd import policy_config
from schedd.api import Api, build_app
from schedd.executor import Executor
from schedd.hub import Hub
from schedd.scheduler import Scheduler
from schedd.store import db, embedded
from shared import daemon, logging, systemd
from shared.config import ConfigError, SchedConfig
from shared.tasks import Supervisor

log = logging.get("schedd")


async def async_main(config: SchedConfig) -> None:
    supervisor = Supervisor()
    dsn = config.resolved_dsn()
    pg: embedded.EmbeddedPostgres | None = None
    if dsn is None:
        pg = await asyncio.to_thread(embedded.start, config.data_dir)
        dsn = pg.dsn
    pool = await db.connect(dsn, config.db_pool_size)
    try:
        hub = Hub(pool, config, supervisor)
        await hub.recall()
        executor = Executor(pool, hub, config)
        scheduler = Scheduler(pool, hub, executor, config)
        hub.wake = scheduler.wake
        hub.gpus_sampled = scheduler.gpus_sampled
        hub.job_started = scheduler.job_started

        app = build_app(Api(pool, hub, scheduler, executor), config.max_body_bytes)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, config.listen_host, config.listen_port)
        await site.start()
        supervisor.spawn(scheduler.run(), name="scheduler")
        scheduler.wake()
        interval = systemd.watchdog_interval()
        if interval:
            supervisor.spawn(systemd.async_watchdog(interval), name="watchdog")
        # What start-up built lives for the whole run: keep full collections from walking it
        # again and again (they paused the loop ~20 ms each, as the heap grew, in benchmarks).
        gc.freeze()
        systemd.notify("READY=1")
        log.info(
            "schedd ready",
            listen=f"{config.listen_host}:{config.listen_port}",
            policy=config.policy,
            queues=sorted(config.queues),
            database="embedded" if pg else "external",
        )

        await daemon.stop_requested()

        systemd.notify("STOPPING=1")
        log.info("schedd stopping")
        await hub.close()
        await supervisor.close()
        await runner.cleanup()
    finally:
        await pool.close()
        if pg is not None:
            await asyncio.to_thread(pg.stop, False)
    log.info("schedd stopped")


def main(argv: list[str] | None = None) -> None:
    config = daemon.config_from_argv("schedd", SchedConfig, argv, __doc__)
    try:
        profile = policy_config.active_profile(config)
    except ConfigError as exc:
        print(f"schedd: config: {exc}", file=sys.stderr)
        sys.exit(2)
    if profile.estimates == "oracle":
        log.warning(
            "this profile asks for true run times, which only a simulator knows; the live"
            " scheduler uses each spec's estimated_runtime_s, else the user's history",
            policy=profile.name,
        )
    try:
        uvloop.run(async_main(config))
    except embedded.EmbeddedPostgresError as exc:
        log.error("cannot start the embedded database", error=str(exc))
        sys.exit(2)


if __name__ == "__main__":
    main()
