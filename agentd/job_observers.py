"""Fan-out of a job's life on this node to the parts that follow it.

The runner says when a job starts and ends, the shim server what its shim says; each
observer (job controls, the coordinator, simulated GPU usage) gets every one of them.
One observer that raises is logged and does not keep the others from hearing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from shared import logging
from shared.shim_protocol import FromShim

log = logging.get("job_observers")


def job_key(job_id: str, attempt: int) -> str:
    """How a job attempt is named on this node: its shim socket, its observers' keys."""
    return f"{job_id}.{attempt}"


class JobObserver(Protocol):
    def job_started(self, key: str, kind: str, gpu_uuids: list[str]) -> None: ...

    def on_shim_event(self, key: str, msg: FromShim) -> None: ...

    def job_ended(self, key: str) -> None: ...


class JobObservers:
    def __init__(self, *observers: JobObserver) -> None:
        self.observers = observers

    def job_started(self, job_id: str, attempt: int, kind: str, gpu_uuids: list[str]) -> None:
        for o in self.observers:
            self._call(o.job_started, job_key(job_id, attempt), kind, gpu_uuids)

    def on_shim_event(self, key: str, msg: FromShim) -> None:
        for o in self.observers:
            self._call(o.on_shim_event, key, msg)

    def job_ended(self, job_id: str, attempt: int) -> None:
        for o in self.observers:
            self._call(o.job_ended, job_key(job_id, attempt))

    @staticmethod
    def _call(method: Callable[..., Any], *args: object) -> None:
        try:
            method(*args)
        except Exception:
            log.exception("job observer failed", observer=getattr(method, "__qualname__", "?"))
