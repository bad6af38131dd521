"""How a job's process ended, in words (its events, its reason)."""

from __future__ import annotations

import signal


def describe_exit(exit_code: int | None, sig: int | None) -> str:
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {name}"
    return f"exited with code {exit_code}"
