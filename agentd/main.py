"""agentd: the node agent (GPU inventory and sampling, job runner, link to schedd)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import uvloop

from agentd import gpu
from agentd.link import Link
from agentd.runner import Runner
from shared import daemon, logging, systemd
from shared.config import AgentConfig
from shared.protocol import Inventory
from shared.tasks import Supervisor

log = logging.get("agentd")


def host_memory_mib() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def build_inventory(config: AgentConfig, backend: gpu.GpuBackend) -> Inventory:
    return Inventory(
        gpus=backend.inventory(),
        cpus=config.cpus or float(os.cpu_count() or 1),
        memory_mib=config.memory_mib or host_memory_mib(),
        labels=dict(config.labels),
        gpu_backend=backend.name,
    )


async def async_main(config: AgentConfig) -> None:
    supervisor = Supervisor()
    backend = await asyncio.to_thread(gpu.choose, config)
    inventory = build_inventory(config, backend)
    link = Link(config, inventory, backend, supervisor)
    runner = Runner(Path(config.state_dir), post=link.post)
    link.runner = runner
    runner.recover()
    supervisor.spawn(link.run(), name="link")
    supervisor.spawn(link.sample_gpus(), name="gpu-sampler")
    interval = systemd.watchdog_interval()
    if interval:
        supervisor.spawn(systemd.async_watchdog(interval), name="watchdog")
    systemd.notify("READY=1")
    log.info(
        "agentd ready",
        node_id=link.node_id,
        gpus=len(inventory.gpus),
        backend=backend.name,
        schedd=config.schedd_url,
        recovered_jobs=len(runner.jobs),
    )
    await daemon.stop_requested()
    # Jobs are left running: they belong to their launchers, and the next agent finds them.
    systemd.notify("STOPPING=1")
    await supervisor.close()
    runner.close()
    log.info("agentd stopped", jobs_left_running=sum(j.ended is None for j in runner.jobs.values()))


def main(argv: list[str] | None = None) -> None:
    config = daemon.config_from_argv("agentd", AgentConfig, argv, __doc__)
    try:
        uvloop.run(async_main(config))
    except gpu.GpuBackendError as exc:
        log.error("cannot start", error=str(exc))
        sys.exit(1)


if __name__ == "__main__":
    main()
