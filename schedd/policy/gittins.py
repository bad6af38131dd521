"""The Gittins index of attained service, learned from the jobs that finished.

A scheduler that does not know run times but knows their distribution minimises mean
completion time by running the job of highest Gittins index (Gittins 1989; Tiresias'
"Tiresias-G" uses it with a distribution given in advance). For a job that has received
`a` GPU-seconds of service, with S the service a job takes:

    index(a) = max over d > 0 of  P(S <= a + d | S > a) / E[min(S - a, d) | S > a]

the best rate of completions per unit of service that spending more on it can buy. When
short jobs are common and the tail is long the index falls with service, and this is
least-attained-service (2D-LAS); when run times are alike it rises, and a job that has
started is worth finishing: this is first come, first served. Here the distribution is
the empirical one of finished jobs (`ServiceHistory`, filled by the live scheduler from
PostgreSQL and by the simulator from its own finished jobs), so the policy adapts to
the cluster it runs on without knowing any one job's run time.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

from schedd.policy.immutable import immutable

MAX_POINTS = 1024  # distinct service values kept: the table's cost is grid x points
# Attained-service values at which the index is tabled: quantiles of the history, and
# a geometric series, since between two finished jobs' values the index rises.
QUANTILE_POINTS = 96
GEOMETRIC_POINTS = 64
MIN_SAMPLES = 32  # the fewest finished jobs any index is learned from: callers fall back


@dataclass(frozen=True, slots=True, eq=False)
class ServiceHistory:
    """The distribution of the GPU-seconds of service a job takes, as probability
    masses at service values (ascending) and a mass beyond the largest (jobs that have
    run longer than any that finished).

    Built by `of` from finished jobs and, so that a history young enough to hold only
    the short jobs is not taken for the whole story, from the service of jobs not
    finished yet, as censored observations (Kaplan-Meier). Compared and hashed by
    identity: whoever builds snapshots keeps one object while it is unchanged, and the
    index table built from it is reused."""

    values: tuple[float, ...]
    masses: tuple[float, ...]
    beyond: float
    finished: int

    @classmethod
    def of(cls, finished: Iterable[float], unfinished: Iterable[float] = ()) -> ServiceHistory:
        """From the service of finished jobs and the service so far of unfinished ones;
        non-positive figures (jobs that held no GPU, or have not run) are dropped."""
        done = sorted(float(v) for v in finished if v > 0)
        ongoing = sorted(float(v) for v in unfinished if v > 0)
        values: list[float] = []
        masses: list[float] = []
        at_risk = len(done) + len(ongoing)
        survival = 1.0
        i = c = 0
        while i < len(done):
            t = done[i]
            while c < len(ongoing) and ongoing[c] < t:
                c += 1  # censored before t: no longer at risk
                at_risk -= 1
            ended = 0
            while i < len(done) and done[i] == t:
                i += 1
                ended += 1
            mass = survival * ended / at_risk
            values.append(t)
            masses.append(mass)
            survival -= mass
            at_risk -= ended
        values, masses = _thin(values, masses)
        return cls(tuple(values), tuple(masses), max(survival, 0.0), len(done))


def _thin(values: list[float], masses: list[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS values: consecutive ones merged, at their mass-weighted mean."""
    if len(values) <= MAX_POINTS:
        return values, masses
    step = len(values) / MAX_POINTS
    out_v: list[float] = []
    out_m: list[float] = []
    for b in range(MAX_POINTS):
        lo, hi = round(b * step), round((b + 1) * step)
        mass = sum(masses[lo:hi])
        if mass > 0:
            out_v.append(
                sum(v * m for v, m in zip(values[lo:hi], masses[lo:hi], strict=True)) / mass
            )
            out_m.append(mass)
    return out_v, out_m


@immutable
class GittinsTable:
    """The index as a step function of attained service: `indices[i]` holds from
    `points[i]` up to the next point. The index rises as a job nears the next value at
    which jobs finish and drops once past it, so the tabled value is the lowest on its
    step wherever a step holds no finished job's value inside it."""

    points: tuple[float, ...]  # ascending, points[0] == 0
    indices: tuple[float, ...]
    # suffix_min[i] = min(indices[i:]): whether a job could ever drop below a value.
    suffix_min: tuple[float, ...]
    # `steps_below` by value: the values asked are the table's own indices (those of
    # waiting jobs), so it holds one entry per step at most.
    _below: dict[float, tuple[int, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    # `below_until` by value: for each step, the first later one not below it.
    _ends: dict[float, tuple[int, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def index(self, attained: float) -> float:
        return self.indices[bisect.bisect_right(self.points, attained) - 1]

    def steps_below(self, value: float) -> tuple[int, ...]:
        """The steps whose index is below `value`, ascending: `drops_below`'s work for
        one value, shared by every job compared with it."""
        known = self._below.get(value)
        if known is None:
            known = self._below[value] = tuple(
                i for i, index in enumerate(self.indices) if index < value
            )
        return known

    def drops_below(
        self, attained: float, value: float, steps: tuple[int, ...] | None = None
    ) -> float | None:
        """The least service beyond `attained` at which the index is below `value`,
        or None if it never is. `steps` is `steps_below(value)`, if known."""
        i = bisect.bisect_right(self.points, attained)
        if i >= len(self.points) or self.suffix_min[i] >= value:
            return None
        below = self.steps_below(value) if steps is None else steps
        return self.points[below[bisect.bisect_left(below, i)]]

    def below_until(self, attained: float, value: float) -> float | None:
        """For a job whose index is below `value` at `attained`: the least service
        beyond at which it no longer is, or None if it stays below."""
        ends = self._ends.get(value)
        if ends is None:
            found = [len(self.points)] * len(self.points)
            for i in range(len(self.points) - 2, -1, -1):
                found[i] = i + 1 if self.indices[i + 1] >= value else found[i + 1]
            ends = self._ends[value] = tuple(found)
        end = ends[bisect.bisect_right(self.points, attained) - 1]
        return self.points[end] if end < len(self.points) else None


def table_for(
    history: ServiceHistory | None, min_finished: int = MIN_SAMPLES
) -> GittinsTable | None:
    """The index table of a history, or None when fewer than `min_finished` jobs (and
    never fewer than `MIN_SAMPLES`) finished to tell."""
    if history is None or history.finished < max(min_finished, MIN_SAMPLES) or not history.values:
        return None
    return _table(history)


@functools.lru_cache(maxsize=8)
def _table(history: ServiceHistory) -> GittinsTable:
    values, masses = history.values, history.masses
    mass_sum, weighted_sum = [0.0], [0.0]
    for v, m in zip(values, masses, strict=True):
        mass_sum.append(mass_sum[-1] + m)
        weighted_sum.append(weighted_sum[-1] + v * m)
    step = max(1, len(values) // QUANTILE_POINTS)
    low, high = values[0] / 4, values[-1]
    ratio = (high / low) ** (1 / (GEOMETRIC_POINTS - 1))
    geometric = (low * ratio**i for i in range(GEOMETRIC_POINTS - 1))
    points = sorted({0.0, *values[step - 1 :: step], *geometric, high})
    indices = [_index_at(a, history, mass_sum, weighted_sum) for a in points]
    # Past the largest job ever finished the history says nothing: such a job ranks
    # below every other, as least-attained-service would rank it.
    lowest = min((x for x in indices if x > 0), default=1.0)
    indices = [x if x > 0 else lowest / 2 for x in indices]
    suffix = list(indices)
    for i in range(len(suffix) - 2, -1, -1):
        suffix[i] = min(suffix[i], suffix[i + 1])
    return GittinsTable(tuple(points), tuple(indices), tuple(suffix))


def _index_at(
    a: float, history: ServiceHistory, mass_sum: list[float], weighted_sum: list[float]
) -> float:
    """max over ends v_j > a of  P(done by v_j) / E[service spent by then], among jobs
    that took more than `a` (both scaled by P(S > a), which cancels)."""
    values = history.values
    n = len(values)
    total = mass_sum[n] + history.beyond
    k = bisect.bisect_right(values, a)
    best = 0.0
    for j in range(k, n):
        done = mass_sum[j + 1] - mass_sum[k]
        spent = (weighted_sum[j + 1] - weighted_sum[k]) - done * a
        spent += (total - mass_sum[j + 1]) * (values[j] - a)
        if spent > 0 and done / spent > best:
            best = done / spent
    return best
