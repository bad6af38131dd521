"""sd_notify readiness and watchdog pings, stdlib only.

The protocol is one datagram to $NOTIFY_SOCKET; with no such variable (not under
systemd) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket


def notify(state: str) -> bool:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):  # abstract namespace
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(path)
        sock.sendall(state.encode())
    return True


def watchdog_interval() -> float | None:
    """Half of WatchdogSec when systemd asked for pings, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2_000_000


async def async_watchdog(interval: float) -> None:
    """Ping from the event loop itself, so a blocked loop misses pings and gets restarted."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
