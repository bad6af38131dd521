"""Profiles: a name for one plugin choice per stage, with its settings.

Adding a policy means writing its plugin module and naming it here and in a profile;
operators can also assemble their own profile from these names in schedd.toml.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schedd.policy.admit import quota, user_limit
from schedd.policy.anticipate import (
    defragment,
    gather,
    grow,
    opportunistic,
    prefetch,
    relieve,
    shrink,
)
from schedd.policy.decide import deadlines, pack
from schedd.policy.decide import timeslice as timeslice_turns
from schedd.policy.framework import (
    AdmitFn,
    AnticipateFn,
    AnticipateRecheckFn,
    Blocking,
    DecideFn,
    MakeRoomFn,
    OrderFn,
    RankFn,
    RecheckFn,
    Stages,
)
from schedd.policy.gittins import MIN_SAMPLES
from schedd.policy.immutable import immutable
from schedd.policy.make_room import deadline as deadline_preemption
from schedd.policy.make_room import gittins as gittins_preemption
from schedd.policy.make_room import gittins_sparing_urgent, reclaim, timeslice
from schedd.policy.make_room import las as las_preemption
from schedd.policy.make_room import priority as priority_preemption
from schedd.policy.make_room.victims import PlaceFn
from schedd.policy.order import (
    capacity,
    deadline,
    drf,
    fair_gittins,
    fair_las,
    fifo,
    gittins,
    las,
    priority,
    sjf,
)
from schedd.policy.place import best_fit, consolidate, network, topology
from schedd.policy.settings import Settings
from schedd.policy.snapshot import PendingJob

ORDERS: dict[str, OrderFn] = {
    "fifo": fifo.order,
    "priority": priority.order,
    "sjf": sjf.order,
    "las": las.order,
    "drf": drf.order,
    "capacity": capacity.order,
    "fair_las": fair_las.order,
    "gittins": gittins.order,
    "fair_gittins": fair_gittins.order,
    "deadline": deadline.order,
}
DECIDES: dict[str, DecideFn] = {
    "deadlines": deadlines.decide,
    "timeslice": timeslice_turns.decide,
    "pack": pack.decide,
}
# For each decide plugin, when it could act with no event, jobs waiting or not.
DECIDE_RECHECKS: dict[str, RecheckFn] = {
    "deadlines": deadlines.recheck_at,
    "timeslice": timeslice_turns.recheck_at,
    "pack": pack.recheck_at,
}
ANTICIPATES: dict[str, AnticipateFn] = {
    "prefetch": prefetch.anticipate,
    "opportunistic": opportunistic.anticipate,
    "defragment": defragment.anticipate,
    "gather": gather.anticipate,
    "relieve": relieve.anticipate,
    "shrink": shrink.anticipate,
    "grow": grow.anticipate,
}
# For each anticipate plugin that acts for waiting jobs, when it could act with no event
# (Plan.recheck_at), asked while jobs wait.
ANTICIPATE_RECHECKS: dict[str, RecheckFn] = {
    "prefetch": prefetch.recheck_at,
    "opportunistic": opportunistic.recheck_at,
}
# For each move (Gandiva), when a job it passed over for its age could move: asked with
# the plan, always (each says when it applies).
MOVE_RECHECKS: dict[str, AnticipateRecheckFn] = {
    "defragment": defragment.recheck_at,
    "shrink": shrink.recheck_at,
    "gather": gather.recheck_at,
    "relieve": relieve.recheck_at,
    "grow": grow.recheck_at,
}
ADMITS: dict[str, AdmitFn] = {"quota": quota.admit, "user_limit": user_limit.admit}
PLACES: dict[str, PlaceFn] = {
    "best_fit": best_fit.place,
    "topology": topology.place,
    "consolidate": consolidate.place,
    "network": network.place,
}
MAKE_ROOMS: dict[str, MakeRoomFn] = {
    "reclaim": reclaim.make_room,
    "priority": priority_preemption.make_room,
    "las": las_preemption.make_room,
    "gittins": gittins_preemption.make_room,
    "gittins_sparing_urgent": gittins_sparing_urgent.make_room,
    "deadline": deadline_preemption.make_room,
    "timeslice": timeslice.make_room,
}
# Make-room plugins that act for a job its queue's max or user's limit holds back.
OVER_LIMITS: dict[str, MakeRoomFn] = {"priority": priority_preemption.make_room_over_limit}
# For each make-room plugin, when its answer could change with no event (Plan.recheck_at).
# reclaim refuses victims only for their age: it looks again when one comes of age, while
# a queue below its guarantee has jobs waiting.
RECHECKS: dict[str, RecheckFn] = {
    "reclaim": reclaim.recheck_at,
    "priority": priority_preemption.recheck_at,
    "las": las_preemption.recheck_at,
    "gittins": gittins_preemption.recheck_at,
    "gittins_sparing_urgent": gittins_sparing_urgent.recheck_at,
    "deadline": deadline_preemption.recheck_at,
    "timeslice": timeslice.recheck_at,
}
# For each make-room plugin that finds victims only among jobs ranked below the waiting
# one, that rank of pending jobs (None: it finds them by no rank, as reclaim); a profile
# whose every make-room plugin is here answers a waiting job's twins at once
# (`Stages.waits_alike`). Not `priority`: the twins' shortcut takes a job of the same
# service for one of the same rank, and a priority is not service.
MAKE_ROOM_RANKS: dict[str, RankFn | None] = {
    "reclaim": None,
    "las": las.pending_level,
    "gittins": gittins.pending_rank,
    "gittins_sparing_urgent": gittins.pending_rank,
}
BLOCKING: tuple[Blocking, ...] = ("strict", "backfill", "skip")
ESTIMATES = ("history", "oracle")


class ProfileError(ValueError):
    """A profile names something that does not exist; `field` says where."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@immutable
class ProfileSpec:
    """What a profile names, as written in config (strings, checked by `stages`)."""

    order: str
    place: str
    admit: tuple[str, ...] = ()
    make_room: tuple[str, ...] = ()
    decide: tuple[str, ...] = ()
    anticipate: tuple[str, ...] = ()
    blocking: str = "skip"
    pending_window: int = 10_000
    tick_s: float | None = None
    estimates: str = "history"
    settings: Settings = dataclasses.field(default_factory=Settings)


def _pick(table: Mapping[str, Any], field: str, name: str) -> Any:
    if name not in table:
        raise ProfileError(field, f"unknown {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def stages(spec: ProfileSpec, label: str) -> Stages:
    blocking = _pick({b: b for b in BLOCKING}, "blocking", spec.blocking)
    _pick({e: e for e in ESTIMATES}, "estimates", spec.estimates)
    if spec.pending_window < 1:
        raise ProfileError("pending_window", "must be at least 1")
    if spec.tick_s is not None and spec.tick_s <= 0:
        raise ProfileError("tick_s", "must be positive")
    return Stages(
        order=_pick(ORDERS, "order", spec.order),
        admit=tuple(_pick(ADMITS, "admit", a) for a in spec.admit),
        place=_pick(PLACES, "place", spec.place),
        make_room=tuple(_pick(MAKE_ROOMS, "make_room", m) for m in spec.make_room),
        blocking=blocking,
        settings=spec.settings,
        label=label,
        recheck=tuple(RECHECKS[m] for m in spec.make_room if m in RECHECKS)
        + tuple(ANTICIPATE_RECHECKS[a] for a in spec.anticipate if a in ANTICIPATE_RECHECKS),
        decide=tuple(_pick(DECIDES, "decide", d) for d in spec.decide),
        anticipate=tuple(_pick(ANTICIPATES, "anticipate", a) for a in spec.anticipate),
        recheck_always=tuple(DECIDE_RECHECKS[d] for d in spec.decide if d in DECIDE_RECHECKS),
        anticipate_recheck=tuple(MOVE_RECHECKS[a] for a in spec.anticipate if a in MOVE_RECHECKS),
        waits_alike=_waits_alike(spec.make_room),
        over_limit=tuple(OVER_LIMITS[m] for m in spec.make_room if m in OVER_LIMITS),
    )


def _waits_alike(make_room: Sequence[str]) -> RankFn | None:
    if not all(m in MAKE_ROOM_RANKS for m in make_room):
        return None
    ranks = [rank for m in make_room if (rank := MAKE_ROOM_RANKS[m]) is not None]
    if len(ranks) > 1:
        return None  # a twin would have to rank no better by each
    return ranks[0] if ranks else _unranked


def _unranked(view: object) -> Callable[[PendingJob], float]:
    return lambda job: 0.0


def settings_from(values: Mapping[str, Any]) -> Settings:
    """Settings from config values, each checked against the field's type."""
    known = {f.name: f for f in dataclasses.fields(Settings)}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ProfileError(f"settings.{key}", f"unknown; known: {', '.join(sorted(known))}")
        if key == "las_thresholds_gpu_s":
            if not isinstance(value, Sequence) or not all(
                isinstance(v, int | float) and v > 0 for v in value
            ):
                raise ProfileError(f"settings.{key}", "expected a list of positive numbers")
            out[key] = tuple(sorted(float(v) for v in value))
            continue
        if key in ("deadline_efficiency", "spread_speed") and not (
            isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1
        ):
            raise ProfileError(f"settings.{key}", "expected a number above 0, at most 1")
        if key == "gittins_min_finished" and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= MIN_SAMPLES
        ):
            raise ProfileError(f"settings.{key}", f"expected a whole number ≥ {MIN_SAMPLES}")
        if key == "deadline_lease_s" and not (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 1
        ):
            raise ProfileError(f"settings.{key}", "expected a number of seconds, at least 1")
        if key == "timeslice_s" and not (
            isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        ):
            raise ProfileError(f"settings.{key}", "expected a number above 0 (seconds)")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ProfileError(f"settings.{key}", "expected a number ≥ 0")
        out[key] = type(getattr(Settings(), key))(value)
    return Settings(**out)


BUILTIN: dict[str, ProfileSpec] = {
    # Strict submission order, whole jobs on the fullest node that takes them.
    "fifo": ProfileSpec(order="fifo", place="best_fit", blocking="strict", pending_window=128),
    # Shortest job first with the true run times (a simulator baseline: an oracle).
    "sjf": ProfileSpec(order="sjf", place="best_fit", estimates="oracle"),
    # Tiresias: 2D-LAS with preemption, no knowledge of run times.
    "tiresias": ProfileSpec(order="las", place="best_fit", make_room=("las",)),
    # Dominant Resource Fairness across queues and users, with quotas and reclaim.
    "drf": ProfileSpec(
        order="drf", place="best_fit", admit=("quota", "user_limit"), make_room=("reclaim",)
    ),
    # YARN's capacity scheduler: guarantees first, borrowing up to max, reclaim.
    "capacity": ProfileSpec(
        order="capacity", place="best_fit", admit=("quota", "user_limit"), make_room=("reclaim",)
    ),
    # The default: fair across tenants; within one, the highest Gittins index of attained
    # service, learned from the service finished jobs took (2D-LAS until 256 have);
    # topology-aware placement; reclaim of guarantees; and AntMan's kinds over time: a
    # job that waited `opportunistic_after_s` without a deadline runs opportunistically
    # meanwhile on little-used GPUs, upgraded in place once it may hold its own. No
    # reservations: on the ITP traces held GPUs cost more average JCT than they saved.
    # Why each part: docs/simulator.md and docs/evaluation.md.
    "default": ProfileSpec(
        order="fair_gittins",
        place="topology",
        admit=("quota", "user_limit"),
        make_room=("reclaim", "gittins"),
        anticipate=("opportunistic",),
        settings=Settings(gittins_min_finished=256),
    ),
    # The default until 2026-11-27, without the kinds over time: every job keeps its
    # guarantee and waits for room of its own (the index learned from 32 finished jobs).
    "default-guaranteed": ProfileSpec(
        order="fair_gittins",
        place="topology",
        admit=("quota", "user_limit"),
        make_room=("reclaim", "gittins"),
    ),
    # `default-guaranteed` with 2D-LAS in place of the Gittins index (the default until
    # the ITP replays showed the index ahead on 9 traces of 10: docs/simulator.md).
    "las": ProfileSpec(
        order="fair_las",
        place="topology",
        admit=("quota", "user_limit"),
        make_room=("reclaim", "las"),
    ),
    # `las` plus reservations with backfill for blocked jobs that waited
    # `reserve_after_s` (a day): large gangs never starve, at some average JCT.
    "backfill": ProfileSpec(
        order="fair_las",
        place="topology",
        admit=("quota", "user_limit"),
        make_room=("reclaim", "las"),
        blocking="backfill",
        settings=Settings(reserve_after_s=86400.0),
    ),
    # Liquid: submission order (jobs that do not fit are passed over), network-aware
    # best fit, bursts of arrivals packed by a grouping GA, and the inputs of waiting
    # jobs copied ahead to the node expected to free up for them.
    "liquid": ProfileSpec(order="fifo", place="network", anticipate=("prefetch",)),
    # AntMan: guaranteed jobs fair across queues and users (DRF) with their full request;
    # one that waited `opportunistic_after_s` runs opportunistically meanwhile on GPUs
    # that stay little used, and is upgraded where it runs once room is there.
    "antman": ProfileSpec(
        order="drf",
        place="best_fit",
        admit=("quota", "user_limit"),
        make_room=("reclaim",),
        anticipate=("opportunistic",),
    ),
    # Gandiva: submission order (jobs that do not fit are passed over), affinity-aware
    # placement, and a job that finds no free GPUs time-slices with a running job of
    # its GPU count: they take turns by suspend/resume (weighted round-robin), or run at
    # once where both use little of the GPUs and their progress shows it pays; running
    # jobs migrate to make room on one node for a waiting job, to GPUs that came free
    # so that a time-sliced pair runs at once, or to bring a job spread over nodes onto
    # one; elastic jobs shrink to make room and grow into idle GPUs; each where the move
    # is worth its cost.
    "gandiva": ProfileSpec(
        order="fifo",
        place="topology",
        make_room=("timeslice",),
        decide=("timeslice", "pack"),
        anticipate=("shrink", "defragment", "relieve", "gather", "grow"),
    ),
    # Chronus: deadlines guaranteed by a MILP when a job arrives and at each 20-minute
    # lease, guaranteed jobs first (least slack first, preempting jobs without a
    # guarantee after a lease), everyone else by shortest remaining time; GPU counts
    # placed as 1, 2, 4 or 8n.
    # Run times as Chronus's profiler measures them: the true ones in the simulator,
    # the spec's estimated_runtime_s, else the resource estimator's, live.
    "chronus": ProfileSpec(
        order="deadline",
        place="consolidate",
        decide=("deadlines",),
        make_room=("deadline",),
        estimates="oracle",
        settings=Settings(min_run_s=1200.0),
    ),
    # `default-guaranteed` with Gandiva's mechanisms: its order and preemption first; a
    # job that finds no room and no victims takes turns with a running job of its GPU
    # count; packing, migration and grow/shrink as in `gandiva`.
    "default-gandiva": ProfileSpec(
        order="fair_gittins",
        place="topology",
        admit=("quota", "user_limit"),
        make_room=("reclaim", "gittins", "timeslice"),
        decide=("timeslice", "pack"),
        anticipate=("shrink", "defragment", "relieve", "gather", "grow"),
    ),
    # `default-guaranteed` with Chronus's admission: a deadline is guaranteed or refused
    # by the MILP when the job arrives (and decided again at each lease), and the
    # Gittins preemption spares a running job
    # whose guaranteed deadline is urgent (`deadline_urgent_s` of slack or less); the
    # order stays `default-guaranteed`'s. Run times for slack and admission as in `chronus`.
    "default-deadlines": ProfileSpec(
        order="fair_gittins",
        place="topology",
        admit=("quota", "user_limit"),
        decide=("deadlines",),
        make_room=("reclaim", "gittins_sparing_urgent"),
        estimates="oracle",
    ),
}
