"""A user's executor package beside the config or in the working directory is found by workers, no PYTHONPATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import ServeProcess, synthesize

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

EXECUTORS = """
import numpy as np


class Frontend:
    async def process(self, payload, ctx):
        return {"tokens": [ord(c) % 64 for c in payload.request["text"]]}


class Engine:
    async def process(self, payload, ctx):
        for token in payload.data["tokens"]:
            await ctx.stream({"level": token / 64.0})
        return {"count": len(payload.data["tokens"])}


class Vocoder:
    async def process(self, payload, ctx):
        async for chunk in ctx.chunks():
            await ctx.stream({"audio": np.full(160, chunk["level"] * 0.5, dtype=np.float32), "sample_rate": 16000})
        return None


def make_frontend():
    return Frontend()


def make_engine():
    return Engine()


def make_vocoder():
    return Vocoder()
"""

CONFIG = """
pipeline:
  name: my-tts
  stages:
    - {name: frontend, factory: "my_tts.stages:make_frontend", process: pipeline, next: [engine]}
    - {name: engine, factory: "my_tts.stages:make_engine", process: pipeline, next: [vocoder], stream_to: [vocoder]}
    - {name: vocoder, factory: "my_tts.stages:make_vocoder", process: vocoder}
  process_safe_edges: [[engine, vocoder]]
"""


def user_project(root: Path) -> Path:
    """`root/my_tts/stages.py` and `root/my.yaml`, with the vocoder in a process of its own."""
    (root / "my_tts").mkdir(parents=True)
    (root / "my_tts" / "__init__.py").write_text("")
    (root / "my_tts" / "stages.py").write_text(EXECUTORS)
    config = root / "my.yaml"
    config.write_text(textwrap.dedent(CONFIG))
    return config


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.parametrize("where", ["the working directory", "beside the config", "--app-dir"])
def test_serve_finds_the_users_package(tmp_path, where):
    project = tmp_path / "project"
    config = user_project(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = ["--config", str(config)]
    cwd = project if where == "the working directory" else elsewhere
    if where == "--app-dir":
        moved = tmp_path / "apps"
        moved.mkdir()
        (project / "my_tts").rename(moved / "my_tts")
        args += ["--app-dir", str(moved)]
    with ServeProcess(*args, env={**clean_env(), "STAGEVISOR_RUNTIME_DIR": str(tmp_path / "run")}, cwd=cwd) as daemon:
        daemon.wait_serving()
        pcm, rate = synthesize(daemon.listen, "hello", options={})
        assert rate == 16000 and len(pcm) == 5 * 160 * 2
        assert [g["name"] for g in daemon.topology()["groups"]] == ["pipeline", "vocoder"]
        assert daemon.cli("stop").returncode == 0
        assert daemon.wait_exit(60) == 0


@pytest.mark.parametrize("worker_start", ["forkserver", "spawn"])
def test_a_stagevisor_directory_where_serve_runs_shadows_neither_the_package_nor_the_users_stages(worker_start):
    """XDG_RUNTIME_DIR=$PWD puts the runtime directory, `stagevisor/`, in the working directory, which was first on
    the workers' sys.path: they imported it instead of the package and failed on `stagevisor.__version__` (the
    fork server started by `python -c`; a spawned worker of `python -m stagevisor`). The user's package there is
    still found."""
    project = Path(tempfile.mkdtemp(prefix="sv"))  # short: worker sockets go in project/stagevisor/
    try:
        config = user_project(project)
        env = {**clean_env(), "STAGEVISOR_RUNTIME_DIR": "", "XDG_RUNTIME_DIR": str(project)}  # empty: XDG's
        with ServeProcess("--config", str(config), "--worker-start", worker_start, env=env, cwd=project) as daemon:
            daemon.wait_serving()
            assert (project / "stagevisor").is_dir()
            pcm, rate = synthesize(daemon.listen, "hello", options={})
            assert rate == 16000 and len(pcm) == 5 * 160 * 2
            assert daemon.cli("stop").returncode == 0
            assert daemon.wait_exit(60) == 0
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_an_unimportable_factory_is_reported_before_any_worker_starts(tmp_path):
    config = user_project(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config.write_text(config.read_text().replace("my_tts.stages:make_vocoder", "my_tts.vocoders:make"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "serve",
            "--config",
            str(config),
            "--admin-address",
            f"unix:{tmp_path / 'admin.sock'}",
            "--listen",
            f"unix:{tmp_path / 'public.sock'}",
        ],
        cwd=elsewhere,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        "error: MODULE_NOT_FOUND: stage 'vocoder': factory 'my_tts.vocoders:make' cannot be imported: "
        "no module 'my_tts.vocoders' on the import path"
    ) in result.stderr
    assert str(tmp_path / "project") in result.stderr
    assert "READY" not in result.stderr and not (tmp_path / "admin.sock").exists()


def test_a_module_that_imports_a_missing_package_is_named_alike_by_check_plan_and_serve(tmp_path):
    """
    1. the vocoder's module is found beside the config but imports a package that is not installed;
    2. `check` reports MISSING_DEPENDENCY naming the stage, the module, the missing package and the import's line;
    3. `plan` warns of nothing (it never imports a stage's code), and `serve` fails to start with the same
       coded reason for that stage, exit status 1 (before, both commands said a raw ModuleNotFoundError).
    """
    config = user_project(tmp_path / "project")
    stages = tmp_path / "project" / "my_tts" / "stages.py"
    stages.write_text("import not_installed_vocoder_dep\n" + stages.read_text())

    def reason(factory: str) -> str:
        return (
            f"factory 'my_tts.stages:{factory}' cannot be imported: module 'my_tts.stages' was found, but an import "
            f"failed: No module named 'not_installed_vocoder_dep' (at {stages}:1); install the package that provides "
            "'not_installed_vocoder_dep' in the environment the workers run in, or fix that import"
        )

    def stagevisor(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "stagevisor", *args, "--config", str(config)]
        return subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)

    checked = stagevisor("check")
    assert checked.returncode == 1
    assert f"error: MISSING_DEPENDENCY: stage 'frontend': {reason('make_frontend')}" in checked.stdout
    planned = stagevisor("plan")
    assert planned.returncode == 0 and "warning" not in planned.stdout
    served = stagevisor(
        "serve",
        "--admin-address",
        f"unix:{tmp_path / 'admin.sock'}",
        "--listen",
        f"unix:{tmp_path / 'public.sock'}",
        "--http",
        "none",
    )
    assert served.returncode == 1
    # Both groups import the module; the daemon names whichever worker reports first.
    assert any(
        f"failed to start: stage '{stage}' failed to build: MISSING_DEPENDENCY: {reason(factory)}" in served.stderr
        for stage, factory in (("frontend", "make_frontend"), ("vocoder", "make_vocoder"))
    ), served.stderr
