"""Where the simulator benchmarks find the public traces: --trace-dir or $GPUSCHED_TRACES."""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedd.sim.traces import Trace

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


def renamed(trace: Trace, seed: int) -> Trace:
    """The trace with every job id prefixed by a random number drawn from `seed` (0: as
    it is); ids stay unique, and nothing else changes. Ties the policies break by job id
    then fall otherwise: the spread over seeds is what tie-breaking alone moves."""
    if seed == 0:
        return trace
    rng = random.Random(seed)
    jobs = tuple(
        dataclasses.replace(j, job_id=f"{rng.getrandbits(48):012x}-{j.job_id}") for j in trace.jobs
    )
    return dataclasses.replace(trace, jobs=jobs)
