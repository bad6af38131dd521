"""Where the simulator benchmarks find the public traces: --trace-dir or $GPUSCHED_TRACES."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

ENV = "GPUSCHED_TRACES"


def add_trace_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-dir",
        default=os.environ.get(ENV),
        required=ENV not in os.environ,
        help=f"directory of the public traces (default: ${ENV})",
    )


def itp_paths(trace_dir: str, clusters: str | None) -> list[Path]:
    """The ITP raw cluster traces, all or those named ("cluster01,cluster05")."""
    paths = sorted((Path(trace_dir) / "itp" / "raw").glob("cluster*.csv"))
    if clusters:
        wanted = set(clusters.split(","))
        paths = [p for p in paths if p.stem in wanted]
    return paths
