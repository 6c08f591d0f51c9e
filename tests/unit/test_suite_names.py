"""Every test file's name is unique across tests/: the folders have no __init__.py, so pytest imports each file
as a top-level module by its name, and a second file of the same name fails the whole suite's collection
("import file mismatch") though each tier alone collects."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") and "__pycache__" not in path.parts:
            by_name[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"


def test_no_test_file_imports_another():
    """A test module is not a library: importing one runs its module code a second time under another name, and
    couples two files' tests. What several files share lives in a helper module (docs/testing.md)."""
    import ast

    offenders = []
    for path in TESTS.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(TESTS)} imports {name}"
                for name in names
                if name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")
            ]
    assert not offenders, offenders
