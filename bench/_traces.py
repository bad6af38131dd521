"""Where the simulator benchmarks find the public traces: --trace-dir or $GPUSCHED_TRACES."""

from __future__ import annotations

import argparse
import os

ENV = "GPUSCHED_TRACES"


def add_trace_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-dir",
        default=os.environ.get(ENV),
        required=ENV not in os.environ,
        help=f"directory of the public traces (default: ${ENV})",
    )
