"""agentd: the node agent (GPU inventory and sampling, job runner, link to schedd)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import msgspec
import uvloop

from agentd import gpu, gpu_events
from agentd.accounts import closed_to_others
from agentd.coordination import Coordination
from agentd.coordinator import CoordinatorSettings
from agentd.job_controls import JobControls
from agentd.job_observers import JobObservers
from agentd.link import Link, inputs_staged
from agentd.runner import Runner
from agentd.shim_server import ShimServer
from agentd.simulated_usage import SimulatedUsage
from agentd.stager import StageProgress, Stager
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
        address=config.advertise_address or None,
        coordinator=config.coordinator.enabled,
    )


# The longest socket name a job gets: "<job id>.<attempt>.sock" (ids are j- and 16 hex).
LONGEST_SOCKET_NAME = len("j-0123456789abcdef.999999.sock")
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL


class ConfigProblem(Exception):
    pass


def check_socket_dir(config: AgentConfig) -> Path:
    path = config.resolved_shim_socket_dir().absolute()
    if len(str(path).encode()) + 1 + LONGEST_SOCKET_NAME > SOCKET_PATH_MAX:
        raise ConfigProblem(
            f"shim_socket_dir: {str(path)!r} is too long for Unix sockets of jobs in it"
            f" (at most {SOCKET_PATH_MAX - 1 - LONGEST_SOCKET_NAME} bytes); set a shorter"
            " one, e.g. /run/gpusched-agent"
        )
    return path


def check_run_as_owner(config: AgentConfig, euid: int) -> None:
    """With `run_jobs_as = "owner"`: agentd can take other users' ids, and a job running
    as its owner can reach its shim socket, its checkpoints and its staged inputs."""
    if config.run_jobs_as != "owner":
        return
    if euid != 0:
        raise ConfigProblem(
            'run_jobs_as = "owner" needs agentd to run as root, to start jobs as their users'
        )
    dirs = {
        "shim_socket_dir": config.resolved_shim_socket_dir(),
        "checkpoint_root": config.resolved_checkpoint_root(),
        "stage_cache_dir": config.resolved_stage_cache_dir(),
    }
    for name, path in dirs.items():
        closed = closed_to_others(path)
        if closed is not None:
            mode = closed.stat().st_mode & 0o777
            raise ConfigProblem(
                f'{name}: jobs running as their owners (run_jobs_as = "owner") cannot reach'
                f" {str(path)!r}: {str(closed)!r} is mode {mode:04o}, closed to other users;"
                " set it to a path they can pass through (e.g. under /run/gpusched-agent or"
                " /srv), or open that directory"
            )


def coordination(
    config: AgentConfig, inventory: Inventory, shims: ShimServer, link: Link
) -> Coordination:
    given = msgspec.structs.asdict(config.coordinator)
    fields = {k: v for k, v in given.items() if k != "enabled" and v is not None}
    try:
        settings = CoordinatorSettings(**fields)
    except ValueError as exc:
        raise ConfigProblem(f"coordinator: {exc}") from None
    memory = {g.uuid: g.memory_mib for g in inventory.gpus}
    clock = asyncio.get_running_loop().time
    return Coordination(shims, link.post, memory, settings, clock=clock)


async def async_main(config: AgentConfig) -> None:
    supervisor = Supervisor()
    socket_dir = check_socket_dir(config)
    check_run_as_owner(config, os.geteuid())
    backend = await asyncio.to_thread(gpu.choose, config)
    inventory = build_inventory(config, backend)
    link = Link(config, inventory, backend, supervisor)
    shims = ShimServer(socket_dir)

    def staged(report: StageProgress) -> None:
        link.post(inputs_staged(report))

    stager = Stager(
        config.resolved_stage_cache_dir(),
        config.stage_cache_max_mib * 1024 * 1024,
        on_progress=staged,
        http_timeout_s=config.stage_http_timeout_s,
    )
    await stager.start()
    runner = Runner(
        Path(config.state_dir),
        post=link.post,
        shims=shims,
        checkpoint_root=config.resolved_checkpoint_root(),
        checkpoint_keep=config.checkpoint_keep,
        run_as_owner=config.run_jobs_as == "owner",
        stager=stager,
    )
    controls = JobControls(shims, link.post, runner.pgid_of, config.progress_interval_s)
    coordinated = (
        coordination(config, inventory, shims, link) if config.coordinator.enabled else None
    )
    link.coordination = coordinated
    if coordinated is not None:
        controls.bound = coordinated.bound
    observers = JobObservers(
        controls,
        *([coordinated] if coordinated is not None else []),
        *([SimulatedUsage(backend)] if isinstance(backend, gpu.SimulatedBackend) else []),
    )
    shims.on_event = observers.on_shim_event
    runner.on_start = observers.job_started
    runner.on_end = observers.job_ended
    link.runner = runner
    link.controls = controls
    runner.recover()
    await runner.reopen_shims()
    running = {job_id for (job_id, _), job in runner.jobs.items() if job.ended is None}
    for job_id in stager.pinned_jobs() - running:
        stager.release(job_id)  # ended while the agent was away
    loop = asyncio.get_running_loop()
    xids = gpu_events.for_backend(backend, gpu_events.on_loop(loop, link.post))
    await asyncio.to_thread(xids.start)
    supervisor.spawn(link.run(), name="link")
    supervisor.spawn(controls.run(), name="job-progress")
    supervisor.spawn(link.sample_gpus(), name="gpu-sampler")
    supervisor.spawn(runner.prune_every(config.job_dir_retention_s), name="job-dir-pruner")
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
    await asyncio.to_thread(xids.stop)
    await supervisor.close()
    runner.close()
    await shims.close()
    await stager.close()
    log.info("agentd stopped", jobs_left_running=sum(j.ended is None for j in runner.jobs.values()))


def main(argv: list[str] | None = None) -> None:
    config = daemon.config_from_argv("agentd", AgentConfig, argv, __doc__)
    try:
        uvloop.run(async_main(config))
    except gpu.GpuBackendError as exc:  # a driver not there yet: systemd tries again
        log.error("cannot start", error=str(exc))
        sys.exit(1)
    except ConfigProblem as exc:  # as a bad config file: restarting cannot fix it
        log.error("cannot start", error=str(exc))
        sys.exit(2)


if __name__ == "__main__":
    main()
