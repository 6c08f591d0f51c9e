"""`stagevisor bench`'s options as the CLI reports them, without daemons: refused before any measurement, with the
error object on stdout under --format json."""

from __future__ import annotations

import json
import sys

import pytest

from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands import bench


@pytest.fixture
def measured(monkeypatch) -> list[str]:
    """The topologies the bench went on to measure (nothing is started: the measurement is faked)."""
    started: list[str] = []

    async def one(result, args, workload, progress):
        started.append(result.topology.label)

    monkeypatch.setattr(bench, "_one", one)
    return started


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "--concurrency values must be >= 1"),
        (["--requests", "0"], "--requests must be >= 1 and --duration > 0"),
        (["--rate", "0"], "--rate must be a finite number > 0 of requests per second, got 0.0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--text-file", "/nonexistent"], "cannot read --text-file /nonexistent: No such file or directory"),
    ],
)
def test_an_option_out_of_range_prints_the_error_object_on_stdout_with_format_json(capsys, measured, argv, message):
    """These exited 2 with the message on stderr only; a script reading stdout got nothing to parse."""
    assert main(["bench", *argv, "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": {"code": "INVALID_CONFIG", "message": message}}
    assert err == f"error: {message}\n" and measured == []


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("bench.txt", "name the file .png or .svg (the format follows the suffix), got '.txt'"),
        ("bench", "name the file .png or .svg (the format follows the suffix), got ''"),
        ("missing/bench.png", "no directory"),
        ("a-directory.png", "it is a directory"),
    ],
)
def test_a_plot_that_could_not_be_written_is_refused_before_measuring(tmp_path, capsys, measured, name, complaint):
    """The whole run was measured, then --plot failed with a traceback (or one line) and exit 1."""
    path = tmp_path / name
    if name == "a-directory.png":
        path.mkdir()
    assert main(["bench", "--plot", str(path), "--format", "json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "INVALID_CONFIG" and complaint in error["message"] and str(path) in error["message"]
    assert measured == []


def test_a_plot_without_matplotlib_names_the_extra_to_install_before_measuring(tmp_path, capsys, measured, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["bench", "--plot", str(tmp_path / "bench.svg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --plot needs matplotlib: pip install ") and "[bench]" in err
    assert measured == []
