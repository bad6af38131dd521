"""A stand-in for the `pynvml` module (package nvidia-ml-py), for tests without a GPU.

It copies what the agent relies on from the real module: the function names, the error
classes (`NVMLError`, whose constructor picks the subclass for an error code, and one
subclass per `NVML_ERROR_*` code named like `NVMLError_GpuIsLost`), their messages, the
constants and the field names of the structures returned. `test_nvml` checks these
against the installed pynvml. Every call is recorded in `calls` as (name, args).

The GPUs are `FakeGpu`s; tests change them between calls (`lose`, `inject_xid`, ...).
"""

from __future__ import annotations

import queue
import string
import threading
import types
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024

# The real module's error codes (the subset the agent may meet).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_UNKNOWN = 999

nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002


class NVMLError(Exception):
    """As in pynvml: `NVMLError(code)` builds the subclass for `code`."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")


def _error_classes() -> dict[str, type[NVMLError]]:
    # The real module's naming: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    classes = {}
    for name, code in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        words = string.capwords(name.removeprefix("NVML_ERROR_"), "_").replace("_", "")

        def new(cls: type[NVMLError], *args: Any, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type("NVMLError_" + words, (NVMLError,), {"__new__": new})
        NVMLError._valClassMapping[code] = cls
        classes[cls.__name__] = cls
    return classes


ERROR_CLASSES = _error_classes()
globals().update(ERROR_CLASSES)


# ---- structures, with the real ones' field names --------------------------------------


@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class c_nvmlEventData_t:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class Handle:
    """An opaque device handle, as pynvml's ctypes pointers are to the caller."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake c_nvmlDevice_t {self.index}>"


class EventSet:
    def __init__(self) -> None:
        self.events: queue.Queue[c_nvmlEventData_t] = queue.Queue()
        self.devices: list[int] = []
        self.freed = False
        self.fails_with: int | None = None  # NVML error code every wait raises, if set


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_mib: int = 81559
    used_mib: int = 0
    util_pct: int = 0
    # pid -> bytes used, None where the driver does not know
    processes: dict[int, int | None] = field(default_factory=dict)
    # NVML error code raised by every call on this GPU (GPU_IS_LOST after `lose`)
    fails_with: int | None = None
    processes_error: int | None = None  # e.g. NOT_SUPPORTED for the process list only
    events_supported: bool = True


class FakeNvml(types.ModuleType):
    """One fake NVML library. Module attributes are the fake's, as `pynvml.X` would be."""

    def __init__(self, gpus: list[FakeGpu] | int = 2, init_error: int | None = None) -> None:
        super().__init__("pynvml")
        if isinstance(gpus, int):
            gpus = [FakeGpu(uuid=f"GPU-{i:08d}-fake") for i in range(gpus)]
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.sets: list[EventSet] = []
        self._initialised = False
        self._handles = [Handle(i) for i in range(len(gpus))]
        self._lock = threading.Lock()
        # The module-level names of the real pynvml that callers use.
        self.__dict__.update(ERROR_CLASSES)
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEventType")) or name in ("NVMLError",):
                setattr(self, name, value)

    # ---- test controls -------------------------------------------------------------

    def names(self) -> list[str]:
        """The calls made, in order, without their arguments."""
        with self._lock:
            return [name for name, _ in self.calls]

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every later call on it raises GpuIsLost."""
        self.gpus[index].fails_with = NVML_ERROR_GPU_IS_LOST

    def inject_xid(self, index: int, xid: int, fresh_handle: bool = False) -> None:
        """Deliver an XID event from GPU `index` to every set it is registered with.

        `fresh_handle` gives the event a new handle object for the GPU, as pynvml does.
        """
        device = Handle(index) if fresh_handle else self._handles[index]
        for s in self.sets:
            if index in s.devices and not s.freed:
                s.events.put(c_nvmlEventData_t(device, nvmlEventTypeXidCriticalError, xid))

    # ---- the pynvml API --------------------------------------------------------------

    def _record(self, name: str, *args: Any) -> None:
        with self._lock:
            self.calls.append((name, args))
        if name != "nvmlInit" and not self._initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Handle) -> FakeGpu:
        if not isinstance(handle, Handle) or handle.index >= len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.fails_with is not None:
            raise NVMLError(gpu.fails_with)
        return gpu

    def nvmlInit(self) -> None:
        self._record("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._initialised = True

    def nvmlShutdown(self) -> None:
        self._record("nvmlShutdown")
        self._initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._record("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._record("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        fails_with = self.gpus[index].fails_with
        if fails_with is not None:
            raise NVMLError(fails_with)
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._record("nvmlDeviceGetUUID", handle)
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._record("nvmlDeviceGetName", handle)
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> c_nvmlMemory_t:
        self._record("nvmlDeviceGetMemoryInfo", handle)
        gpu = self._gpu(handle)
        total, used = gpu.total_mib * MIB, gpu.used_mib * MIB
        return c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> c_nvmlUtilization_t:
        self._record("nvmlDeviceGetUtilizationRates", handle)
        return c_nvmlUtilization_t(gpu=self._gpu(handle).util_pct, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[c_nvmlProcessInfo_t]:
        self._record("nvmlDeviceGetComputeRunningProcesses", handle)
        gpu = self._gpu(handle)
        if gpu.processes_error is not None:
            raise NVMLError(gpu.processes_error)
        return [c_nvmlProcessInfo_t(pid, used) for pid, used in gpu.processes.items()]

    def nvmlEventSetCreate(self) -> EventSet:
        self._record("nvmlEventSetCreate")
        event_set = EventSet()
        self.sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(
        self, handle: Handle, event_types: int, event_set: EventSet
    ) -> None:
        self._record("nvmlDeviceRegisterEvents", handle, event_types, event_set)
        gpu = self._gpu(handle)
        if not gpu.events_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        event_set.devices.append(handle.index)

    def nvmlEventSetWait(self, event_set: EventSet, timeoutms: int) -> c_nvmlEventData_t:
        self._record("nvmlEventSetWait", event_set, timeoutms)
        if event_set.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if event_set.fails_with is not None:
            raise NVMLError(event_set.fails_with)
        try:
            return event_set.events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    def nvmlEventSetFree(self, event_set: EventSet) -> None:
        self._record("nvmlEventSetFree", event_set)
        event_set.freed = True
