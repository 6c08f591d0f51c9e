"""Packaging: one top-level import name, a wheel and an sdist that work, and co-installation that is safe.

Covers the import collisions stagevisor once had: supervisord's `supervisor`
package beside it, and a user's own `models/` and `stages/` packages on the
import path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from stagevisor.stages.extras import DEMO
from tests.integration.daemon_helpers import ROOT, ServeProcess, synthesize

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "README.md", "supervisor", "stages", "models", "proto")


def run(*argv: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 180):
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """A wheel built from a copy of the tree, an sdist, and a wheel built from that sdist."""
    tmp = tmp_path_factory.mktemp("dists")
    tree = tmp / "tree"
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            tree.mkdir(exist_ok=True)
            shutil.copy(source, tree / name)
    hooks = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    out = {}
    for kind in ("build_wheel", "build_sdist"):
        result = run(sys.executable, "-c", hooks, kind, str(tmp), cwd=tree)
        assert result.returncode == 0, result.stderr[-3000:]
        out[kind] = tmp / result.stdout.strip().splitlines()[-1]
    with tarfile.open(out["build_sdist"]) as sdist:
        sdist.extractall(tmp / "unpacked", filter="data")
    [unpacked] = (tmp / "unpacked").iterdir()
    from_sdist = tmp / "from_sdist"
    from_sdist.mkdir()
    result = run(sys.executable, "-c", hooks, "build_wheel", str(from_sdist), cwd=unpacked)
    assert result.returncode == 0, result.stderr[-3000:]
    out["sdist_wheel"] = from_sdist / result.stdout.strip().splitlines()[-1]
    return {"wheel": out["build_wheel"], "sdist": out["build_sdist"], "sdist_wheel": out["sdist_wheel"]}


def wheel_files(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        return wheel.namelist()


def test_the_wheel_installs_one_import_name_and_nothing_outside_it(dists):
    files = wheel_files(dists["wheel"])
    tops = {name.split("/")[0] for name in files}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"stagevisor"}
    # So uninstalling stagevisor can never remove another distribution's files (supervisord's supervisor/).
    for expected in (
        "stagevisor/__init__.py",
        "stagevisor/__main__.py",
        "stagevisor/supervisor/cli.py",
        "stagevisor/supervisor/_proto/admin_pb2.py",
        "stagevisor/stages/piper/voice.py",
        "stagevisor/models/registry.py",
        "stagevisor/supervisor/http/playground.html",
    ):
        assert expected in files


def test_a_wheel_built_from_the_sdist_has_the_same_files(dists):
    assert sorted(wheel_files(dists["sdist_wheel"])) == sorted(wheel_files(dists["wheel"]))


def test_the_installed_wheel_runs_the_cli(dists, tmp_path):
    target = tmp_path / "site"
    result = run(
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(dists["wheel"])
    )
    assert result.returncode == 0, result.stderr
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = run(sys.executable, "-c", "import stagevisor; print(stagevisor.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.strip() == str(target / "stagevisor" / "__init__.py")
    plan = run(sys.executable, "-m", "stagevisor", "plan", "--model-path", "demo", cwd=tmp_path, env=env)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("pipeline : preprocessing, tts_engine, vocoder")
    # Installed (not a checkout): advice names the distribution, not an editable install.
    advice = "from stagevisor.supervisor.install import install_command; print(install_command('demo'))"
    hint = run(sys.executable, "-c", advice, cwd=tmp_path, env=env)
    assert hint.stdout.strip() == "pip install 'stagevisor[demo]'", hint.stderr


@pytest.mark.parametrize(
    "command", [["plan", "--model-path", "demo"], ["plan", "--model-path", "qwen3-tts"], ["models"]]
)
def test_plan_and_models_never_import_the_demo_extras_packages(command):
    """So they work without the `demo` extra (a subprocess, so other tests' imports do not count)."""
    probe = (
        "import contextlib, io, sys\n"
        "from stagevisor.supervisor.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({command!r}) == 0\n"
        f"print(sorted(set(sys.modules) & {set(DEMO.modules)!r}))\n"
    )
    result = run(sys.executable, "-c", probe, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def serve_synthesize_topology_stop(cwd: Path, pythonpath: Path) -> None:
    """The operator's round trip: plan, serve the demo, synthesize, topology, stop, all with `pythonpath` first."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    plan = run(sys.executable, "-m", "stagevisor", "plan", "--model-path", "demo", cwd=cwd, env=env)
    assert plan.returncode == 0, plan.stderr
    models = run(sys.executable, "-m", "stagevisor", "models", cwd=cwd, env=env)
    assert models.returncode == 0, models.stderr
    with ServeProcess("--model-path", "demo", "--isolate-stage", "vocoder", env=env, cwd=cwd) as daemon:
        daemon.wait_serving()
        pcm, rate = synthesize(daemon.listen, "Side by side.")
        assert rate > 0 and len(pcm) > rate  # more than half a second of 16-bit audio
        assert [g["name"] for g in daemon.topology()["groups"]] == ["pipeline", "vocoder"]
        stop = daemon.cli("stop")
        assert stop.returncode == 0, stop.stderr
        assert daemon.wait_exit(60) == 0


def test_every_command_works_beside_a_users_own_models_and_stages_packages(tmp_path):
    """From a directory holding the user's `models/` and `stages/` packages, on PYTHONPATH too."""
    for package in ("models", "stages", "supervisor"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("raise ImportError('the user package was imported')\n")
        (tmp_path / package / "registry.py").write_text("")
    serve_synthesize_topology_stop(cwd=tmp_path, pythonpath=tmp_path)


def test_stagevisor_and_supervisord_installed_side_by_side(tmp_path):
    """The PyPI `supervisor` distribution (supervisord) first on the path: both work."""
    target = tmp_path / "site"
    install = run(
        sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), "supervisor>=4", timeout=300
    )
    if install.returncode != 0:
        pytest.skip(f"cannot install supervisord from the package index here: {install.stderr.strip()[-300:]}")
    env = {**os.environ, "PYTHONPATH": str(target)}
    version = run(sys.executable, "-m", "supervisor.supervisord", "--version", cwd=tmp_path, env=env)
    assert version.returncode == 0 and version.stdout.strip()[:1].isdigit(), version.stdout + version.stderr
    which = run(sys.executable, "-c", "import supervisor; print(supervisor.__file__)", cwd=tmp_path, env=env)
    assert which.stdout.strip().startswith(str(target))
    serve_synthesize_topology_stop(cwd=tmp_path, pythonpath=target)
