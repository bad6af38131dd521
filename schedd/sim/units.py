"""Time units of the printed report (JSON is always in seconds)."""

from __future__ import annotations

UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
# Chronus traces count in minutes and their reference figures are in minutes.
DEFAULT_UNIT = {"chronus": "min", "itp": "min", "itp-deadline": "min", "csv": "s"}
