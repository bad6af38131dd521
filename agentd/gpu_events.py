"""XID errors from NVML, as `GpuFault` events.

NVML delivers critical XID errors through an event set that is read with a blocking
wait, so `XidWatcher` waits in its own thread and calls `on_fault` from that thread. The
caller must hand each fault to its event loop: `on_loop(loop, sink)` wraps a sink (such
as `Link.post`) so that it runs there through `loop.call_soon_threadsafe`:

    watcher = gpu_events.for_backend(backend, gpu_events.on_loop(loop, link.post))
    await asyncio.to_thread(watcher.start)
    ...
    await asyncio.to_thread(watcher.stop)

The simulated backend has no XID events: `for_backend` gives it a `NoXidWatcher`, whose
`start` and `stop` do nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

from agentd.gpu import GpuBackend, NvmlBackend
from shared import logging
from shared.protocol import GpuFault

log = logging.get("gpu")

FaultSink = Callable[[GpuFault], None]

WAIT_TIMEOUT_MS = 1000


class FaultWatcher(Protocol):
    def start(self) -> int: ...

    def stop(self, timeout_s: float | None = None) -> bool: ...


class NoXidWatcher:
    """The watcher of a backend without XID events (the simulated GPUs)."""

    def start(self) -> int:
        return 0

    def stop(self, timeout_s: float | None = None) -> bool:
        return True


class XidWatcher:
    """Waits for critical XID events on `devices` ((UUID, NVML handle) pairs).

    `start()` registers the GPUs (a few quick NVML calls; from a worker thread if the
    loop must not wait on them) and starts the thread; it returns how many GPUs are
    watched. `stop()` ends the thread within one wait timeout; the thread frees the
    event set as it ends. `on_fault` is called from the watcher's thread.
    """

    def __init__(
        self,
        nvml: ModuleType,
        devices: Sequence[tuple[str, Any]],
        on_fault: FaultSink,
        timeout_ms: int = WAIT_TIMEOUT_MS,
    ) -> None:
        self.nvml = nvml
        self.devices = list(devices)
        self.on_fault = on_fault
        self.timeout_ms = timeout_ms
        self.watched: list[str] = []
        self._set: Any = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._wait_error: str | None = None

    def start(self) -> int:
        if self._thread is not None:
            raise RuntimeError("XidWatcher already started")
        nvml = self.nvml
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            # Sampling still works without events, so the agent runs on, without XIDs.
            log.error("gpu xid events unavailable", error=str(exc))
            return 0
        for gpu_uuid, handle in self.devices:
            if self._register(gpu_uuid, handle):
                self.watched.append(gpu_uuid)
        if not self.watched:
            self._free()
            return 0
        # A daemon thread: a wait stuck in the driver must not hold the process at exit.
        self._thread = threading.Thread(target=self._run, name="gpu-xid-events", daemon=True)
        self._thread.start()
        log.info("gpu xid events watched", gpus=len(self.watched), of=len(self.devices))
        return len(self.watched)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Ask the thread to end and wait for it; True when it has ended."""
        self._stopping.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(self.timeout_ms / 1000 + 1.0 if timeout_s is None else timeout_s)
        if thread.is_alive():
            log.warning("gpu xid watcher still waiting in NVML", timeout_ms=self.timeout_ms)
            return False
        return True

    def _register(self, gpu_uuid: str, handle: Any) -> bool:
        nvml = self.nvml
        try:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
        except nvml.NVMLError as exc:
            # Not Supported on GPUs and platforms without events (some consumer boards,
            # some virtual GPUs): that GPU is still sampled, its XIDs go unseen.
            log.warning("gpu xid events not watched", gpu_uuid=gpu_uuid, error=str(exc))
            return False
        return True

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wait_once()
        finally:
            self._free()

    def _wait_once(self) -> None:
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait(self._set, self.timeout_ms)
        except nvml.NVMLError_Timeout:
            return  # nothing happened; look at the stop flag again
        except nvml.NVMLError as exc:
            self._note_wait_error(str(exc))
            # Wait before trying again, so a broken set does not spin a core.
            self._stopping.wait(self.timeout_ms / 1000)
            return
        self._note_wait_error(None)
        if data.eventType & nvml.nvmlEventTypeXidCriticalError:
            self._deliver(data)

    def _deliver(self, data: Any) -> None:
        xid = int(data.eventData)
        gpu_uuid = self._uuid_of(data.device)
        if gpu_uuid is None:
            log.error("gpu xid from an unknown gpu", xid=xid)
            return
        fault = GpuFault(uuid=gpu_uuid, error=f"XID {xid}", xid=xid)
        log.error("gpu xid", gpu_uuid=gpu_uuid, xid=xid)
        try:
            self.on_fault(fault)
        except Exception:
            # The watcher outlives a failing sink: the next XID must still be seen.
            log.exception("gpu fault sink failed", gpu_uuid=gpu_uuid, xid=xid)

    def _uuid_of(self, device: Any) -> str | None:
        for gpu_uuid, handle in self.devices:
            if handle is device:
                return gpu_uuid
        # pynvml returns a new handle object per event, so ask NVML whose it is.
        try:
            value = self.nvml.nvmlDeviceGetUUID(device)
        except self.nvml.NVMLError:
            return None
        text = value.decode() if isinstance(value, bytes) else str(value)
        return text if text in self.watched else None

    def _note_wait_error(self, error: str | None) -> None:
        # The wait runs every timeout: log when its state changes, not on every turn.
        if error == self._wait_error:
            return
        if error is not None:
            log.error("gpu xid wait failed", error=error)
        else:
            log.info("gpu xid wait recovered", was=self._wait_error)
        self._wait_error = error

    def _free(self) -> None:
        event_set, self._set = self._set, None
        if event_set is None:
            return
        try:
            self.nvml.nvmlEventSetFree(event_set)
        except self.nvml.NVMLError as exc:
            log.warning("gpu xid event set not freed", error=str(exc))


def for_backend(
    backend: GpuBackend, on_fault: FaultSink, timeout_ms: int = WAIT_TIMEOUT_MS
) -> XidWatcher | NoXidWatcher:
    """The XID watcher that fits `backend`: NVML's GPUs, or none for simulated GPUs."""
    if isinstance(backend, NvmlBackend):
        return XidWatcher(backend.nvml, backend.devices(), on_fault, timeout_ms)
    return NoXidWatcher()


def on_loop(loop: asyncio.AbstractEventLoop, sink: FaultSink) -> FaultSink:
    """A sink callable from any thread that runs `sink(fault)` on `loop`."""

    def deliver(fault: GpuFault) -> None:
        try:
            loop.call_soon_threadsafe(sink, fault)
        except RuntimeError:
            # The loop closed while shutting down: nobody is left to tell.
            log.warning("gpu fault after shutdown", gpu_uuid=fault.uuid, error=fault.error)

    return deliver
