"""What both daemons do the same way: read their config, and wait for a stop signal."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from shared import logging
from shared.config import C, ConfigError, load


def config_from_argv(prog: str, kind: type[C], argv: list[str] | None, doc: str | None) -> C:
    """Parse `--config`, load and check it, set up logging; exit 2 on a bad config."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--config", help=f"path of {prog}.toml (defaults apply without one)")
    args = parser.parse_args(argv)
    try:
        config = load(kind, args.config)
        config.resolved_join_token()
    except ConfigError as exc:
        print(f"{prog}: config: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.configure(prog, config.log_level)
    return config


async def stop_requested() -> None:
    """Return at SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
