"""A stand-in for a module's structlog logger that keeps what was logged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class RecordingLog:
    """Records (level, event, fields) per line; set it as a module's `log`."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        def emit(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))

        return emit

    def events(self, level: str | None = None) -> list[str]:
        return [e for lv, e, _ in self.lines if level is None or lv == level]
