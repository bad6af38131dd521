"""The queues and profiles of schedd.toml, as the policy's types.

`shared/config.py` checks the shape of the tables (types, bounds, max ≥ guarantee);
here they become `QueueSpec`s and `Profile`s, and plugin names are checked against the
policy's tables. Every error is a `ConfigError` naming the field, e.g.
`profiles.mine.order: unknown 'sjf2'; known: ...`.
"""

from __future__ import annotations

import dataclasses
import math

from schedd import policy
from schedd.policy.profiles import BUILTIN, ProfileError, ProfileSpec, settings_from
from schedd.policy.queues import QueueSpec
from schedd.policy.resources import Resources
from shared.config import ConfigError, ProfileConfig, QueueConfig, SchedConfig

# A max left out in one dimension: no bound there (quota checks compare every dimension).
UNBOUNDED_GPUS = 1 << 40
UNBOUNDED_MEMORY_MIB = 1 << 62


def queue_spec(name: str, q: QueueConfig) -> QueueSpec:
    guarantee = Resources(
        q.guarantee_gpus, q.guarantee_cpus, q.guarantee_memory_mib, q.guarantee_gpu_memory_mib
    )
    limits = (q.max_gpus, q.max_cpus, q.max_memory_mib, q.max_gpu_memory_mib)
    limited = any(limit is not None for limit in limits)
    most = (
        Resources(
            q.max_gpus if q.max_gpus is not None else UNBOUNDED_GPUS,
            q.max_cpus if q.max_cpus is not None else math.inf,
            q.max_memory_mib if q.max_memory_mib is not None else UNBOUNDED_MEMORY_MIB,
            q.max_gpu_memory_mib if q.max_gpu_memory_mib is not None else UNBOUNDED_MEMORY_MIB,
        )
        if limited
        else None
    )
    return QueueSpec(name, guarantee, most, q.weight, q.user_limit_factor)


def queue_specs(config: SchedConfig) -> tuple[QueueSpec, ...]:
    return tuple(queue_spec(name, q) for name, q in sorted(config.queues.items()))


def _spec(name: str, table: ProfileConfig, base: ProfileSpec | None) -> ProfileSpec:
    where = f"profiles.{name}"
    if base is None:
        missing = [f for f in ("order", "place") if getattr(table, f) is None]
        if missing:
            raise ConfigError(f"{where}.{missing[0]}: required for a profile that is not built in")
        base = ProfileSpec(order=str(table.order), place=str(table.place))
    changes: dict[str, object] = {}
    for field in ("order", "place", "blocking", "pending_window", "estimates"):
        value = getattr(table, field)
        if value is not None:
            changes[field] = value
    for field in ("admit", "make_room", "decide", "anticipate"):
        value = getattr(table, field)
        if value is not None:
            changes[field] = tuple(value)
    if table.tick_s is not None:
        changes["tick_s"] = table.tick_s if table.tick_s != 0 else None
    if "half_life_s" in table.settings:
        raise ConfigError(
            f"{where}.settings.half_life_s: set usage_half_life_s (top level) instead;"
            " usage is decayed with it and shares are normalised with it"
        )
    try:
        given = settings_from(table.settings)
    except ProfileError as exc:
        raise ConfigError(f"{where}.{exc.field}: {exc.reason}") from None
    changes["settings"] = dataclasses.replace(
        base.settings, **{key: getattr(given, key) for key in table.settings}
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def profiles(config: SchedConfig) -> dict[str, policy.Profile]:
    """Every profile schedd can run: the built-in ones, overridden or added to by config."""
    out = dict(policy.PROFILES)
    names = set(config.profiles)
    if config.usage_half_life_s != BUILTIN["default"].settings.half_life_s:
        names |= set(BUILTIN)  # every built-in normalises shares with the half-life
    for name in sorted(names):
        spec = _spec(name, config.profiles.get(name, ProfileConfig()), BUILTIN.get(name))
        spec = dataclasses.replace(
            spec, settings=dataclasses.replace(spec.settings, half_life_s=config.usage_half_life_s)
        )
        try:
            out[name] = policy.build(name, spec)
        except ProfileError as exc:
            raise ConfigError(f"profiles.{name}.{exc.field}: {exc.reason}") from None
    return out


def active_profile(config: SchedConfig) -> policy.Profile:
    """The profile `policy` names, built from config; raises ConfigError naming the field."""
    known = profiles(config)
    if config.policy not in known:
        raise ConfigError(
            f"policy: unknown policy profile {config.policy!r}; known: {', '.join(sorted(known))}"
        )
    return known[config.policy]
