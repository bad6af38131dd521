"""`@immutable`: frozen to the type checker, a plain slotted dataclass at run time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mypy import api as mypy_api

from schedd.policy.immutable import immutable
from schedd.policy.snapshot import Request


@immutable
class Point:
    x: int
    y: float = 0.0


def test_equal_values_are_equal_and_hash_alike() -> None:
    assert Point(1, 2.0) == Point(1, 2.0)
    assert Point(1, 2.0) != Point(1, 3.0)
    assert hash(Point(1, 2.0)) == hash(Point(1, 2.0))
    assert {Point(1): "a"}[Point(1)] == "a"


def test_replace_makes_a_new_value() -> None:
    p = Point(1, 2.0)
    q = dataclasses.replace(p, y=5.0)
    assert (p, q) == (Point(1, 2.0), Point(1, 5.0))


def test_slotted() -> None:
    assert not hasattr(Point(1), "__dict__")


@immutable
class Hashed:
    """Hashed by its own rule, as `Request` caches its hash."""

    value: int

    def __hash__(self) -> int:
        return 7


def test_a_class_with_its_own_hash_keeps_it() -> None:
    assert hash(Hashed(1)) == hash(Hashed(2)) == 7
    r = Request(2, 8.0, 1024)
    assert hash(r) == r._hash


@immutable
class Loose:
    """Equal whatever its note says."""

    value: int
    note: str = ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Loose) and other.value == self.value


def test_a_class_with_its_own_equality_is_hashed_as_a_frozen_one_would_be() -> None:
    assert hash(Loose(1, "a")) == hash(Loose(1, "a"))
    assert Loose(1, "a") == Loose(1, "b")


def test_the_type_checker_refuses_an_assignment(tmp_path: Path) -> None:
    source = tmp_path / "assigns.py"
    source.write_text(
        "from schedd.policy.immutable import immutable\n"
        "@immutable\n"
        "class Point:\n"
        "    x: int\n"
        "p = Point(1)\n"
        "p.x = 2\n"
    )
    out, _, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)]
    )
    assert status == 1
    assert 'Property "x" defined in "Point" is read-only' in out
