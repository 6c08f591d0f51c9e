"""Every test that needs torch says so with the `torch` marker, so CI's torch lane (`-m torch`) runs it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _marks(node: ast.AST) -> set[str]:
    """Marker names in a decorator list or a `pytestmark = ...` value (`pytest.mark.NAME`)."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)}


def _needs_torch(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "importorskip" and n.args:
            if isinstance(n.args[0], ast.Constant) and n.args[0].value == "torch":
                return True
    return False


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per test process (the scans below read every test file)."""
    return ast.parse(path.read_text())


def unmarked_torch_tests(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("test_*.py")):
        if "gpu" in path.relative_to(root).parts:
            continue  # tests/gpu/ runs on its own machine with its own runner
        tree = parsed(path)
        module_marks: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
                module_marks |= _marks(node.value)
        module_needs = any(_needs_torch(node) for node in tree.body if not isinstance(node, ast.FunctionDef))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                marks = module_marks | set().union(*(_marks(d) for d in node.decorator_list))
                if (module_needs or _needs_torch(node)) and "torch" not in marks:
                    found.append(f"{path.relative_to(root)}::{node.name}")
    return found


def test_the_scan_finds_an_unmarked_torch_test(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        "def test_a():\n    pytest.importorskip('torch')\n\n"
        "@pytest.mark.torch\ndef test_b():\n    pytest.importorskip('torch')\n"
    )
    assert unmarked_torch_tests(tmp_path) == ["test_x.py::test_a"]


def test_every_test_that_imports_torch_is_marked_torch():
    assert unmarked_torch_tests(TESTS) == []


ROOT = TESTS.parent


def _slow_file(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            return "slow" in _marks(node.value)
    return False


def packages() -> set[str]:
    """Every package of the distribution by import name (stagevisor.supervisor.daemon, stagevisor.stages.piper...)."""
    found = set()
    for top, name in (
        ("supervisor", "stagevisor.supervisor"),
        ("stages", "stagevisor.stages"),
        ("models", "stagevisor.models"),
    ):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            if "_proto" not in parts and "_root" not in parts:
                found.add(".".join([name, *parts]))
    return found


def quick_imports(root: Path) -> set[str]:
    """Modules imported (anywhere in the file) by the test files the quick subset runs (not marked slow)."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        if "gpu" in path.relative_to(root).parts:
            continue
        tree = parsed(path)
        if path.name.startswith("test_") and _slow_file(tree):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
    return names


def test_the_quick_subset_imports_something_of_every_package():
    """`-m "not slow"` (docs/testing.md) must still reach every package of the code."""
    imported = quick_imports(TESTS)
    missing = sorted(p for p in packages() if not any(n == p or n.startswith(p + ".") for n in imported))
    assert missing == []
