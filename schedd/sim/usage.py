"""Decayed GPU usage per queue and per (queue, user), as the live store keeps it.

Each key's usage is the integral of the GPUs it held, each GPU-second weighted by
2^(-age / half_life). Kept exactly and lazily: a key's value is brought up to date only
when its GPU count changes or a snapshot reads it, so the cost per event is the number
of keys touched, not the number of running jobs.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from schedd.policy.snapshot import Usage

DAY_S = 86_400.0
K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class _Account:
    value: float = 0.0  # decayed GPU-seconds as of `as_of`
    gpus: int = 0  # GPUs held since `as_of`
    as_of: float = 0.0


@dataclass(slots=True)
class DecayingMeter(Generic[K]):
    half_life_s: float
    accounts: dict[K, _Account] = field(default_factory=dict)

    @property
    def _tau(self) -> float:
        return self.half_life_s / math.log(2)

    def _advance(self, account: _Account, now: float) -> None:
        elapsed = now - account.as_of
        if elapsed > 0:
            keep = math.exp(-elapsed / self._tau)
            account.value = account.value * keep + account.gpus * self._tau * (1.0 - keep)
            account.as_of = now

    def change(self, key: K, gpus: int, now: float) -> None:
        """`key` holds `gpus` more (negative: fewer) GPUs from `now` on."""
        account = self.accounts.get(key)
        if account is None:
            account = self.accounts[key] = _Account(as_of=now)
        self._advance(account, now)
        account.gpus += gpus

    def values(self, now: float) -> dict[K, float]:
        for account in self.accounts.values():
            self._advance(account, now)
        return {key: a.value for key, a in self.accounts.items()}


class UsageBook:
    """Both meters, and the `Usage` for a snapshot at `now` (cached per instant)."""

    def __init__(self, half_life_s: float = DAY_S) -> None:
        if not half_life_s > 0:
            raise ValueError("half-life must be > 0 seconds")
        self.queues: DecayingMeter[str] = DecayingMeter(half_life_s)
        self.users: DecayingMeter[tuple[str, str]] = DecayingMeter(half_life_s)
        self._cached: tuple[float, Usage] | None = None

    def change(self, queue: str, user: str, gpus: int, now: float) -> None:
        self.queues.change(queue, gpus, now)
        self.users.change((queue, user), gpus, now)
        self._cached = None

    def at(self, now: float) -> Usage:
        if self._cached is not None and self._cached[0] == now:
            return self._cached[1]
        usage = Usage(queues=self.queues.values(now), users=self.users.values(now))
        self._cached = (now, usage)
        return usage
