"""`@immutable`: the policy's immutable value classes (snapshots, requests, actions, waits).

To the type checker an `@immutable` class is a frozen dataclass: assigning to a field is an
error, and `make test` runs mypy --strict over all of schedd. At run time it is a
slotted dataclass with the same fields, equality, hash and `dataclasses.replace`, whose
`__init__` assigns its fields directly: a frozen dataclass sets each one through
`object.__setattr__`, which made building one about three times as slow, and a plan
over 10,000 pending jobs builds tens of thousands (a tenth of its instructions went to it;
docs/policies.md#planning-speed). What is given up is the run-time guard alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def immutable(cls: type[T]) -> type[T]:
    # The hash a frozen dataclass would have: one of its own (a cached one) kept, else
    # made from the fields, also where the class defines __eq__ (which sets __hash__ to
    # None in it, as dataclasses reads it).
    own = cls.__dict__.get("__hash__", _ABSENT)
    explicit = own is not _ABSENT and not (own is None and "__eq__" in cls.__dict__)
    return dataclass(slots=True, unsafe_hash=not explicit)(cls)


_ABSENT = object()
