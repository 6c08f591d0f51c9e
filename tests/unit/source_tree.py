"""The package's source tree as module names: the repository root, each top-level folder's package, and every
module's dotted name (generated protobuf modules aside), for the import-graph and mypy-scope tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"supervisor": "stagevisor.supervisor", "stages": "stagevisor.stages", "models": "stagevisor.models"}


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT)
    if relative.parts[:2] == ("supervisor", "_root"):
        parts = ["stagevisor", *relative.parts[2:]]
    else:
        parts = [PACKAGES[relative.parts[0]], *relative.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            if "_proto" not in path.parts:
                modules[module_name(path)] = path
    return modules
