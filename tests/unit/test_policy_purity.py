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
