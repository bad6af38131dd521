"""Which jobs are elastic (Gandiva's grow/shrink), and how their work scales. Both are
assumptions, stated here, since no trace we replay says either.

- Which: with `SimOptions.elastic` = f, each job of more than one GPU is elastic with
  probability f, by a draw seeded by its place in the trace (as sharing.py draws
  utilisation, but from a stream of its own), so that every profile replays the same
  elastic jobs, and the jobs elastic at a smaller f are among those elastic at a larger
  one. An elastic job of G GPUs may run on any count from ceil(G / 2) to G.
- How its work scales: linearly. A job of G GPUs and run time D holds D x G GPU-seconds
  of work; on g GPUs the work left, W, takes W / g seconds (at full speed). A job that
  changes count from a to b has its remaining seconds multiplied by a / b.
"""

from __future__ import annotations

import math
import random


def check_fraction(fraction: float) -> None:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"--elastic: expected a fraction in [0, 1], got {fraction}")


def gpu_range(seq: int, gpus: int, fraction: float) -> tuple[int, int] | None:
    """The job's (least, most) GPUs if it is elastic, else None."""
    if gpus <= 1 or fraction <= 0.0:
        return None
    draw = random.Random(f"elastic:0:{seq}").random()  # in [0, 1): f = 1 takes all
    return (math.ceil(gpus / 2), gpus) if draw < fraction else None


def rescaled(remaining_s: float, old_gpus: int, new_gpus: int) -> float:
    """Seconds left on `new_gpus` for what takes `remaining_s` on `old_gpus`."""
    if old_gpus == new_gpus:
        return remaining_s
    return remaining_s * old_gpus / new_gpus
