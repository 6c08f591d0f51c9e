"""mypy's strict list in pyproject.toml covers every module that declares a seam (a Protocol others implement)."""

from __future__ import annotations

import ast
import fnmatch
import tomllib

from tests.unit.source_tree import ROOT, module_name

SEAM_MODULES = {
    "stagevisor.supervisor.daemon.core",
    "stagevisor.supervisor.daemon.autoscale",
    "stagevisor.supervisor.http.app",
    "stagevisor.supervisor.dataplane.link.outbound",
    "stagevisor.supervisor.reports",
}
"""The seams named without a Protocol of their own: the daemon, the HTTP app, the links, the typed reports."""


def strict_patterns() -> list[str]:
    overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
    strict = [o for o in overrides if o.get("disallow_untyped_defs") and o.get("warn_return_any")]
    assert len(strict) == 1, "one override carries the strict flags"
    return list(strict[0]["module"])


def is_strict(module: str, patterns: list[str]) -> bool:
    return any(module == p or (p.endswith(".*") and fnmatch.fnmatch(module, p)) for p in patterns)


def declares_protocol(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if (isinstance(base, ast.Name) and base.id == "Protocol") or (
                    isinstance(base, ast.Attribute) and base.attr == "Protocol"
                ):
                    return True
    return False


def test_every_module_declaring_a_protocol_is_checked_strictly():
    patterns = strict_patterns()
    loose = sorted(
        module_name(path)
        for path in (ROOT / "supervisor").rglob("*.py")
        if "_proto" not in path.parts and declares_protocol(ast.parse(path.read_text()))
        if not is_strict(module_name(path), patterns)
    )
    assert loose == []


def test_the_named_seam_modules_are_checked_strictly():
    patterns = strict_patterns()
    assert sorted(m for m in SEAM_MODULES if not is_strict(m, patterns)) == []


def test_the_scope_check_sees_a_protocol_and_a_wildcard():
    assert declares_protocol(ast.parse("class A(Protocol): ...")) and not declares_protocol(ast.parse("class A: ..."))
    assert is_strict("stagevisor.supervisor.placement.structure", ["stagevisor.supervisor.placement.*"])
    assert not is_strict("stagevisor.supervisor.placementx", ["stagevisor.supervisor.placement.*"])
