"""AntMan's local coordinator for one GPU, as a state machine without I/O.

One GPU holds at most one guaranteed job and any number of opportunistic ones. The
coordinator keeps the guaranteed job at its solo speed and gives the opportunistic jobs
what is left:
- Compute: it learns the guaranteed job's solo step time (the median of steps that ran
  while every opportunistic job was paused), then, once per window of the guaranteed
  job's steps, compares the window's median step time with it. Above
  `solo * (1 + slowdown)` every opportunistic share is cut multiplicatively, otherwise
  raised additively (AIMD: cut fast, give back slowly), but not past where the window's
  slowdown, scaled by the shares, says the limit lies.
- schedd's limits for an opportunistic job (`set_bound`) are the most it is given: AIMD
  raises its share no higher, and its cap is the smaller of the two.
- Memory: each opportunistic job is capped at an equal part of
  `total - guaranteed peak - headroom`. A guaranteed peak above what the caps assume
  re-caps at once, in the decisions of that same step; a lower peak raises the caps only
  after a whole window of steps has stayed below it.

Like h11, it reads no clock and does no I/O: the agent feeds it events (`job_joined`,
`job_left`, `step`, with the time) and applies, logs and reports the `Decision`s it
returns. A decision carries the job's whole setting, as the shim's `limits` message
does, and is returned only when that setting changes. docs/shim.md ("The coordinator")
explains the choices.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Literal, get_args

JobKind = Literal["guaranteed", "opportunistic"]

FULL_SHARE = 100


class CoordinatorError(ValueError):
    """The agent used the coordinator wrongly (a job joined twice, a second guaranteed job)."""


@dataclass(frozen=True)
class CoordinatorSettings:
    """How the coordinator steers; every field is checked when the settings are made.

    slowdown: how much slower than solo the guaranteed job may run (0.05: 5 %).
    decrease: the factor a share is multiplied by when the guaranteed job is too slow.
    increase: share points given back per window when it is not.
    min_share: the floor of a cut; 0 lets AIMD pause an opportunistic job entirely.
    initial_share: an opportunistic job's share when it joins a GPU with a guaranteed job.
    window: guaranteed steps whose median makes one decision.
    solo_samples: solo steps whose median is the solo step time.
    warmup_steps: a guaranteed job's first steps, never timed (CUDA and allocator start-up).
    settle_steps: guaranteed steps not counted as solo just after the opportunistic jobs
        were paused (the pause reaches a shim only at its next step boundary).
    relearn_drop: a window this much faster than solo (0.10: 10 %) means the solo time
        is stale: pause the opportunistic jobs and learn it again.
    headroom_mib: memory kept free above the guaranteed job's peak; it also has to hold
        the jobs' CUDA contexts, which a cap does not count.
    min_cap_mib: below this cap an opportunistic job is paused (share 0), not starved.
    cap_step_mib: caps are rounded down to a multiple of this, so a peak that creeps up
        by a few MiB does not make the neighbours empty their caches at every step.
    """

    slowdown: float = 0.05
    decrease: float = 0.5
    increase: int = 5
    min_share: int = 0
    initial_share: int = 10
    window: int = 20
    solo_samples: int = 50
    warmup_steps: int = 2
    settle_steps: int = 1
    relearn_drop: float = 0.10
    headroom_mib: int = 1024
    min_cap_mib: int = 512
    cap_step_mib: int = 64

    def __post_init__(self) -> None:
        _number("slowdown", self.slowdown, low=0.0, low_open=True, high=1.0)
        _number("decrease", self.decrease, low=0.0, low_open=True, high=1.0, high_open=True)
        _integer("increase", self.increase, low=1, high=FULL_SHARE)
        _integer("min_share", self.min_share, low=0, high=FULL_SHARE)
        _integer("initial_share", self.initial_share, low=self.min_share, high=FULL_SHARE)
        _integer("window", self.window, low=1)
        _integer("solo_samples", self.solo_samples, low=1)
        _integer("warmup_steps", self.warmup_steps, low=0)
        _integer("settle_steps", self.settle_steps, low=0)
        _number("relearn_drop", self.relearn_drop, low=0.0, low_open=True, high=1.0, high_open=True)
        _integer("headroom_mib", self.headroom_mib, low=0)
        _integer("min_cap_mib", self.min_cap_mib, low=1)
        _integer("cap_step_mib", self.cap_step_mib, low=1)


def _integer(name: str, value: object, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"CoordinatorSettings.{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"CoordinatorSettings.{name} must be {bounds}, got {value}")


def _number(
    name: str,
    value: object,
    low: float,
    high: float,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"CoordinatorSettings.{name} must be a finite number, got {value!r}")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high:
        left, right = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(
            f"CoordinatorSettings.{name} must be in {left}{low}, {high}{right}, got {value}"
        )


@dataclass(frozen=True)
class Decision:
    """A new setting for one opportunistic job: apply it, log it, report it to schedd.

    It is the whole setting (`share` 0-100, 0 pauses; `memory_cap_mib` None: no cap) and
    differs from the previous one, which it also names.
    """

    gpu_uuid: str
    job_key: str
    share: int
    memory_cap_mib: int | None
    previous_share: int
    previous_memory_cap_mib: int | None
    reason: str
    at: float


@dataclass(frozen=True)
class CoordinatorState:
    """What the coordinator believes now, for status pages and "why is my job slow"."""

    gpu_uuid: str
    guaranteed: str | None
    solo_step_s: float | None  # None while it is being learned, or with no guaranteed job
    guaranteed_peak_mib: int | None  # the peak the caps assume
    opportunistic: dict[str, tuple[int, int | None]]  # job -> (share, memory cap), as applied


@dataclass
class _Guaranteed:
    key: str
    peak_mib: int  # the peak the caps assume
    peaks: deque[int]  # its last `window` reported peaks
    steps: int = 0


@dataclass
class _Opportunistic:
    share: int  # what AIMD gives it, never above `most_share`; applied unless paused
    applied_share: int
    applied_cap: int | None
    # schedd's limits for it (`set_bound`): the most it may be given, whatever the room.
    most_share: int = FULL_SHARE
    most_cap: int | None = None


class GpuCoordinator:
    def __init__(
        self,
        gpu_uuid: str,
        total_memory_mib: int,
        settings: CoordinatorSettings | None = None,
    ) -> None:
        if not isinstance(total_memory_mib, int) or total_memory_mib <= 0:
            raise ValueError(
                f"total_memory_mib must be a positive integer, got {total_memory_mib!r}"
            )
        self.gpu_uuid = gpu_uuid
        self.total_memory_mib = total_memory_mib
        self.settings = settings or CoordinatorSettings()
        self._guaranteed: _Guaranteed | None = None
        self._opportunistic: dict[str, _Opportunistic] = {}
        self._solo: deque[float] = deque(maxlen=self.settings.solo_samples)
        self._window: list[float] = []
        self._quiet_since: int | None = None  # guaranteed step count when all OT were paused
        self._starved = False

    # ---- events ------------------------------------------------------------------------

    def job_joined(
        self,
        job_key: str,
        kind: JobKind,
        now: float,
        *,
        expected_peak_mib: int | None = None,
        applied_share: int = FULL_SHARE,
        applied_cap_mib: int | None = None,
    ) -> list[Decision]:
        """A job started on this GPU (or a restarted agent found it running).

        `expected_peak_mib` (a guaranteed job's memory, if known from its spec) is what
        the caps assume until it reports steps. `applied_share`/`applied_cap_mib` are what
        an opportunistic job applies now (its shim's `hello`): the defaults are the shim's.
        """
        if kind not in get_args(JobKind):
            raise CoordinatorError(f"job {job_key}: kind must be guaranteed or opportunistic")
        if job_key in self._opportunistic or (self._guaranteed and self._guaranteed.key == job_key):
            raise CoordinatorError(f"job {job_key} has already joined GPU {self.gpu_uuid}")
        if kind == "guaranteed":
            if self._guaranteed is not None:
                raise CoordinatorError(
                    f"GPU {self.gpu_uuid} already has guaranteed job {self._guaranteed.key}"
                )
            self._guaranteed = _Guaranteed(
                key=job_key,
                peak_mib=max(0, expected_peak_mib or 0),
                peaks=deque(maxlen=self.settings.window),
            )
            self._forget_timing()
            why = f"guaranteed job {job_key} joined"
        else:
            self._opportunistic[job_key] = _Opportunistic(
                share=self.settings.initial_share,
                applied_share=applied_share,
                applied_cap=applied_cap_mib,
            )
            self._window.clear()  # the window measured a different set of neighbours
            why = f"opportunistic job {job_key} joined"
        return self._sync([why], now)

    def set_bound(
        self, job_key: str, share: int, memory_cap_mib: int | None, now: float
    ) -> list[Decision]:
        """schedd's limits for an opportunistic job: the most share and memory it may be
        given, here or alone on the GPU (100 and None: no bound). Unknown jobs are
        ignored."""
        o = self._opportunistic.get(job_key)
        if o is None:
            return []
        if not 0 <= share <= FULL_SHARE or (memory_cap_mib is not None and memory_cap_mib < 0):
            raise CoordinatorError(
                f"job {job_key}: a bound needs a share of 0-100 and a memory cap of at least"
                f" 0 MiB, got {share} and {memory_cap_mib}"
            )
        o.most_share, o.most_cap = share, memory_cap_mib
        o.share = min(o.share, share)
        return self._sync(
            [f"schedd bounds {job_key} at {limits_words(share, memory_cap_mib)}"], now
        )

    def job_left(self, job_key: str, now: float) -> list[Decision]:
        """A job ended or moved away. Unknown jobs are ignored, so this is idempotent."""
        if self._guaranteed is not None and self._guaranteed.key == job_key:
            self._guaranteed = None
            self._forget_timing()
            why = f"guaranteed job {job_key} left; nothing to protect"
        elif self._opportunistic.pop(job_key, None) is not None:
            self._window.clear()
            why = f"opportunistic job {job_key} left"
        else:
            return []
        return self._sync([why], now)

    def step(
        self, job_key: str, wall_s: float, mem_peak_mib: int | None, now: float
    ) -> list[Decision]:
        """One step report (the shim's `step`): its `wall_s` and `mem_peak_mib`.

        Only the guaranteed job's steps drive decisions; the wall time is used because
        its rate of progress is what the guarantee is about. Steps of opportunistic or
        unknown jobs return nothing.
        """
        g = self._guaranteed
        if g is None or job_key != g.key:
            return []
        g.steps += 1
        why = [
            w for w in (self._observe_memory(g, mem_peak_mib), self._observe_time(g, wall_s)) if w
        ]
        return self._sync(why, now) if why else []

    def state(self) -> CoordinatorState:
        g = self._guaranteed
        return CoordinatorState(
            gpu_uuid=self.gpu_uuid,
            guaranteed=g.key if g else None,
            solo_step_s=self.solo_step_s,
            guaranteed_peak_mib=g.peak_mib if g else None,
            opportunistic={
                k: (o.applied_share, o.applied_cap) for k, o in self._opportunistic.items()
            },
        )

    @property
    def solo_step_s(self) -> float | None:
        """The guaranteed job's solo step time; None while it is (re)learned."""
        if self._guaranteed is None or len(self._solo) < self.settings.solo_samples:
            return None
        return statistics.median(self._solo)

    # ---- observations ------------------------------------------------------------------

    def _observe_memory(self, g: _Guaranteed, peak: int | None) -> str | None:
        if peak is None:  # a job without CUDA: nothing to protect
            return None
        g.peaks.append(peak)
        if peak > g.peak_mib:
            old, g.peak_mib = g.peak_mib, peak
            return f"guaranteed job {g.key}'s memory peak rose to {peak} MiB (caps assumed {old})"
        highest = max(g.peaks)
        if len(g.peaks) == self.settings.window and highest < g.peak_mib:
            old, g.peak_mib = g.peak_mib, highest
            return (
                f"guaranteed job {g.key}'s memory peak stayed at or below {highest} MiB for "
                f"{self.settings.window} steps (caps assumed {old})"
            )
        return None

    def _observe_time(self, g: _Guaranteed, wall_s: float) -> str | None:
        s = self.settings
        if g.steps <= s.warmup_steps or not 0 < wall_s < math.inf:
            return None
        learning = self.solo_step_s is None
        quiet = self._quiet_since is not None and g.steps > self._quiet_since + s.settle_steps
        if quiet:
            self._solo.append(wall_s)  # every solo step refreshes the solo time
        if learning:
            solo = self.solo_step_s
            if solo is None:
                return None
            return (
                f"learned guaranteed job {g.key}'s solo step time: {solo:.4g} s "
                f"(median of {s.solo_samples} steps alone)"
            )
        if not self._opportunistic or self._starved:
            return None
        self._window.append(wall_s)
        if len(self._window) < s.window:
            return None
        return self._decide(g)

    def _decide(self, g: _Guaranteed) -> str | None:
        """One AIMD decision from a full window; returns why, or None when nothing moves."""
        s = self.settings
        solo = self.solo_step_s
        assert solo is not None  # windows are only collected once it is known
        ratio = statistics.median(self._window) / solo
        self._window.clear()
        limit = 1 + s.slowdown
        measured = f"guaranteed job {g.key} at {ratio:.3f}x its solo step time (limit {limit:g}x)"
        jobs = list(self._opportunistic.values())
        if ratio > limit:
            cuts = [min(o.most_share, max(s.min_share, int(o.share * s.decrease))) for o in jobs]
            if cuts == [o.share for o in jobs]:
                # Cutting changes nothing: the solo time itself must have grown.
                self._relearn()
                return f"{measured} with opportunistic jobs at the floor; re-learning it"
            for o, share in zip(jobs, cuts, strict=True):
                o.share = share
            return measured
        if ratio < 1 - s.relearn_drop:
            self._relearn()
            return f"{measured}: faster than solo, re-learning its solo step time"
        points = min(s.increase, self._room_below_limit(ratio))
        if points <= 0 or all(o.share >= o.most_share for o in jobs):
            return None
        for o in jobs:
            o.share = min(o.most_share, o.share + points)
        return measured

    def _room_below_limit(self, ratio: float) -> int:
        """Share points each job may gain before the guaranteed job would cross the limit.

        The slowdown is taken to grow in proportion to the opportunistic shares, judged
        by this window. It only keeps an increase from overshooting: were the guess wrong,
        the next window's cut still corrects it.
        """
        total = sum(o.share for o in self._opportunistic.values())
        if ratio <= 1 or total == 0:
            return FULL_SHARE
        allowed = total * self.settings.slowdown / (ratio - 1)
        # The epsilon keeps float rounding from costing a point exactly at the limit.
        return math.floor((allowed - total) / len(self._opportunistic) + 1e-9)

    def _relearn(self) -> None:
        self._solo.clear()
        self._window.clear()

    def _forget_timing(self) -> None:
        self._solo.clear()
        self._window.clear()
        self._quiet_since = None

    # ---- the settings the jobs should have -----------------------------------------------

    def _cap_each(self) -> int | None:
        g = self._guaranteed
        if g is None or not self._opportunistic:
            return None
        s = self.settings
        room = self.total_memory_mib - g.peak_mib - s.headroom_mib
        each = max(0, room // len(self._opportunistic))
        return each - each % s.cap_step_mib

    def _wanted(self, o: _Opportunistic, cap: int | None) -> tuple[int, int | None]:
        if o.most_cap is not None:
            cap = o.most_cap if cap is None else min(cap, o.most_cap)
        if self._guaranteed is None:
            return o.most_share, cap
        if self._starved or self.solo_step_s is None:
            return 0, cap
        return o.share, cap

    def _sync(self, why: list[str], now: float) -> list[Decision]:
        """Turn the state into decisions for the jobs whose setting changes."""
        cap = self._cap_each()
        starved = cap is not None and cap < self.settings.min_cap_mib
        if self._starved and not starved:
            why = [*why, "room for opportunistic jobs again"]
        if starved != self._starved:
            self._starved = starved
            self._window.clear()
        decisions = []
        shares_moved = False
        for key, o in self._opportunistic.items():
            share, job_cap = self._wanted(o, cap)
            if (share, job_cap) == (o.applied_share, o.applied_cap):
                continue
            shares_moved = shares_moved or share != o.applied_share
            notes = why
            if share == 0 and o.applied_share != 0:
                notes = [*why, self._pause_note(cap)]
            decisions.append(
                Decision(
                    gpu_uuid=self.gpu_uuid,
                    job_key=key,
                    share=share,
                    memory_cap_mib=job_cap,
                    previous_share=o.applied_share,
                    previous_memory_cap_mib=o.applied_cap,
                    reason=f"{'; '.join(notes)}: {_change(o, share, job_cap)}",
                    at=now,
                )
            )
            o.applied_share, o.applied_cap = share, job_cap
        if shares_moved:
            self._window.clear()  # a window measures one setting
        self._track_quiet()
        return decisions

    def _pause_note(self, cap: int | None) -> str:
        if self._starved:
            return f"paused: {cap} MiB each is below the {self.settings.min_cap_mib} MiB minimum"
        if self._guaranteed is not None and self.solo_step_s is None:
            return f"paused while {self._guaranteed.key}'s solo step time is learned"
        return "a share of 0 pauses it"

    def _track_quiet(self) -> None:
        """Note the guaranteed step from which every opportunistic job has been paused."""
        g = self._guaranteed
        if g is None or any(o.applied_share > 0 for o in self._opportunistic.values()):
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = g.steps


def _change(o: _Opportunistic, share: int, cap: int | None) -> str:
    parts = []
    if share != o.applied_share:
        parts.append(f"share {o.applied_share} -> {share}")
    if cap != o.applied_cap:
        parts.append(f"memory cap {_mib(o.applied_cap)} -> {_mib(cap)}")
    return ", ".join(parts)


def limits_words(share: int, cap: int | None) -> str:
    """A job's setting in words, as events and logs give it."""
    return f"share {share}, " + ("no memory cap" if cap is None else f"memory cap {cap} MiB")


def _mib(cap: int | None) -> str:
    return "none" if cap is None else f"{cap} MiB"
