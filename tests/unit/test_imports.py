"""The package's import graph: one top-level name, no cycles, pure planning, no torch in the daemon.

Parsed with ast from the source tree, counting imports inside functions too:
a lazy import that closes a cycle is still a cycle in the design.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.unit.source_tree import PACKAGES, ROOT, module_name, project_modules


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules that `name` (at `path`) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            # the deepest project module the import names (a package, a module, or a name in it)
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """Parsed once per test process (about 3 s under load): the tests below only read it."""
    modules = project_modules()
    known = set(modules)
    return {name: frozenset(imports_of(path, name, known)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    # service.py is the composition module: it imports daemon, admin and the public services.
    assert {
        "stagevisor.supervisor.daemon.core",
        "stagevisor.supervisor.admin.servicer",
        "stagevisor.supervisor.dataplane.synthesis",
    } <= graph["stagevisor.supervisor.service"]


def test_no_import_cycle_among_the_packages_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_nothing_imports_the_composition_module():
    importers = [name for name, targets in import_graph().items() if "stagevisor.supervisor.service" in targets]
    assert importers == ["stagevisor.supervisor.commands.serve"]


def test_errors_is_a_leaf():
    assert import_graph()["stagevisor.supervisor.errors"] == set()


def test_envs_is_a_leaf():
    assert import_graph()["stagevisor.supervisor.envs"] == set()


def test_numbers_is_a_leaf():
    assert import_graph()["stagevisor.supervisor.numbers"] == set()


def test_models_and_stages_never_import_the_daemon():
    """Declarations and executors may use the pure config schema, plan, errors and leaves, nothing of the runtime."""
    graph = import_graph()
    pure = {
        "stagevisor.supervisor.config",
        "stagevisor.supervisor.errors",
        "stagevisor.supervisor.install",
        "stagevisor.supervisor.envs",
        "stagevisor.supervisor.numbers",
        "stagevisor.supervisor.plan",
    }
    offenders = {
        name: sorted(t for t in targets if t.startswith("stagevisor.supervisor") and t not in pure)
        for name, targets in graph.items()
        if name.startswith(("stagevisor.models", "stagevisor.stages"))
    }
    assert {name: t for name, t in offenders.items() if t} == {}


def test_planning_modules_stay_pure():
    """config, placement and plan import no gRPC, torch, process or socket modules."""
    impure = ("grpc", "torch", "multiprocessing", "subprocess", "socket", "asyncio")
    config = sorted(f"config/{path.stem}" for path in (ROOT / "supervisor" / "config").glob("*.py"))
    placement = sorted(f"placement/{path.stem}" for path in (ROOT / "supervisor" / "placement").glob("*.py"))
    assert "config/pipeline" in config and {"placement/planner", "placement/structure"} <= set(placement)
    for name in (*config, *placement, "plan", "errors"):
        path = ROOT / "supervisor" / f"{name}.py"
        tree = ast.parse(path.read_text())
        used = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        used |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not used & set(impure), f"supervisor/{name}.py imports {sorted(used & set(impure))}"


def test_every_package_in_the_tree_is_listed_for_the_wheel():
    """pyproject.toml lists packages explicitly (the directories are mapped): a new one must be added there."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    in_tree = {module_name(init) for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")}
    assert in_tree - listed == set()


# The supervisor's layers, top to bottom: a module may import from its own layer's package and from
# any layer below it, never from one above. Foundations are single modules at the top of supervisor/.
# The front ends (the admin API, the HTTP API) sit above the runtime (cluster, daemon, worker): the daemon
# serves them through Protocols and never imports them.
LAYERS = (
    ("cli",),
    ("commands",),
    ("service",),
    ("bench", "checks"),
    ("admin", "http"),
    ("cluster",),
    ("daemon",),
    ("worker",),
    ("dataplane",),
    ("metrics",),
    ("placement",),
    (
        "errors",
        "install",
        "plan",
        "config",
        "addresses",
        "security",
        "logs",
        "pids",
        "envs",
        "numbers",
        "grpc_parsing",
        "reports",
        "_proto",
    ),
)
FOUNDATIONS = {"cli", "service"} | set(LAYERS[-1])
# Imports that still cross the order, each with the change that removes it.
KNOWN_INVERSIONS: set[tuple[str, str]] = set()


def layer_of(module: str) -> tuple[int, str]:
    unit = module.removeprefix("stagevisor.supervisor.").split(".")[0]
    for index, names in enumerate(LAYERS):
        if unit in names:
            return index, unit
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def test_every_supervisor_module_is_in_a_package_or_a_foundation():
    loose = [
        path.name
        for path in (ROOT / "supervisor").glob("*.py")
        if path.stem not in FOUNDATIONS and path.stem != "__init__"
    ]
    assert loose == []


def test_packages_import_only_downwards():
    crossings = set()
    for name, targets in import_graph().items():
        if not name.startswith("stagevisor.supervisor."):
            continue
        here, unit = layer_of(name)
        for target in targets:
            if not target.startswith("stagevisor.supervisor.") or target == "stagevisor.supervisor":
                continue
            there, other = layer_of(target)
            if there < here or (there == here and other != unit and here != len(LAYERS) - 1):
                crossings.add(
                    (name.removeprefix("stagevisor.supervisor."), target.removeprefix("stagevisor.supervisor."))
                )
    assert crossings - KNOWN_INVERSIONS == set()
    assert KNOWN_INVERSIONS - crossings == set(), "a known inversion is gone: remove it from KNOWN_INVERSIONS"


def test_the_runtime_never_imports_the_front_ends():
    """The daemon, its workers and the Ray launcher serve the admin and HTTP APIs without importing them: what
    both sides need (the config's voice names) lives below both, and service.py hands the HTTP API its settings."""
    runtime = ("daemon", "worker", "cluster", "dataplane", "metrics")
    front_ends = ("stagevisor.supervisor.http", "stagevisor.supervisor.admin")
    offenders = sorted(
        (name, target)
        for name, targets in import_graph().items()
        if name.removeprefix("stagevisor.supervisor.").split(".")[0] in runtime
        for target in targets
        if target.startswith(front_ends)
    )
    assert offenders == []
