"""Mutation testing with cosmic-ray (the pure core, the serving surface): plant one bug at a time, count the kills.

Run by hand from the repository root (one test run per mutant: minutes per
module; not part of the suite or of .ci/run). On a shared machine always under
`nice -n 19`:

    pip install -e '.[mutation]'
    nice -n 19 python tests/mutation/run.py                      # every module in TARGETS
    nice -n 19 python tests/mutation/run.py core                 # the modules of the pure core (or: surface)
    nice -n 19 python tests/mutation/run.py lifecycle streams    # a few at a time
    python tests/mutation/run.py --report                        # print the last results, run nothing
    nice -n 19 python tests/mutation/run.py --planted            # the hand-planted bugs only (or: --planted speech)
    nice -n 19 python tests/mutation/run.py --retest-survivors   # after adding tests: survivors, timeouts

Per mutant, only the tests that execute the mutated statement, out of the
unit test files listed for the module in TARGETS, run (recorded once under
coverage; --all-tests runs the whole list), with `-x` (stop at the first
failure), without the pytest plugins none of them use, through a warm pytest
server (tests/mutation/warm.py) that imports pytest, grpc, pydantic (torch where the tests use it)
and numpy once and forks a fresh process per mutant; a run that takes 5x the
unmutated run (at least 15 s) is stopped and counted as killed (the report's
`timeout` column counts these apart). A mutant is never tested by a cold pytest
instead: when the warm server is gone or answers badly, the mutant is not
counted, the server is restarted and the mutant tested again; after
MAX_RESTARTS restarts the run stops with an error. `--jobs N` tests N mutants at once (each process
with its own copy of the tree, session shard and warm server; the results
are merged back into the module's session, also after an interruption).

It never touches the working tree: the sources and tests are copied to
`.mutation/tree/` (git-ignored) and the copy is imported as `stagevisor`, so
you can keep working while it runs. One cosmic-ray session per module lives in
`.mutation/<module>.sqlite`; a session is resumed where it stopped, and
started over when the module's code changed (a change only inside type
annotations or comments keeps it: every recorded mutant is still the same code in the same place).

Counted: every cosmic-ray mutant of the module, except mutants inside type
annotations (strings at run time under `from __future__ import annotations`)
and the operator replacements in EXCLUDED_OPERATORS: like PIT's defaults, a
comparison is mutated to its boundary twin and its negation (`<` to `<=` and
`>=`), and an arithmetic operator to the one a hand slips to (`+` to `-`),
not to every operator that would parse (`+` to `<<`, `==` to `is`), whose
mutants are killed by any test that runs the line or are equivalent in CPython.
Kill rate = killed / (killed + survived), with timeouts counted as killed (a
mutant that makes the tests hang is caught). Survivors listed in
`tests/mutation/equivalent.toml` with a reason are reported as equivalent and
left out of the rate; every other survivor is printed with its diff.
Exit status 1 when the rate of any module run is under --fail-under.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT_FILE = Path(__file__).with_name("equivalent.toml")
PLANTED_FILE = Path(__file__).with_name("planted.toml")


def _load_warm():  # noqa: ANN202 - the module object of tests/mutation/warm.py (not a package)
    spec = importlib.util.spec_from_file_location("mutation_warm", Path(__file__).with_name("warm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WARM = _load_warm()


@dataclass(frozen=True)
class Target:
    source: str
    tests: tuple[str, ...]
    torch: bool = False
    """Whether the tests use torch: the warm server then imports it once (seconds of CPU per server)."""


CODEC_TESTS = (
    "dataplane/test_codec_edges.py",
    "dataplane/test_codec.py",
    "dataplane/test_codec_release.py",
    "dataplane/test_codec_packed.py",
    "dataplane/test_cuda_ipc.py",
    "dataplane/test_dataplane_peers.py",
    "dataplane/test_runtime.py",
)
"""The tests of the codec and the modules it is made of (encoding, decoding, dtypes, out-of-line buffers)."""

TOPOLOGY_RULES_TESTS = (
    "placement/test_rules.py",
    "placement/test_placement.py",
    "placement/test_placement_rules.py",
    "placement/test_runtime_fractions.py",
    "placement/test_replicas_plan.py",
)
"""The tests of the placement rules (structure, groups, GPU accounting, runtime fractions), through the planner."""

GATEWAY_TESTS = (
    "dataplane/test_gateway_requests.py",
    "dataplane/test_handed_on.py",
    "dataplane/test_gateway_retire.py",
    "dataplane/test_gateway_audio.py",
    "dataplane/test_gateway_shm_fallback.py",
    "dataplane/test_stage_error_codes.py",
    "dataplane/test_replicas.py",
    "dataplane/test_runtime.py",
    "dataplane/test_runtime_synthesis.py",
    "dataplane/test_synthesis_errors.py",
    "dataplane/test_dataplane_peers.py",
    "dataplane/test_request_limits.py",
    "dataplane/test_link_descriptors.py",
)
"""The tests of the gateway and its base InFlight (requests in flight, failed as workers come and go)."""

# The pure core and the unit tests that speak for each module (only these run per mutant;
# pytest stops at the first failure, so the sharpest, fastest file comes first).
TARGETS: dict[str, Target] = {
    "placement": Target(
        "supervisor/placement/planner.py",
        (
            "placement/test_planner.py",
            "placement/test_placement.py",
            "placement/test_placement_rules.py",
            "placement/test_runtime_fractions.py",
            "placement/test_replicas_plan.py",
            "daemon/test_autoscale.py",
        ),
    ),
    "placement_options": Target(
        "supervisor/placement/options.py",
        (
            "placement/test_planner.py",
            "placement/test_placement.py",
            "placement/test_placement_rules.py",
            "placement/test_replicas_plan.py",
            "placement/test_rules.py",
        ),
    ),
    "placement_structure": Target("supervisor/placement/structure.py", TOPOLOGY_RULES_TESTS),
    "placement_groups": Target("supervisor/placement/groups.py", TOPOLOGY_RULES_TESTS),
    "placement_gpu_accounting": Target("supervisor/placement/gpu_accounting.py", TOPOLOGY_RULES_TESTS),
    "placement_runtime_fractions": Target("supervisor/placement/runtime_fractions.py", TOPOLOGY_RULES_TESTS),
    "placement_wording": Target("supervisor/placement/wording.py", TOPOLOGY_RULES_TESTS),
    "config_pipeline": Target(
        "supervisor/config/pipeline.py",
        (
            "config/test_config_validation.py",
            "config/test_config.py",
            "placement/test_placement.py",
            "placement/test_placement_rules.py",
            "models/test_models.py",
        ),
    ),
    "config_file": Target(
        "supervisor/config/file.py",
        (
            "config/test_config_validation.py",
            "config/test_config.py",
            "placement/test_placement.py",
            "placement/test_placement_rules.py",
            "models/test_models.py",
        ),
    ),
    "config_validation": Target(
        "supervisor/config/validation.py",
        ("config/test_config_validation.py", "config/test_config_locations.py", "config/test_config.py"),
    ),
    "config_loading": Target(
        "supervisor/config/loading.py",
        ("config/test_config_locations.py", "config/test_config_validation.py", "config/test_config.py"),
    ),
    "config_locations": Target(
        "supervisor/config/locations.py",
        ("config/test_config_locations.py", "config/test_config_validation.py", "config/test_config.py"),
    ),
    "lifecycle": Target(
        "supervisor/daemon/lifecycle.py", ("daemon/test_lifecycle.py", "daemon/test_lifecycle_runner.py")
    ),
    "streams": Target("supervisor/dataplane/streams.py", ("dataplane/test_streams.py", "dataplane/test_runtime.py")),
    "codec": Target("supervisor/dataplane/codec.py", CODEC_TESTS, torch=True),
    "codec_decoding": Target("supervisor/dataplane/decoding.py", CODEC_TESTS, torch=True),
    "codec_dtypes": Target("supervisor/dataplane/dtypes.py", CODEC_TESTS, torch=True),
    "codec_out_of_line": Target("supervisor/dataplane/out_of_line.py", CODEC_TESTS, torch=True),
    # The serving surface: what guards the service (keys, files, limits, admission, shared memory,
    # replica routing and draining) and what speaks to its clients (HTTP speech, audio, metrics).
    "security_files": Target("supervisor/security/files.py", ("test_security_rules.py", "test_security.py")),
    "security_server": Target("supervisor/security/server.py", ("test_security_rules.py", "test_security.py")),
    "security_client": Target("supervisor/security/client.py", ("test_security_rules.py", "test_security.py")),
    "http_auth": Target("supervisor/http/auth.py", ("test_security_rules.py", "test_security.py")),
    "runtime_files": Target(
        "supervisor/daemon/runtime_files.py", ("daemon/test_runtime_files_edges.py", "daemon/test_runtime_files.py")
    ),
    "admission": Target(
        "supervisor/dataplane/admission.py", ("dataplane/test_admission_boundaries.py", "dataplane/test_admission.py")
    ),
    "limits": Target(
        "supervisor/dataplane/limits.py",
        (
            "dataplane/test_request_limits_boundaries.py",
            "dataplane/test_request_limits.py",
            "dataplane/test_synthesis_errors.py",
        ),
    ),
    "shm": Target(
        "supervisor/dataplane/shm.py",
        (
            "dataplane/test_shm.py",
            "dataplane/test_codec.py",
            "dataplane/test_codec_release.py",
            "dataplane/test_codec_edges.py",
            "dataplane/test_dataplane_peers.py",
        ),
    ),
    "replica_routing": Target("supervisor/dataplane/replicas.py", ("dataplane/test_replicas.py",)),
    "gateway": Target("supervisor/dataplane/gateway.py", GATEWAY_TESTS),
    "gateway_in_flight": Target("supervisor/dataplane/in_flight.py", GATEWAY_TESTS),
    "worker_runtime": Target(
        "supervisor/dataplane/runtime.py",
        (
            "dataplane/test_runtime.py",
            "dataplane/test_runtime_held.py",
            "dataplane/test_handed_on.py",
            "dataplane/test_replicas.py",
            "dataplane/test_dataplane_frames.py",
            "dataplane/test_dataplane_peers.py",
            "dataplane/test_stage_error_codes.py",
            "dataplane/test_link_descriptors.py",
        ),
    ),
    "request_handle": Target(
        "supervisor/dataplane/request_handle.py",
        (
            "dataplane/test_request_handle.py",
            "dataplane/test_gateway_requests.py",
            "dataplane/test_handed_on.py",
            "dataplane/test_gateway_audio.py",
            "dataplane/test_synthesis_errors.py",
            "dataplane/test_client_failures.py",
        ),
    ),
    "replica_sets": Target("supervisor/daemon/replicas.py", ("daemon/test_replica_sets.py",)),
    "voice_store": Target(
        "supervisor/http/voice_store.py",
        ("http/test_voice_store.py", "http/test_voice_names_and_store.py", "http/test_http_upload.py"),
    ),
    "speech": Target(
        "supervisor/http/speech.py",
        ("http/test_http_speech.py", "http/test_http_speech_request.py", "http/test_http_openapi.py"),
    ),
    "audio": Target("supervisor/http/audio.py", ("http/test_http_audio.py",)),
    "metrics_registry": Target(
        "supervisor/metrics/registry.py",
        ("metrics/test_metrics_registry.py", "metrics/test_metrics_collector.py", "metrics/test_metrics.py"),
    ),
    "metrics_totals": Target(
        "supervisor/metrics/totals.py",
        ("metrics/test_metrics_registry.py", "metrics/test_metrics_collector.py", "metrics/test_metrics.py"),
    ),
    "metrics_collector": Target(
        "supervisor/metrics/collector.py", ("metrics/test_metrics_collector.py", "metrics/test_metrics.py")
    ),
    # The daemon's live topology changes: apply, operator restarts, autoscaling (replica_sets above scales).
    "live_change": Target(
        "supervisor/daemon/live_change.py",
        ("daemon/test_daemon_apply.py", "admin/test_admin_apply.py", "daemon/test_daemon_shutdown.py"),
    ),
    "apply_checks": Target(
        "supervisor/daemon/apply_checks.py", ("daemon/test_daemon_apply.py", "admin/test_admin_apply.py")
    ),
    "restarts": Target(
        "supervisor/daemon/restarts.py",
        (
            "daemon/test_daemon_restart.py",
            "daemon/test_restart_counts.py",
            "daemon/test_daemon_apply.py",
            "daemon/test_replica_sets.py",
        ),
    ),
    "autoscale": Target("supervisor/daemon/autoscale.py", ("daemon/test_autoscale.py",)),
    # The default voice (hibari): its DSP in runs, its options and G2P, and its stages (needs the demo extra).
    "hibari_render": Target("stages/hibari/render.py", ("stages/test_hibari.py",)),
    "hibari_voice": Target("stages/hibari/voice.py", ("stages/test_hibari.py",)),
    "hibari_executors": Target("stages/hibari/executors.py", ("stages/test_hibari.py",)),
    # Qwen3-TTS's serving logic (needs the qwen3 extra beside the mutation one).
    "qwen3_turns": Target("stages/qwen3/turns.py", ("stages/test_qwen3_turns.py",), torch=True),
    "qwen3_references": Target("stages/qwen3/references.py", ("stages/test_qwen3_references.py",), torch=True),
}
GROUPS = {
    "core": (
        "placement",
        "placement_options",
        "placement_structure",
        "placement_groups",
        "placement_gpu_accounting",
        "placement_runtime_fractions",
        "placement_wording",
        "config_pipeline",
        "config_file",
        "config_validation",
        "config_loading",
        "config_locations",
        "lifecycle",
        "streams",
        "codec",
        "codec_decoding",
        "codec_dtypes",
        "codec_out_of_line",
    ),
    "surface": (
        "security_files",
        "security_server",
        "security_client",
        "http_auth",
        "runtime_files",
        "admission",
        "limits",
        "shm",
        "replica_routing",
        "gateway",
        "gateway_in_flight",
        "worker_runtime",
        "request_handle",
        "replica_sets",
        "speech",
        "audio",
        "metrics_registry",
        "metrics_totals",
        "metrics_collector",
        "voice_store",
    ),
    "changes": ("live_change", "apply_checks", "restarts", "autoscale", "replica_sets"),
}
"""Names for several modules at once: the pure core, the serving surface and the live topology changes."""

# Which mutants count: one realistic slip per operator, as PIT's defaults do (boundary and
# negated conditionals, one math swap), not every operator cosmic-ray can put in its place.
_KEPT_COMPARISONS = {  # operator -> the replacements kept: its boundary twin and its negation
    "Lt": ("LtE", "GtE"),
    "LtE": ("Lt", "Gt"),
    "Gt": ("GtE", "LtE"),
    "GtE": ("Gt", "Lt"),
    "Eq": ("NotEq",),
    "NotEq": ("Eq",),
    "Is": ("IsNot",),
    "IsNot": ("Is",),
    "In": ("NotIn",),
    "NotIn": ("In",),
}
_KEPT_BINARY = {  # the swaps a hand makes by mistake: + and -, * and /, // and /, | and &
    "Add": ("Sub",),
    "Sub": ("Add",),
    "Mul": ("Div",),
    "Div": ("Mul",),
    "FloorDiv": ("Div",),
    "Mod": ("FloorDiv",),
    "Pow": ("Mul",),
    "BitOr": ("BitAnd",),
    "BitAnd": ("BitOr",),
}
EXCLUDED_OPERATORS = (
    r"core/ReplaceComparisonOperator_(?!"
    + "|".join(f"{op}_({'|'.join(kept)})$" for op, kept in _KEPT_COMPARISONS.items())
    + ")",
    r"core/ReplaceBinaryOperator_(?!"
    + "|".join(f"{op}_({'|'.join(kept)})$" for op, kept in _KEPT_BINARY.items())
    + ")",
)
_EXCLUDED = re.compile("|".join(f"(?:{e})" for e in EXCLUDED_OPERATORS))


@dataclass(frozen=True)
class Planted:
    """A bug planted by hand: `old` replaced by `new` in `source` (one occurrence each)."""

    what: str
    source: str
    edits: tuple[tuple[str, str], ...]
    tests: tuple[str, ...]


# Hand-planted bugs of the pure core that its tests once missed, kept as a regression check: each must be killed.
# The serving surface's planted bugs are in tests/mutation/planted.toml (load_planted).
PLANTED = (
    Planted(
        "placement_gpu_accounting: the per-GPU limit check without its floating-point tolerance",
        "supervisor/placement/gpu_accounting.py",
        (("if total > limit + TOLERANCE:", "if total > limit:"),),
        ("placement/test_placement_rules.py", "placement/test_placement.py"),
    ),
    Planted(
        "worker_runner: the crash count never reset after a stable run",
        "supervisor/daemon/runner.py",
        (("ready_for=self._clock() - self._ready_at)", "ready_for=None)"),),
        ("daemon/test_lifecycle_runner.py",),
    ),
    Planted(
        "worker_runner: a revived FAILED group keeps its spent restart budget",
        "supervisor/daemon/runner.py",
        (
            (
                "                self.policy.reset()  # the operator revives",
                "                pass  # the operator revives",
            ),
        ),
        ("daemon/test_lifecycle_runner.py",),
    ),
    Planted(
        "streams: abandon() returns one credit too few",
        "supervisor/dataplane/streams.py",
        (("for _ in range(pending):", "for _ in range(pending - 1):"),),
        ("dataplane/test_streams.py", "dataplane/test_runtime.py"),
    ),
    Planted(
        "lifecycle: an illegal transition READY -> STARTING added with its docstring line",
        "supervisor/daemon/lifecycle.py",
        (
            ("        (S.READY, S.STOPPING),\n", "        (S.READY, S.STOPPING),\n        (S.READY, S.STARTING),\n"),
            (
                "    - READY    -> STOPPING   shutdown or operator restart\n",
                "    - READY    -> STOPPING   shutdown or operator restart\n"
                "    - READY    -> STARTING   a worker restarts in place\n",
            ),
        ),
        ("daemon/test_lifecycle.py", "daemon/test_lifecycle_runner.py"),
    ),
)


def load_planted() -> tuple[Planted, ...]:
    """PLANTED, then the serving surface's bugs of tests/mutation/planted.toml, each with its module's tests."""
    entries = tomllib.loads(PLANTED_FILE.read_text()).get("planted", []) if PLANTED_FILE.exists() else []
    return PLANTED + tuple(
        Planted(
            f"{e['module']}: {e['what']}",
            TARGETS[e["module"]].source,
            ((e["old"], e["new"]),),
            TARGETS[e["module"]].tests,
        )
        for e in entries
    )


_SUMMARY_LINE = re.compile(r"(?:FAILED|ERROR) (\S.*?)(?: - |$)")
"""A line of pytest's short summary (the test that failed, first); a captured log line has spaces after ERROR."""


def run_planted(work: Path, sources: set[str] | None = None) -> int:
    """Apply each planted bug (of `sources` only, if given) to a fresh copy, run its unit tests, report each."""
    tree = copy_tree(work)
    env = test_env(tree)
    bugs = [bug for bug in load_planted() if sources is None or bug.source in sources]
    # pytest's temporary directories straight under the run's own (not under the suite's svt-* one inside it): a
    # daemon's socket paths under the nested one ran past MAX_UNIX_PATH, and every test starting a daemon failed.
    basetemp = ["--basetemp", str(Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "t")]
    # Each list of tests must pass unplanted first: one failing anyway (a socket path too long under the run's
    # temporary directory, say) would count every bug planted for it as killed, by no test of the bug.
    for tests in dict.fromkeys(bug.tests for bug in bugs):
        command = [*shlex.split(test_command(tree, Target("", tests))), *basetemp]
        baseline = subprocess.run(
            command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
        )
        if baseline.returncode != 0:
            raise SystemExit(
                f"the unit tests {', '.join(tests)} fail with no bug planted, so no planted bug can be judged by "
                f"them; fix them first:\n{baseline.stdout}"
            )
    survived = 0
    print("\nhand-planted bugs:")
    for bug in bugs:
        path = tree / bug.source
        original = path.read_text()
        mutated = original
        for old, new in bug.edits:
            if mutated.count(old) != 1:
                raise SystemExit(f"{bug.what}: cannot plant it, {old!r} is not in {bug.source} exactly once")
            mutated = mutated.replace(old, new)
        line = original[: original.index(bug.edits[0][0])].count("\n") + 1
        path.write_text(mutated)
        try:
            command = [*shlex.split(test_command(tree, Target(bug.source, bug.tests))), *basetemp]
            result = subprocess.run(
                command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
            )
        finally:
            path.write_text(original)
        killed = result.returncode != 0
        survived += not killed
        # pytest's summary lines (`FAILED tests/...::test - ...`), not a captured log's (`ERROR    logger:...`).
        failing = [m.group(1) for m in map(_SUMMARY_LINE.match, result.stdout.splitlines()) if m]
        print(
            f"  {'killed  ' if killed else 'SURVIVED'} {bug.source}:{line} {bug.what}"
            + (f"\n           by {failing[0]}" if failing else "")
        )
    print(f"{len(bugs) - survived} of {len(bugs)} killed")
    return 1 if survived else 0


def tool(name: str) -> str:
    """A console script of this interpreter's environment (works without activating the venv)."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


def hold_workdir(work: Path) -> io.TextIOWrapper:
    """Lock `work` for this run (released when the process ends): a second run would copy the tree over the one
    the first is testing, whose mutants would then fail on missing files and count as killed."""
    handle = open(work / ".lock", "w")  # noqa: SIM115 - held open for the whole run: the lock lives as long
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise SystemExit(
            f"another mutation run is using {work}: wait for it to end, or give this one its own --workdir"
        ) from None
    return handle


def copy_tree(work: Path) -> Path:
    """Copy the package sources and tests into work/tree; build work/tree/_import/stagevisor over them."""
    tree = work / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in ("supervisor", "stages", "models", "tests", "deploy", "docs"):  # some tests read deploy/ and docs/
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, tree / name, ignore=ignore, symlinks=True)
    shutil.copy2(ROOT / "pyproject.toml", tree / "pyproject.toml")
    package = tree / "_import" / "stagevisor"
    shutil.copytree(tree / "supervisor" / "_root", package)
    for name in ("supervisor", "stages", "models"):
        (package / name).symlink_to(tree / name, target_is_directory=True)
    return tree


def test_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The copy comes first on sys.path, ahead of the installed (editable) stagevisor.
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "_import"), str(tree)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # same-size mutants within one second must not reuse stale bytecode
    return env


# Plugins none of the selected tests use, whose import alone (hypothesis pulls in trio) took
# seconds per run on a loaded machine.
UNUSED_PLUGINS = ("hypothesispytest", "anyio", "schemathesis", "benchmark", "xdist", "xdist.looponfail")
# Imported once by the warm server (tests/mutation/warm.py), not again per mutant.
PRELOAD = ("pydantic", "yaml", "numpy", "grpc", "google.protobuf", "psutil", "asyncio", "pytest_timeout")


def pytest_args(tree: Path, target: Target) -> list[str]:
    plugins = [a for name in UNUSED_PLUGINS for a in ("-p", f"no:{name}")]
    return [
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        *plugins,
        "--rootdir",
        str(tree),
        *(str(tree / "tests" / "unit" / t) for t in target.tests),
    ]


def test_command(tree: Path, target: Target) -> str:
    return shlex.join([sys.executable, "-m", "pytest", *pytest_args(tree, target)])


def warm_command(tree: Path, target: Target, socket_path: Path, selection: tuple[Path, Path] | None) -> str:
    """The per-mutant test command: the warm server, and (with `selection`) only the tests that run the mutant."""
    select = ["--select", str(selection[0]), str(selection[1]), str(tree / target.source)] if selection else []
    return shlex.join(
        [
            sys.executable,
            str(tree / "tests" / "mutation" / "warm.py"),
            "run",
            str(socket_path),
            *select,
            "--",
            *pytest_args(tree, target),
        ]
    )


def module_name(tree: Path, source: str) -> str:
    top, *rest = Path(source).with_suffix("").parts
    return ".".join(["stagevisor", top, *rest]).removesuffix(".__init__")


def independent_modules(tree: Path, target: str) -> list[str]:
    """Project modules that import `target` neither directly nor through others (by their import statements).

    Conservative: an import inside a function counts, and so does every parent package.
    """
    imports: dict[str, set[str]] = {}
    for top in ("supervisor", "stages", "models"):
        for path in sorted((tree / top).rglob("*.py")):
            source = str(path.relative_to(tree))
            if "/_root/" in source or "/_proto/" in source or path.stem == "__main__":
                continue
            name = module_name(tree, source)
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            found = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                    module = ".".join(p for p in (base, node.module or "") if p)
                    found.add(module)
                    found.update(f"{module}.{a.name}" for a in node.names)  # `from package import submodule`
            imports[name] = found
    dependent = {target}
    while True:
        more = {m for m, found in imports.items() if m not in dependent and found & dependent}
        if not more:
            break
        dependent |= more
    return [m for m in imports if m not in dependent]


class WarmServer:
    """A warm pytest (tests/mutation/warm.py) for one module's run (or one shard's), restarted when lost."""

    def __init__(self, socket_path: Path, env: dict[str, str], cwd: Path, target: Target) -> None:
        self.socket_path, self.env, self.cwd, self.target = socket_path, env, cwd, target
        self.marker = Path(WARM.lost_marker(str(socket_path)))
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        without = module_name(self.cwd, self.target.source)
        for project in (independent_modules(self.cwd, without), []):
            self.socket_path.unlink(missing_ok=True)
            server = subprocess.Popen(
                [
                    sys.executable,
                    str(self.cwd / "tests" / "mutation" / "warm.py"),
                    "serve",
                    str(self.socket_path),
                    "--without",
                    without,
                    *PRELOAD,
                    *(("torch",) if self.target.torch else ()),
                    *project,
                ],
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                text=True,
            )
            if server.stdout.readline().strip() == "ready":
                break
            if server.wait() != 3 or not project:
                raise SystemExit(f"the warm pytest server did not start (exit status {server.returncode})")
            print("the warm server preloads third-party libraries only", flush=True)
        self.process = server
        # Test commands that found no server while this one started were not tested: they run again
        # (forget_lost); only a loss after this point calls for another restart.
        self.marker.unlink(missing_ok=True)

    def lost(self) -> str | None:
        """Why the server cannot be trusted with the next mutant, or None while it serves."""
        if self.process is not None and self.process.poll() is not None:
            return f"the server exited with status {self.process.returncode}"
        if self.marker.exists():
            reasons = self.marker.read_text().split("\n")
            return f"a test command got no answer from it ({reasons[0] or 'no reason given'})"
        return None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()  # the server stops the test run in progress, if any
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()
            self.process = None
        self.socket_path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> WarmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.marker.unlink(missing_ok=True)


MAX_RESTARTS = 3
"""How often one run restarts a lost warm server before it stops with an error."""


class Restartable(Protocol):
    def lost(self) -> str | None: ...
    def restart(self) -> None: ...


class Waitable(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, signal: int) -> None: ...


def supervise(run: Waitable, server: Restartable, label: str, restarts: int = 0, poll: float = 1.0) -> tuple[int, int]:
    """Wait for a cosmic-ray run, restarting its warm server when lost; (its exit status, restarts so far).

    After MAX_RESTARTS restarts, another loss interrupts the run (SIGINT: cosmic-ray puts the module's source
    back) and stops with an error saying what happened; mutants the lost server left untested are not counted.
    """
    while True:
        try:
            code = run.wait(timeout=poll)
        except subprocess.TimeoutExpired:
            code = None
        why = server.lost()
        if why is not None:
            if restarts >= MAX_RESTARTS:
                if code is None:
                    run.send_signal(signal.SIGINT)
                    run.wait()
                raise SystemExit(
                    f"{label}: the warm pytest server was lost again after {restarts} restarts ({why}); "
                    "stopped. The mutants it did not test are left pending: run again to resume, and if it "
                    "happens again, run the module's tests through tests/mutation/warm.py by hand to see why"
                )
            restarts += 1
            print(f"{label}: the warm pytest server was lost ({why}): restarting it", flush=True)
            server.restart()
        if code is not None:
            return code, restarts


def forget_lost(session: Path) -> int:
    """Forget the results of mutants the warm server did not test (warm.py's LOST): they are pending again."""
    with sqlite3.connect(session) as db:
        return db.execute("DELETE FROM work_results WHERE output LIKE ?", (f"%{WARM.LOST}%",)).rowcount


def exec_session(config: Path, session: Path, server: WarmServer, label: str) -> int:
    """`cosmic-ray exec` until no mutant is left untested by a lost warm server; its exit status."""
    restarts = 0
    while True:
        run = subprocess.Popen([tool("cosmic-ray"), "exec", str(config), str(session)], cwd=server.cwd, env=server.env)
        try:
            code, restarts = supervise(run, server, label, restarts)
        finally:
            lost = forget_lost(session)
        if not lost:
            return code
        if restarts >= MAX_RESTARTS:
            raise SystemExit(f"{label}: {lost} mutants were not tested by a lost warm server after {restarts} restarts")
        print(f"{label}: {lost} mutants were not tested (the warm server was lost): testing them again", flush=True)
        if server.lost() is not None:
            restarts += 1
            server.restart()


def write_config(work: Path, tree: Path, name: str, target: Target, timeout: float, command: str) -> Path:
    config = work / f"{name}.toml"
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(str(tree / target.source))}\n"
        f"timeout = {timeout}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        '\n[cosmic-ray.distributor]\nname = "local"\n'
        "\n[cosmic-ray.filters.operators-filter]\n"
        f"exclude-operators = {json.dumps(list(EXCLUDED_OPERATORS))}\n"
    )
    return config


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    spans = []
    for node in ast.walk(ast.parse(source)):
        annotations = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        for a in annotations:
            spans.append(((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)))
    return spans


PUNCTUATION = frozenset({":", ")", ",", "]", "->", "="})
"""Tokens no mutation operator changes, whose column may move when an annotation before them on the line does."""


def same_mutants(old: str, new: str) -> bool:
    """Whether two versions of a module differ only inside type annotations and comments.

    Then every mutant the session recorded is the same code at the same line and column
    (annotations are not mutated, and comments are not code), so its results still hold:
    compared are all other tokens with their lines, and their columns but for punctuation.
    """

    def shifts(token: tokenize.TokenInfo) -> bool:
        return token.type == tokenize.NEWLINE or (token.type == tokenize.OP and token.string in PUNCTUATION)

    def code(source: str) -> list[tuple[int, str, int, int | None]] | None:
        try:
            spans = annotation_spans(source)
            tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        except (SyntaxError, tokenize.TokenError):
            return None
        return [
            # Punctuation after a longer or shorter annotation moves along its line; it is never mutated.
            (token.type, token.string, token.start[0], None if shifts(token) else token.start[1])
            for token in tokens
            if token.type not in (tokenize.COMMENT, tokenize.NL) and not any(a <= token.start < b for a, b in spans)
        ]

    kept = code(old)
    return kept is not None and kept == code(new)


def skip_annotations(session: Path, source: str) -> int:
    """Mark mutants inside type annotations as skipped (cosmic-ray has no such filter)."""
    spans = annotation_spans(source)
    with sqlite3.connect(session) as db:
        rows = db.execute(
            "SELECT m.job_id, m.start_pos_row, m.start_pos_col FROM mutation_specs m "
            "LEFT JOIN work_results r ON r.job_id = m.job_id WHERE r.job_id IS NULL"
        ).fetchall()
        skipped = [job for job, row, col in rows if any(a <= (row, col) < b for a, b in spans)]
        db.executemany(
            "INSERT INTO work_results (job_id, worker_outcome, output) VALUES (?, 'SKIPPED', 'type annotation')",
            [(job,) for job in skipped],
        )
    return len(skipped)


def run_module(work: Path, tree: Path, name: str, args: argparse.Namespace) -> None:
    target = TARGETS[name]
    source = (tree / target.source).read_text()
    digest = hashlib.sha256(source.encode()).hexdigest()
    session, stamp = work / f"{name}.sqlite", work / f"{name}.source-sha256"
    env = test_env(tree)
    if session.exists():
        merge_shards(work, name, session)  # what an interrupted parallel run found

    # The unmutated run writes bytecode (and pytest's rewritten tests) for everything but the
    # module under mutation, whose cache is removed: mutants are always compiled from source.
    # It also records, under coverage, which tests execute each line (tests/mutation/warm.py map).
    writing = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    linemap, unmutated = work / f"{name}.lines.json", work / f"{name}.unmutated"
    unmutated.write_text(source)
    baseline = subprocess.run(
        [
            sys.executable,
            str(tree / "tests" / "mutation" / "warm.py"),
            "map",
            str(tree / target.source),
            str(linemap),
            "--",
            *pytest_args(tree, target),
        ],
        cwd=tree,
        env=writing,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if baseline.returncode != 0:
        raise SystemExit(f"{name}: the unit tests fail without any mutation; fix them first:\n{baseline.stdout}")
    module = tree / target.source
    for cached in (module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"):
        cached.unlink()

    socket_path = work / f"{name}.sock"
    with WarmServer(socket_path, env, tree, target) as server:
        command = warm_command(tree, target, socket_path, None if args.all_tests else (linemap, unmutated))
        started = time.monotonic()  # the unmutated tests once more, through the warm server the mutants use
        warm = subprocess.run(
            shlex.split(command), cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if warm.returncode != 0 or WARM.LOST in warm.stdout:
            raise SystemExit(f"{name}: the unit tests fail through the warm server:\n{warm.stdout}")
        # A mutant whose tests run far longer than the unmutated ones is hung (an endless loop): killed.
        timeout = args.timeout or max(15.0, 5 * (time.monotonic() - started))
        config = write_config(work, tree, name, target, timeout, command)
        print(
            f"{name}: unit tests pass unmutated ({time.monotonic() - started:.1f}s warm); a mutant's run times "
            f"out after {timeout:.0f}s",
            flush=True,
        )

        recorded = work / f"{name}.source"
        if (
            session.exists()
            and stamp.exists()
            and stamp.read_text() != digest
            and recorded.exists()
            and same_mutants(recorded.read_text(), source)
        ):
            print(f"{name}: source changed only in type annotations or comments: session kept", flush=True)
            stamp.write_text(digest)
            recorded.write_text(source)
        if not session.exists() or not stamp.exists() or stamp.read_text() != digest:
            print(f"{name}: new session (source changed or first run)", flush=True)
            subprocess.run(
                [tool("cosmic-ray"), "init", str(config), str(session), "--force"], cwd=tree, env=env, check=True
            )
            skipped = skip_annotations(session, source)
            print(f"{name}: {skipped} mutants inside type annotations skipped", flush=True)
            stamp.write_text(digest)
            (work / f"{name}.source").write_text(source)  # what the session's line numbers refer to
        elif args.retest_survivors:
            with sqlite3.connect(session) as db:
                # Timeouts too: on a loaded machine a slow run of a mutant's tests is not always a hang.
                count = db.execute(
                    "DELETE FROM work_results WHERE test_outcome = 'SURVIVED' "
                    "OR (test_outcome = 'KILLED' AND output = 'timeout')"
                ).rowcount
            print(f"{name}: re-testing {count} survivors and timed-out mutants", flush=True)
        # On every run, so a session started under an older operator list follows the current one.
        subprocess.run([tool("cr-filter-operators"), str(session), str(config)], cwd=tree, env=env, check=True)
        with sqlite3.connect(session) as db:
            pending = [
                job
                for (job,) in db.execute(
                    "SELECT m.job_id FROM mutation_specs m LEFT JOIN work_results r ON r.job_id = m.job_id "
                    "WHERE r.job_id IS NULL ORDER BY m.start_pos_row, m.start_pos_col"
                )
            ]
        print(
            f"{name}: {len(pending)} mutants to run" + (f" in {args.jobs} processes" if args.jobs > 1 else ""),
            flush=True,
        )
        started = time.monotonic()
        if args.jobs > 1 and len(pending) > 1:
            run_shards(work, tree, name, session, pending, timeout, args)
        elif exec_session(config, session, server, name) != 0:
            raise SystemExit(f"{name}: cosmic-ray exec failed; run again to resume")
        if pending:
            print(
                f"{name}: {len(pending)} mutants in {time.monotonic() - started:.0f}s "
                f"({(time.monotonic() - started) / len(pending):.1f}s each)",
                flush=True,
            )


def shard_tree(tree: Path, shard: Path) -> None:
    """A copy of the prepared tree (bytecode included) whose `stagevisor` package is the copy's own."""
    if shard.exists():
        shutil.rmtree(shard)
    shutil.copytree(tree, shard, symlinks=True)
    package = shard / "_import" / "stagevisor"
    for name in ("supervisor", "stages", "models"):
        (package / name).unlink()
        (package / name).symlink_to(shard / name, target_is_directory=True)


def run_shards(
    work: Path, tree: Path, name: str, session: Path, pending: list[str], timeout: float, args: argparse.Namespace
) -> None:
    """Test the pending mutants in args.jobs processes at once: a tree, a session and a warm server each."""
    target, shards = TARGETS[name], min(args.jobs, len(pending))
    selection = None if args.all_tests else (work / f"{name}.lines.json", work / f"{name}.unmutated")
    with contextlib.ExitStack() as stack:
        runs = []
        for index in range(shards):
            shard, shard_session = work / f"tree-{name}-{index}", work / f"{name}-shard{index}.sqlite"
            shard_tree(tree, shard)
            stack.callback(shutil.rmtree, shard, ignore_errors=True)
            shutil.copy2(session, shard_session)
            with sqlite3.connect(shard_session) as db:
                db.execute("CREATE TEMP TABLE mine (job_id VARCHAR PRIMARY KEY)")
                db.executemany("INSERT INTO mine VALUES (?)", [(job,) for job in pending[index::shards]])
                db.execute("DELETE FROM work_results")
                db.execute("DELETE FROM mutation_specs WHERE job_id NOT IN (SELECT job_id FROM mine)")
                db.execute("DELETE FROM work_items WHERE job_id NOT IN (SELECT job_id FROM mine)")
                db.execute("UPDATE mutation_specs SET module_path = ?", (str(shard / target.source),))
            env = test_env(shard)
            socket_path = work / f"{name}-{index}.sock"
            server = stack.enter_context(WarmServer(socket_path, env, shard, target))
            config = write_config(
                work,
                shard,
                f"{name}-shard{index}",
                target,
                timeout,
                warm_command(shard, target, socket_path, selection),
            )
            runs.append((config, shard_session, server, f"{name} shard {index}"))
        with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
            done = [pool.submit(exec_session, *run) for run in runs]
        failed = []
        for future in done:
            try:
                if future.result() != 0:
                    failed.append("cosmic-ray exec failed")
            except SystemExit as error:
                failed.append(str(error))
    merge_shards(work, name, session)
    if failed:
        raise SystemExit(f"{name}: {len(failed)} cosmic-ray runs failed ({'; '.join(failed)}); run again to resume")


def merge_shards(work: Path, name: str, session: Path) -> None:
    """Copy the results of shard sessions (this run's, or an interrupted one's) into the module's session."""
    for shard_session in sorted(work.glob(f"{name}-shard[0-9]*.sqlite")):
        db = sqlite3.connect(session)
        try:
            db.execute("ATTACH DATABASE ? AS shard", (str(shard_session),))
            found = db.execute(
                "SELECT 1 FROM shard.sqlite_master WHERE type = 'table' AND name = 'work_results'"
            ).fetchone()
            if found:  # a shard killed before cosmic-ray made its tables holds nothing
                db.execute(
                    "INSERT OR REPLACE INTO work_results SELECT * FROM shard.work_results "
                    "WHERE job_id IN (SELECT job_id FROM mutation_specs)"
                )
            db.commit()
            db.execute("DETACH DATABASE shard")
        finally:
            db.close()
        shard_session.unlink()


@dataclass
class Survivor:
    module: str
    line: int
    operator: str
    text: str
    diff: str


def load_equivalents() -> list[dict]:
    if not EQUIVALENT_FILE.exists():
        return []
    return tomllib.loads(EQUIVALENT_FILE.read_text()).get("equivalent", [])


def _squeezed(text: str) -> str:
    return "".join(text.split())  # cosmic-ray's rewrite may add spaces (`[ -1]`)


def mutated_lines(diff: str) -> list[str]:
    return [d[1:] for d in diff.splitlines() if d.startswith("+") and not d.startswith("+++")]


def is_equivalent(survivor: Survivor, equivalents: list[dict]) -> str | None:
    """The reason of the matching entry: module, operator, source line, and (if given) the mutated line `to`."""
    for entry in equivalents:
        if (
            entry["module"] == survivor.module
            and entry["operator"] == survivor.operator
            and entry["line"].strip() == survivor.text.strip()
            and ("to" not in entry or _squeezed(entry["to"]) in map(_squeezed, mutated_lines(survivor.diff)))
        ):
            return entry["reason"]
    return None


def report(work: Path, names: list[str], fail_under: float, show_diffs: bool) -> int:
    equivalents = load_equivalents()
    status, totals = 0, {"killed": 0, "timeout": 0, "survived": 0, "equivalent": 0}
    print(
        f"\n{'module':<16}{'mutants':>8}{'killed':>8}{'timeout':>8}{'survived':>9}{'equiv.':>8}{'skipped':>8}"
        f"{'pending':>8}{'kill rate':>11}"
    )
    listed: list[tuple[Survivor, str | None]] = []
    for name in names:
        session = work / f"{name}.sqlite"
        if not session.exists():
            print(f"{name:<16}  not run yet")
            continue
        current = (ROOT / TARGETS[name].source).read_text()
        mutated = work / f"{name}.source"
        session_source = mutated.read_text() if mutated.exists() else current
        lines = session_source.splitlines()
        stale = not same_mutants(session_source, current)
        with sqlite3.connect(session) as db:
            rows = db.execute(
                "SELECT m.operator_name, m.start_pos_row, r.worker_outcome, r.test_outcome, r.diff, r.output "
                "FROM mutation_specs m LEFT JOIN work_results r ON r.job_id = m.job_id"
            ).fetchall()
        killed = timeout = survived = equivalent = skipped = pending = 0
        for operator, row, worker, outcome, diff, output in rows:
            if _EXCLUDED.match(operator):
                skipped += 1
            elif worker is None:
                pending += 1
            elif worker in ("SKIPPED", "NO_TEST"):
                skipped += 1
            elif outcome == "SURVIVED":
                text = lines[row - 1] if row - 1 < len(lines) else ""
                survivor = Survivor(name, row, operator.removeprefix("core/"), text, diff or "")
                reason = is_equivalent(survivor, equivalents)
                if reason is None:
                    survived += 1
                else:
                    equivalent += 1
                listed.append((survivor, reason))
            else:  # killed, timed out, or incompetent (a mutant that does not even import)
                killed += 1
                timeout += output == "timeout"  # cosmic-ray's word for a run it stopped: killed, but by no test
        counted = killed + survived
        rate = 100.0 * killed / counted if counted else 0.0
        print(
            f"{name:<16}{len(rows):>8}{killed:>8}{timeout:>8}{survived:>9}{equivalent:>8}{skipped:>8}{pending:>8}"
            f"{rate:>10.1f}%" + ("  (source changed since: run it again)" if stale else "")
        )
        totals["killed"] += killed
        totals["timeout"] += timeout
        totals["survived"] += survived
        totals["equivalent"] += equivalent
        if counted and rate < fail_under:
            status = 1
    counted = totals["killed"] + totals["survived"]
    if counted:
        print(
            f"{'total':<16}{'':>8}{totals['killed']:>8}{totals['timeout']:>8}{totals['survived']:>9}"
            f"{totals['equivalent']:>8}"
            f"{'':>16}{100.0 * totals['killed'] / counted:>10.1f}%"
        )
    for survivor, reason in sorted(listed, key=lambda s: (s[0].module, s[0].line)):
        where = f"{TARGETS[survivor.module].source}:{survivor.line}"
        if reason is None:
            print(f"\nSURVIVED {where} {survivor.operator}: {survivor.text.strip()}")
            if show_diffs:
                print(
                    "\n".join(
                        "    " + d
                        for d in survivor.diff.splitlines()
                        if d.startswith(("+", "-")) and not d.startswith(("+++", "---"))
                    )
                )
        else:
            print(f"\nequivalent {where} {survivor.operator}: {reason}")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "modules",
        nargs="*",
        metavar="MODULE",
        help=f"modules to mutate, or {' or '.join(GROUPS)} for several (default: all of {', '.join(TARGETS)})",
    )
    parser.add_argument("--workdir", type=Path, default=ROOT / ".mutation", help="sessions and the source copy")
    parser.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="seconds before a test run counts as hung (default: 5x the unmutated run, at least 15)",
    )
    parser.add_argument(
        "--retest-survivors", action="store_true", help="run the tests again on survivors and timed-out mutants only"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="test mutants in this many processes at once (a copy of the tree and a warm server each)",
    )
    parser.add_argument(
        "--all-tests",
        action="store_true",
        help="run every listed test file per mutant, not only the tests that execute the mutant",
    )
    parser.add_argument("--report", action="store_true", help="print the last results without running anything")
    parser.add_argument("--no-diffs", action="store_true", help="list survivors without their diffs")
    parser.add_argument("--fail-under", type=float, default=90.0, help="exit 1 if a module's kill rate is lower")
    parser.add_argument(
        "--planted",
        action="store_true",
        help="only check that the hand-planted bugs (of the modules named, else all) are killed (minutes)",
    )
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()  # the tests run with the copy as working directory
    names = [n for name in args.modules or list(TARGETS) for n in GROUPS.get(name, (name,))]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown module {', '.join(unknown)}; choose from {', '.join([*GROUPS, *TARGETS])}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not args.report:
        held = hold_workdir(args.workdir)  # noqa: F841 - the lock is held while the handle lives
    if args.planted:
        scratch = tempfile.mkdtemp(prefix="svmut-")
        os.environ["TMPDIR"] = scratch
        try:
            sources = {TARGETS[n].source for n in names} if args.modules else None
            return run_planted(args.workdir / "planted", sources)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if not args.report:
        if shutil.which(tool("cosmic-ray")) is None:
            raise SystemExit("cosmic-ray is not installed: run `pip install -e '.[mutation]'`")
        tree = copy_tree(args.workdir)
        # Test runs killed on timeout cannot clean up: give them a temp root of their own, removed here.
        scratch = tempfile.mkdtemp(prefix="svmut-")
        os.environ["TMPDIR"] = scratch
        try:
            for name in names:
                run_module(args.workdir, tree, name, args)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return report(args.workdir, names, args.fail_under, not args.no_diffs)


if __name__ == "__main__":
    sys.exit(main())
