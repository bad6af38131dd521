"""Answers kept from one plan to the next while the objects they came from are the same.

A shell that keeps its snapshot parts between plans (the simulator hands the policy the
very same `placed` and `pending` tuples until something in them changes) lets the policy
skip work whose inputs it has seen. Each `Kept` holds one answer and the objects it was
computed from, compared by identity (and held, so that an id is never reused while
kept). Like `placed_totals`, this is a memo, not state: no I/O, and a plan returns what
it would without it. Not thread-safe: plan() runs on one thread.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import is_
from typing import Generic, TypeVar

T = TypeVar("T")

# How to drop each memo kept between plans (`forget_all`).
_FORGETTERS: list[Callable[[], None]] = []


def forgettable(forget: Callable[[], None]) -> None:
    """Have `forget_all` call `forget`: for a module's memo that is no `Kept`."""
    _FORGETTERS.append(forget)


def forget_all() -> None:
    """Drop every memo kept between plans, so that the next plan computes afresh: for a
    shell after a plan that raised, which may have left a memo half mended."""
    for forget in _FORGETTERS:
        forget()


class Kept(Generic[T]):
    """One module-level memo (each registers itself with `forget_all`: make none per
    call)."""

    __slots__ = ("_inputs", "_value")

    def __init__(self) -> None:
        self._inputs: tuple[object, ...] = ()
        self._value: T | None = None
        forgettable(self.forget)

    def forget(self) -> None:
        self._inputs, self._value = (), None

    def get(self, *inputs: object) -> T | None:
        """The answer kept for exactly these objects, or None."""
        kept = self._inputs
        if len(kept) == len(inputs) and all(map(is_, kept, inputs)):
            return self._value
        return None

    def last(self) -> T | None:
        """The answer kept, whatever it was computed from."""
        return self._value

    def put(self, value: T, *inputs: object) -> T:
        self._inputs, self._value = inputs, value
        return value
