"""Errors as RFC 9457 problem details (`application/problem+json`).

Every client error names what was wrong: `field` (a body field, query parameter or
header) and `reason`, so that a person reading curl's output knows what to fix.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

CONTENT_TYPE = "application/problem+json"


class Problem(Exception):
    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extra = extra

    def response(self, instance: str | None = None) -> web.Response:
        body: dict[str, Any] = {
            "type": "about:blank",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.field is not None:
            body["field"] = self.field
        if instance is not None:
            body["instance"] = instance
        body.update(self.extra)
        return web.Response(
            status=self.status,
            body=orjson.dumps(body),
            content_type=CONTENT_TYPE,
            headers=self.headers,
        )


def invalid(field: str | None, reason: str, status: int = 422) -> Problem:
    title = "Invalid request" if status == 422 else "Bad request"
    detail = f"{field}: {reason}" if field else reason
    return Problem(status, title, detail, field=field, reason=reason)


def not_found(what: str) -> Problem:
    return Problem(404, "Not found", f"no {what}")


def unauthorized(detail: str) -> Problem:
    return Problem(401, "Unauthorized", detail, headers={"WWW-Authenticate": "Bearer"})
