"""Structured JSON logs on stdout, one object per line (journald keeps them).

Bind `job_id`, `node_id` and `user` with `log.bind(...)` where they apply.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO, cast

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS["error"] = logging.ERROR


def _dumps(obj: Any, default: Any = None) -> str:
    return orjson.dumps(obj, default=default or str).decode()


class CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was set up:
    for a command run as a function (tests, embedding) whose caller swaps it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(
    service: str, level: str = "info", stream: TextIO | CurrentStderr | None = None
) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # PrintLogger needs only write() and flush().
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, stream or sys.stdout)),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


def get(name: str) -> Any:
    return structlog.get_logger(name)
