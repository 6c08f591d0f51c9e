"""tests/gpu/run.sh: the dry run shows the offline install and the checks, and runs none of it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "run.sh"


def dry_run(*args: str, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "SITE": str(site)},
    )


def commands(result: subprocess.CompletedProcess) -> list[str]:
    return [line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")]


def test_the_dry_run_prints_each_command_and_creates_nothing(tmp_path):
    site = tmp_path / "site"
    result = dry_run(site=site)
    assert result.returncode == 0, result.stderr
    ran = commands(result)
    # The wheels' install: every file of the wheel folder (a glob, whatever the folder holds when it runs).
    (install,) = [c for c in ran if "pip install" in c and ".whl" in c and "--upgrade" in c]
    assert "--no-index --no-deps" in install and f"--target {site}" in install
    # stagevisor from the checkout, built with the carried setuptools, never the image's (it may be too old).
    (build,) = [c for c in ran if "pip install" in c and c.endswith(" .")]
    assert "--no-index --find-links .whl" in build and "--no-build-isolation" not in build
    assert any("check_wheels.py .whl" in c for c in ran)
    assert any("pytest" in c and "tests/gpu" in c for c in ran)
    assert any("tests/gpu/bench_gpu_vocoder.py" in c for c in ran)
    assert not site.exists()


def test_the_wheel_folder_can_be_named(tmp_path):
    result = dry_run("--wheels", str(tmp_path / "wheels"), site=tmp_path / "site")
    assert any(f"check_wheels.py {tmp_path / 'wheels'}" in c for c in commands(result)), result.stdout


def test_the_carried_setuptools_builds_stagevisor_but_is_not_installed_beside_it(tmp_path):
    """setuptools is in the wheel folder only for the build: installed into the run's site, first on PYTHONPATH,
    it would shadow the image's own for everything the tests import."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("grpcio-1.85.3-cp312-cp312-manylinux_2_17_x86_64.whl", "setuptools-84.2.1-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    ran = commands(dry_run("--wheels", str(wheels), site=tmp_path / "site"))
    (install,) = [c for c in ran if "pip install" in c and "--upgrade" in c]
    assert "grpcio-1.85.3" in install and "setuptools-84" not in install
    (build,) = [c for c in ran if "pip install" in c and c.endswith(" .")]
    assert f"--find-links {wheels}" in build


def test_every_wanted_wheel_is_carried_once_when_fetched():
    """The wheel list names one version per distribution: two of one name stop the offline install."""
    names = [
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "tests/gpu/wheels.txt").read_text().splitlines()
    ]
    wanted = [name for name in names if name and not name.startswith("#")]
    assert len(wanted) == len(set(wanted))
    assert {"qwen-tts", "transformers", "tokenizers", "huggingface-hub", "grpcio", "protobuf"} <= set(wanted)


def test_every_dependency_of_stagevisor_the_gpu_image_lacks_is_in_the_wheel_list():
    """stagevisor installs there with --no-deps: before, uvicorn and starlette were missing, and `serve` failed on
    the GPU machine though every carried wheel's own needs were met."""
    pytest.importorskip("tomllib", reason="check_wheels.py reads pyproject.toml with tomllib (Python 3.11+)")
    from packaging.utils import canonicalize_name

    from tests.gpu import check_wheels

    listed = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "tests/gpu/wheels.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    skipped = {name for owner, name in check_wheels.NOT_IMPORTED if owner == "stagevisor"}
    needs = {canonicalize_name(need.name) for need in check_wheels.own_requirements()}
    assert {"starlette", "uvicorn", "grpcio", "pydantic"} <= needs
    assert needs - set(check_wheels.IMAGE) - skipped - listed == set()


def test_the_carried_setuptools_can_build_what_pyproject_declares():
    """The GPU machine builds stagevisor offline with the setuptools of wheels.txt: it must meet build-system."""
    (carried,) = [
        line.split("==")[1]
        for line in (ROOT / "tests/gpu/wheels.txt").read_text().splitlines()
        if line.startswith("setuptools==")
    ]
    found = re.search(r"^requires = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found, "pyproject.toml has no build-system requires line"
    requires = [item.strip().strip('"') for item in found.group(1).split(",")]
    (only,) = requires  # every build requirement must be carried: setuptools alone
    name, least = re.fullmatch(r"([a-z]+)>=(\d+)", only).groups()
    assert name == "setuptools" and int(carried.split(".")[0]) >= int(least)


def test_an_unknown_option_is_a_usage_error():
    result = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr
