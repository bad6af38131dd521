"""Which code a benchmark measured: printed or recorded beside its figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def code_version() -> str:
    """The commit measured, and whether the tracked files differ from it."""
    try:
        found = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=10"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    version = found.stdout.strip()
    if not version:
        return "unknown (not a git checkout)"
    return version.replace("-dirty", " plus uncommitted changes to tracked files")
