"""Replay one trace through several profiles: the runs and their figures, in order."""

from __future__ import annotations

from collections.abc import Sequence

from schedd.policy import Profile
from schedd.sim.engine import SimOptions, Simulation
from schedd.sim.locality import LocalityModel
from schedd.sim.metrics import Summary, summarize
from schedd.sim.outcome import SimResult
from schedd.sim.shape import ClusterShape
from schedd.sim.traces import Trace


def replay(
    trace: Trace,
    shape: ClusterShape,
    profiles: Sequence[Profile],
    options: SimOptions | None = None,
    locality: LocalityModel | None = None,
) -> list[tuple[SimResult, Summary]]:
    runs = []
    for profile in profiles:
        result = Simulation(trace, shape, profile, options, locality).run()
        runs.append((result, summarize(result)))
    return runs
