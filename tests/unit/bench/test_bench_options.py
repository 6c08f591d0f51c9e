"""`stagevisor bench`'s options and failures as the CLI reports them, without daemons: refused before any
measurement, with the error object on stdout under --format json; --address dialled as the other client
commands dial; a run without one successful request is an error."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands import bench, bench_options

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def measured(monkeypatch) -> list[str]:
    """The topologies the bench went on to measure (nothing is started: the measurement is faked)."""
    started: list[str] = []

    async def one(result, args, workload, progress, *rest):
        started.append(result.topology.label)

    monkeypatch.setattr(bench, "_one", one)
    monkeypatch.setattr(bench, "_one_at_address", one)
    return started


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "--concurrency values must be >= 1"),
        (["--requests", "0"], "--requests must be >= 1, got 0"),
        (["--duration", "0"], "--duration must be a finite number of seconds > 0, got 0.0"),
        (["--duration", "inf"], "--duration must be a finite number of seconds > 0, got inf"),
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
    ("argv", "requests"), [([], bench_options.DEFAULT_REQUESTS), (["--requests", "3"], 3), (["--duration", "5"], None)]
)
def test_each_load_point_measures_the_default_count_unless_requests_or_duration_is_given(argv, requests):
    from stagevisor.supervisor.cli import build_parser

    parser = build_parser()
    assert bench_options.workload_from_args(parser.parse_args(["bench", *argv])).requests == requests
    assert f"(default: {bench_options.DEFAULT_REQUESTS})" in " ".join(parser.commands["bench"].format_help().split())


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


def test_dialling_options_without_address_are_refused(tmp_path, capsys, measured):
    """The bench's own daemons are private: a token or CA given for them would be ignored without a word."""
    assert main(["bench", "--api-key-file", str(tmp_path / "key"), "--tls"]) == 2
    assert capsys.readouterr().err.startswith("error: --api-key-file, --tls apply only to the daemon of --address")
    assert measured == []


@pytest.mark.parametrize(
    ("argv", "given"),
    [
        (["--topology", "--isolate-stage vocoder"], "--topology applies"),
        (["--model-path", "qwen3-tts", "--stand-ins"], "--model-path, --stand-ins apply"),
        (["--config", "pipeline.yaml", "--topology", "declared"], "--config, --topology apply"),
        (["--check-identical"], "--check-identical applies"),  # was accepted: one daemon always compares identical
    ],
)
@pytest.mark.parametrize("output", ["table", "json"])
def test_options_of_the_benchs_own_daemons_with_address_are_refused(capsys, measured, argv, given, output):
    """`bench --address A --topology ...` measured the daemon at A and dropped the topology without a word, so
    a report labelled as one placement measured another. Now refused, as other invalid options are, before any
    measurement."""
    address = "127.0.0.1:50551"
    assert main(["bench", "--address", address, *argv, "--format", output]) == 2
    out, err = capsys.readouterr()
    them = "it" if "applies" in given else "them"
    message = (
        f"{given} only to the daemons the bench starts; --address {address} measures the daemon serving there as "
        f"it runs: drop {them}, or drop --address to let the bench start its own daemons"
    )
    assert err == f"error: {message}\n" and measured == []
    if output == "json":
        assert json.loads(out) == {"error": {"code": "INVALID_CONFIG", "message": message}}


def test_bench_at_an_address_dials_with_the_token_and_tls_of_the_environment(monkeypatch, capsys, tmp_path):
    """`bench --address` dialled plaintext without a token whatever $STAGEVISOR_API_KEY said; so did its pid lookup.
    It now takes them as `synthesize` and the admin commands do (client_security), for both calls."""
    from stagevisor.supervisor.bench import measure as measurement
    from stagevisor.supervisor.commands import admin
    from stagevisor.supervisor.security.client import client_security

    dialled = {}

    def call(args, method):
        dialled["admin"] = (args.admin_address, client_security(args).api_key)
        raise admin.Unreachable(args.admin_address)

    async def measure(address, workload, on_request, pids, digests, security=None):
        dialled["public"] = (address, security.api_key if security else None)
        return []

    monkeypatch.setenv("STAGEVISOR_API_KEY", TOKEN)
    monkeypatch.setattr(admin, "call", call)
    monkeypatch.setattr(measurement, "measure", measure)
    admin_address = f"unix:{tmp_path / 'admin.sock'}"
    argv = ["bench", "--address", "127.0.0.1:50551", "--admin-address", admin_address, "--format", "json"]
    assert main(argv) == 1  # the admin API did not answer: reported, not a traceback
    assert dialled == {"admin": (admin_address, TOKEN)}
    (topology,) = json.loads(capsys.readouterr().out)["topologies"]
    assert topology["error"]["code"] == "DAEMON_UNREACHABLE"
    assert main(argv[:3]) == 0
    assert dialled["public"] == ("127.0.0.1:50551", TOKEN)


def test_a_run_in_which_no_request_succeeded_fails_its_topology(monkeypatch, capsys):
    """Against a daemon that wanted a token, every request failed UNAUTHENTICATED and bench exited 0 with
    "error": null. Now the run stops there: exit 1, REQUESTS_FAILED naming the code and the daemon's message."""
    from stagevisor.supervisor.bench import measure as measurement
    from stagevisor.supervisor.bench.loadgen import Outcome

    class Refused:
        def __init__(self, address, options, security=None, voice=None) -> None:
            self.requests = 0

        async def request(self, index, text, options=None):
            self.requests += 1
            return Outcome(
                index, 0.0, None, 0.001, 0, 0, "UNAUTHENTICATED", "", 0.0, "the call carried no bearer token"
            )

        async def close(self) -> None:
            pass

    monkeypatch.setattr(measurement, "GrpcClient", Refused)
    argv = ["bench", "--address", "127.0.0.1:50551", "--requests", "3", "--concurrency", "1,8", "--warmup", "0"]
    assert main([*argv, "--format", "json"]) == 1
    out, err = capsys.readouterr()
    (topology,) = json.loads(out)["topologies"]
    message = "no request succeeded at c1 (3 UNAUTHENTICATED); the first failed UNAUTHENTICATED: the call carried no"
    assert topology["error"] == {"code": "REQUESTS_FAILED", "message": message + " bearer token"}
    assert topology["rows"] == []  # it stopped at c1: c8 was not measured
    assert f"REQUESTS_FAILED: {message}" in err


@pytest.mark.parametrize("load", [["--concurrency", "2"], ["--rate", "1000"]])
def test_a_duration_run_whose_every_request_is_refused_fails_at_once_not_at_the_end_of_its_duration(
    monkeypatch, capsys, load
):
    """A --duration run that the daemon refused (no token, a bad option) sent refused requests until its duration
    ran out, then failed REQUESTS_FAILED: minutes of nothing. It stops after REFUSALS_TO_GIVE_UP refusals."""
    import time

    from stagevisor.supervisor.bench import measure as measurement
    from stagevisor.supervisor.bench.loadgen import Outcome

    sent = []

    class Refused:
        def __init__(self, address, options, security=None, voice=None) -> None:
            pass

        async def request(self, index, text, options=None):
            sent.append(index)
            await asyncio.sleep(0.001)
            return Outcome(index, 0.0, None, 0.001, 0, 0, "INVALID_ARGUMENT", "", 0.0, "unknown option 'x'")

        async def close(self) -> None:
            pass

    monkeypatch.setattr(measurement, "GrpcClient", Refused)
    started = time.monotonic()
    argv = ["bench", "--address", "127.0.0.1:50551", "--duration", "20", *load, "--warmup", "0", "--format", "json"]
    assert main(argv) == 1
    assert time.monotonic() - started < 10 and len(sent) < 100
    (topology,) = json.loads(capsys.readouterr().out)["topologies"]
    assert topology["error"]["code"] == "REQUESTS_FAILED"
    assert f"the run stopped after {measurement.REFUSALS_TO_GIVE_UP} refusals" in topology["error"]["message"]
    assert "INVALID_ARGUMENT: unknown option 'x'" in topology["error"]["message"]
    assert f"or {measurement.REFUSALS_TO_GIVE_UP} were refused before any did" in " ".join(bench.EPILOG.split())


def test_refusals_after_a_request_succeeded_do_not_stop_the_run(monkeypatch, capsys):
    """Refused requests among served ones are a measured error count, not a run to stop."""
    from stagevisor.supervisor.bench import measure as measurement
    from stagevisor.supervisor.bench.loadgen import Outcome

    class Mixed:
        def __init__(self, address, options, security=None, voice=None) -> None:
            self.sent = 0

        async def request(self, index, text, options=None):
            self.sent += 1
            refused = "INVALID_ARGUMENT" if self.sent > 1 else None
            return Outcome(index, 0.0, 0.001, 0.002, 240, 24000, refused, "" if refused else "d", 0.0, "")

        async def close(self) -> None:
            pass

    monkeypatch.setattr(measurement, "GrpcClient", Mixed)
    argv = ["bench", "--address", "127.0.0.1:50551", "--requests", "40", "--concurrency", "1", "--warmup", "0"]
    assert main([*argv, "--format", "json"]) == 0
    (topology,) = json.loads(capsys.readouterr().out)["topologies"]
    assert topology["error"] is None and topology["rows"][0]["errors"] == {"INVALID_ARGUMENT": 39}


def test_the_progress_line_of_a_bench_by_duration_counts_one_request_in_the_singular(capsys, monkeypatch):
    """On a terminal, a bench run for --duration showed `1 requests, 0 s` after its first request."""
    from stagevisor.supervisor.commands.bench import Progress

    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    progress = Progress(None, 10.0)
    progress.step("measuring")
    progress.step()
    assert "1 request, 0 s  measuring" in capsys.readouterr().err
