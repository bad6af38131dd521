"""The policy core stays pure: no I/O, no clock, no unseeded randomness, no event loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

POLICY = Path(__file__).parents[2] / "schedd" / "policy"
ALLOWED_MODULES = {
    "__future__",
    "bisect",
    "collections",
    "collections.abc",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "math",
    "operator",
    "statistics",
    "typing",
    "shared.model",
    # Computation only: the MILP solver of deadline admission, run with its output off.
    "highspy",
    "numpy",
    # Only as random.Random(seed): `seeded_randomness_only` below checks every use.
    "random",
}
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


def modules() -> list[Path]:
    return sorted(POLICY.rglob("*.py"))


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_policy_package_has_modules() -> None:
    assert len(modules()) >= 4


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_policy_module_imports_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    impure = {
        name
        for name in imported(tree)
        if name not in ALLOWED_MODULES and not name.startswith("schedd.policy")
    }
    assert not impure, f"{path.name} imports {sorted(impure)}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_policy_module_calls_no_io_builtins_and_awaits_nothing(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        assert not isinstance(node, ast.AsyncFunctionDef | ast.Await), f"{path.name}: async code"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"


def test_the_checker_sees_an_impure_import() -> None:
    assert imported(ast.parse("import os\nfrom asyncio import sleep")) == {"os", "asyncio"}


def unseeded_randomness(tree: ast.AST) -> list[str]:
    """Uses of the `random` module other than constructing `random.Random(seed)`."""
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "random":
            found.append(f"from random import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found += [
                f"import random as {a.asname}"
                for a in node.names
                if a.name == "random" and a.asname
            ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
        ):
            call = calls.get(id(node))  # None: a type annotation
            if node.attr != "Random" or (call is not None and len(call.args) != 1):
                found.append(f"random.{node.attr}")
    return found


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.name)
def test_policy_module_uses_only_seeded_randomness(path: Path) -> None:
    assert not unseeded_randomness(ast.parse(path.read_text())), path.name


def test_the_checker_sees_unseeded_randomness() -> None:
    assert unseeded_randomness(ast.parse("import random\nrandom.Random(7)")) == []
    assert unseeded_randomness(ast.parse("import random\nrandom.shuffle(x)")) == ["random.shuffle"]
    assert unseeded_randomness(ast.parse("import random\nrandom.Random()")) == ["random.Random"]
    assert unseeded_randomness(ast.parse("import random as r")) == ["import random as r"]
    assert unseeded_randomness(ast.parse("from random import choice")) == [
        "from random import choice"
    ]
