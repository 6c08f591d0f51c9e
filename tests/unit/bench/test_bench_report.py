"""`stagevisor bench` without daemons: topologies, validation, statistics, ratios, the verdict, the plot."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.bench.compare import add_ratios, identical, verdict
from stagevisor.supervisor.bench.results import Row, TopologyResult
from stagevisor.supervisor.bench.workload import Topology, validate
from stagevisor.supervisor.commands.bench_options import parse_topology
from stagevisor.supervisor.placement.request import PlacementRequest
from stagevisor.supervisor.bench.loadgen import Outcome, percentile, summarize


def outcome(
    ttfa: float, total: float, samples: int = 22050, error: str | None = None, index: int = 0, digest: str = "a"
) -> Outcome:
    return Outcome(index, 0.0, ttfa, total, samples, 22050, error, digest)


def parsed(text: str, model_path: str | None = "demo") -> Topology:
    topology, error = parse_topology(text, model_path, None)
    assert error is None, error
    return topology


def test_topologies_parse_in_the_plan_syntax_into_placement_requests():
    assert parsed("declared") == Topology("declared", PlacementRequest("demo"))
    assert parsed("--isolate-stage vocoder").request == PlacementRequest("demo", isolate_stages=("vocoder",))
    request = parsed("--stage-process 'a=front' --stage-process b=front --process-replicas front=2").request
    assert request.stage_processes == ("a=front", "b=front") and request.process_replicas == ("front=2",)
    assert request.argv() == [
        "--model-path",
        "demo",
        "--stage-process",
        "a=front",
        "--stage-process",
        "b=front",
        "--process-replicas",
        "front=2",
    ]
    assert parsed("--model-path qwen3-tts --isolate-stage vocoder").request.model_path == "qwen3-tts"


def validated(text: str, model_path: str) -> dict | None:
    topology, error = parse_topology(text, model_path, None)
    return error or validate(topology)


def test_an_invalid_topology_is_reported_with_plans_error_code():
    assert validated("--isolate-stage vocoder", "qwen3-tts") is None
    error = validated("--isolate-stage tts_engine", "qwen3-tts")
    assert error["code"] == "UNSAFE_EDGE" and "'preprocessing' -> 'tts_engine'" in error["message"]
    assert validated("--isolate-stage nope", "demo")["code"] == "UNKNOWN_STAGE"
    assert validated("--listen 1.2.3.4:5", "demo")["code"] == "MALFORMED_ASSIGNMENT"
    assert validated("--isolate-stage 'vocoder", "demo")["code"] == "MALFORMED_ASSIGNMENT"  # unbalanced quote


def test_percentiles_interpolate_and_handle_no_values():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)


def test_a_summary_counts_errors_apart_and_measures_only_successes():
    summary = summarize([outcome(0.1, 0.5), outcome(0.2, 1.0), outcome(None, 0.05, 0, "UNAVAILABLE")], 2.0)
    assert summary.requests == 3 and summary.errors == {"UNAVAILABLE": 1}
    assert summary.requests_per_second == 1.0
    assert summary.audio_seconds_per_second == pytest.approx(1.0)  # 2 s of audio in 2 s
    assert summary.ttfa["p50"] == pytest.approx(0.15)
    assert summary.real_time_factor == pytest.approx(0.75)


def result(label: str, rows: list[tuple[int, float, float]], digests=None) -> TopologyResult:
    out = TopologyResult(Topology(label, PlacementRequest()), digests=digests or {})
    for concurrency, rps, ttfa in rows:
        summary = summarize([outcome(ttfa, 1.0)], 1.0)
        summary.requests_per_second = rps
        out.rows.append(Row(concurrency, None, summary, {}))
    return out


def test_ratios_and_the_verdict_compare_with_the_first_valid_topology():
    invalid = TopologyResult(
        Topology("--isolate-stage x", PlacementRequest()), error={"code": "UNKNOWN_STAGE", "message": ""}
    )
    base = result("declared", [(1, 2.0, 0.100), (8, 4.0, 0.400)])
    other = result("--isolate-stage vocoder", [(1, 2.0, 0.103), (8, 5.2, 0.300)])
    add_ratios([invalid, base, other])
    assert other.rows[1].ratios["requests_per_second"] == pytest.approx(1.3)
    assert other.rows[0].ratios["ttfa_p50_delta_seconds"] == pytest.approx(0.003)
    lines = verdict([invalid, base, other])
    assert lines[0] == (
        "`--isolate-stage vocoder` against `declared`: 1.30x requests/s at c8, +3.0 ms median time to first audio at c1"
    )
    assert lines[1].startswith("best for throughput: `--isolate-stage vocoder`")
    assert lines[2].startswith("best for latency: `declared`")


def test_identical_audio_is_judged_per_text_across_topologies():
    same = [result("a", [], {0: "x", 1: "y"}), result("b", [], {0: "x", 1: "y"})]
    assert identical(same) == {"identical": True, "differing": []}
    different = [result("a", [], {0: "x", 1: "y"}), result("b", [], {0: "x", 1: "z"})]
    assert identical(different) == {"identical": False, "differing": [{"text_index": 1, "topology": "b"}]}


def test_the_plot_is_a_png_with_one_line_per_topology(tmp_path):
    pytest.importorskip("matplotlib")
    from stagevisor.supervisor.bench.plot import plot

    base = result("declared", [(1, 2.0, 0.100), (8, 4.0, 0.400)])
    other = result("--isolate-stage vocoder", [(1, 2.0, 0.103), (8, 5.2, 0.300)])
    report = {"model": "demo", "workload": {"requests_per_row": 16}, "topologies": [base.to_json(), other.to_json()]}
    path = tmp_path / "bench.png"
    plot(report, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_playback_pauses_only_when_the_audio_received_has_played_out():
    from stagevisor.supervisor.metrics.playback import Playback

    ahead = Playback()
    for at, seconds in ((10.0, 0.4), (10.3, 1.0), (11.0, 2.0), (13.4, 0.5)):  # each arrives before the last ends
        ahead.arrived(at, seconds)
    assert ahead.stall == 0.0
    behind = Playback()
    behind.arrived(10.0, 0.4)  # plays until 10.4
    behind.arrived(10.9, 1.0)  # 0.5 s paused; plays until 11.9
    behind.arrived(11.5, 0.2)  # in time; plays until 12.1
    behind.arrived(12.4, 0.1)  # 0.3 s paused
    assert behind.stall == pytest.approx(0.8)


def test_a_summary_gives_stall_percentiles_and_the_share_that_stalled():
    outcomes = [
        Outcome(i, 0.0, 0.1, 1.0, 22050, 22050, None, "a", stall) for i, stall in enumerate((0.0, 0.0, 0.2, 0.6))
    ]
    summary = summarize([*outcomes, outcome(None, 0.05, 0, "UNAVAILABLE")], 2.0)
    assert summary.stall == {"p50": pytest.approx(0.1), "p90": pytest.approx(0.48), "max": 0.6}
    assert summary.stalled == 0.5  # failed requests are not counted
    assert summarize([], 1.0).stall == {"p50": None, "p90": None, "max": None} and summarize([], 1.0).stalled is None


def repeated(label: str, runs: list[list[tuple[int, float, float]]]) -> TopologyResult:
    """A topology measured once per entry of `runs` (each: (concurrency, req/s, ttfa) rows), combined."""
    from stagevisor.supervisor.bench.results import combine, figures

    per_run = []
    for rows in runs:
        one = result(label, rows)
        for row in one.rows:
            row.repeats = [{**figures(row.summary), "load_average_1m": 1.5}]
        per_run.append(one.rows)
    out = TopologyResult(Topology(label, PlacementRequest()))
    out.rows = combine(per_run)
    return out


def test_repeats_combine_into_medians_with_their_min_max_spread():
    combined = repeated(
        "a", [[(1, 2.0, 0.10), (8, 4.0, 0.4)], [(1, 2.4, 0.12), (8, 3.0, 0.5)], [(1, 2.2, 0.30), (8, 5.0, 0.2)]]
    )
    low, high = combined.rows
    assert low.summary.requests_per_second == pytest.approx(2.2) and low.summary.ttfa["p50"] == pytest.approx(0.12)
    assert low.spread()["requests_per_second"] == [2.0, 2.4] and low.spread()["ttfa_p50"] == [0.1, 0.3]
    assert high.summary.requests_per_second == 4.0 and [r["load_average_1m"] for r in high.repeats] == [1.5] * 3
    assert low.to_json()["spread"]["requests_per_second"] == [2.0, 2.4]


def test_a_difference_within_the_spread_is_called_so_and_one_outside_is_not():
    base = repeated("declared", [[(1, 2.0, 0.10), (8, 4.0, 0.40)], [(1, 2.0, 0.11), (8, 4.4, 0.41)]])
    other = repeated("--isolate-stage vocoder", [[(1, 2.0, 0.105), (8, 6.0, 0.30)], [(1, 2.0, 0.12), (8, 6.2, 0.31)]])
    add_ratios([base, other])
    assert other.rows[0].within_spread["ttfa_p50"] is True  # 0.105-0.12 overlaps 0.10-0.11
    assert other.rows[1].within_spread["requests_per_second"] is False  # 6.0-6.2 against 4.0-4.4
    line = verdict([base, other])[0]
    assert "1.45x requests/s at c8, " in line and "within the spread of 2 runs" in line.split(", ")[1]
    assert "within the spread" not in line.split(", ")[0]


def test_a_best_topology_within_anothers_spread_is_called_so():
    base = repeated("declared", [[(1, 2.0, 0.10), (8, 4.0, 0.40)], [(1, 2.0, 0.11), (8, 4.4, 0.41)]])
    other = repeated("--isolate-stage vocoder", [[(1, 2.0, 0.105), (8, 6.0, 0.30)], [(1, 2.0, 0.12), (8, 6.2, 0.31)]])
    add_ratios([base, other])
    lines = verdict([base, other])
    throughput = next(line for line in lines if line.startswith("best for throughput"))
    latency = next(line for line in lines if line.startswith("best for latency"))
    assert throughput.startswith("best for throughput: `--isolate-stage vocoder`") and "spread" not in throughput
    assert latency.startswith("best for latency: `declared`")  # 105 ms median against 112.5 ms
    assert latency.endswith("lowest load; within the spread of `--isolate-stage vocoder`: not a measured difference)")


def test_one_run_per_point_says_no_spread_was_measured():
    base = result("declared", [(1, 2.0, 0.100)])
    other = result("--isolate-stage vocoder", [(1, 2.1, 0.103)])
    for row in (*base.rows, *other.rows):
        row.repeats = [{"requests_per_second": row.summary.requests_per_second}]
    add_ratios([base, other])
    assert other.rows[0].within_spread == {}
    assert verdict([base, other])[-1].startswith("one run per point, so no spread was measured")


def report_of(*results: TopologyResult, repeats: int = 2) -> dict:
    return {
        "model": "demo",
        "workload": {"requests_per_row": 16, "repeats": repeats},
        "machine": {"cpus": 2, "usable_cpus": 2, "load_average": [3.5, 2.0, 1.0], "load_average_after": [4.0, 2, 1]},
        "topologies": [r.to_json() for r in results],
        "identical": None,
        "summary": verdict(list(results)),
    }


def test_the_table_has_a_unit_in_every_column_the_spread_and_the_machine(capsys):
    from stagevisor.supervisor.bench.table import COLUMNS, print_table

    assert all(" " in name or name == "load" or "/" in name for name, _, _ in COLUMNS[2:])
    base = repeated("declared", [[(1, 2.0, 0.10)], [(1, 2.4, 0.12)]])
    other = repeated("isolated", [[(1, 2.1, 0.11)], [(1, 2.2, 0.13)]])
    add_ratios([base, other])
    print_table(report_of(base, other))
    out = capsys.readouterr().out
    header = out.splitlines()[1]
    assert header.split()[:5] == ["topology", "load", "ok", "req/s", "audio"] and "ttfa p50 ms" in header
    assert "2.20 (2.00-2.40)" in out and "110.0 (100.0-120.0)" in out
    assert "0.98~" in out and "~: the difference from the first topology is within the spread" in out
    assert "machine: 2 of 2 CPUs usable; load average 3.5 (1 min) at the start, 4 at the end" in out
    assert "units: load cN = N clients in a closed loop" in out


def test_the_plot_draws_points_with_error_bars_on_axes_from_zero():
    pytest.importorskip("matplotlib")
    from stagevisor.supervisor.bench.plot import figure

    base = repeated("declared", [[(1, 2.0, 0.10), (8, 4.0, 0.4)], [(1, 2.4, 0.12), (8, 4.2, 0.5)]])
    other = repeated("isolated", [[(1, 2.1, 0.11), (8, 5.0, 0.3)], [(1, 2.2, 0.13), (8, 5.2, 0.35)]])
    fig = figure(report_of(base, other))
    try:
        for axis in fig.axes:
            assert axis.get_ylim()[0] == 0 and axis.get_xlim()[0] == 0
            # Markers at the measured loads only: no line joins c1 to c8.
            assert all(line.get_linestyle() in ("None", "") for line in axis.lines)
        throughput = fig.axes[2]
        assert len(throughput.collections) == 2  # one set of error bars per topology
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_repeats_interleave_the_topologies_a_b_then_b_a(monkeypatch, capsys):
    from stagevisor.supervisor.cli import build_parser
    from stagevisor.supervisor.commands import bench

    order = []

    async def one(result, args, workload, progress):
        order.append(result.topology.label)
        result.rows = [Row(1, None, summarize([outcome(0.1, 1.0)], 1.0), {}, repeats=[{"requests_per_second": 1.0}])]

    monkeypatch.setattr(bench, "_one", one)
    argv = ["bench", "--model-path", "demo", "--topology", "declared", "--topology", "--isolate-stage vocoder"]
    args = build_parser().parse_args([*argv, "--repeats", "3", "--concurrency", "1", "--format", "json"])
    assert bench.run(args) == 0
    assert order == ["declared", "--isolate-stage vocoder", "--isolate-stage vocoder", "declared"] + [
        "declared",
        "--isolate-stage vocoder",
    ]
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["workload"]["repeats"] == 3 and report["machine"]["cpus"] >= 1
    assert len(report["topologies"][0]["rows"][0]["repeats"]) == 3


def test_when_every_topology_is_invalid_nothing_runs_and_the_exit_status_is_2(monkeypatch, capsys):
    """A bench whose only topologies the placement rules refuse measured nothing and exited 0."""
    import json

    from stagevisor.supervisor.cli import build_parser
    from stagevisor.supervisor.commands import bench

    started = []

    async def one(result, args, workload, progress):
        started.append(result.topology.label)

    monkeypatch.setattr(bench, "_one", one)
    argv = ["bench", "--model-path", "demo", "--topology", "--isolate-stage nope", "--concurrency", "1"]
    assert bench.run(build_parser().parse_args([*argv, "--format", "json"])) == 2
    assert started == []
    [topology] = json.loads(capsys.readouterr().out)["topologies"]
    assert topology["error"]["code"] == "UNKNOWN_STAGE"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup", "-1"], "--warmup must be >= 0 requests (0: no warm-up), got -1"),
        (["--concurrency", "1,,2"], "--concurrency expects numbers like 1,8,32, got '1,,2'"),
        (["--concurrency", "1,8,"], "--concurrency expects numbers like 1,8,32, got '1,8,'"),
        (["--concurrency", ","], "--concurrency expects numbers like 1,8,32, got ','"),
    ],
)
def test_bench_refuses_a_negative_warmup_or_an_empty_concurrency_item_before_starting_a_daemon(capsys, argv, message):
    """`--warmup -1` ran as 0 and `--concurrency 1,,2` as 1,2: a typo measured as something else."""
    from stagevisor.supervisor.cli import main

    assert main(["bench", *argv]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize(
    ("argv", "model"),
    [
        ([], "demo"),
        (["--model-path", "zonos2", "--stand-ins"], "zonos2"),  # qwen3-tts with no checkpoint now stops first
        (["--address", "127.0.0.1:50551"], None),
    ],
)
def test_the_report_names_the_model_its_own_daemons_serve_as_plan_does(monkeypatch, capsys, argv, model):
    """Without --model-path the report said "model": null (the raw option) for the demo its daemons served, and the
    plot titled it "running daemon". Now it is the planned model's name; null only for the daemon at --address."""
    import json

    from stagevisor.supervisor.cli import build_parser
    from stagevisor.supervisor.commands import bench

    async def one(result, *rest):
        result.rows = [Row(1, None, summarize([outcome(0.1, 1.0)], 1.0), {})]

    monkeypatch.setattr(bench, "_one", one)
    monkeypatch.setattr(bench, "_one_at_address", one)
    args = build_parser().parse_args(["bench", *argv, "--concurrency", "1", "--format", "json"])
    assert bench.run(args) == 0
    assert json.loads(capsys.readouterr().out)["model"] == model


def test_the_plot_title_names_the_model_and_the_requests_per_point_in_the_right_number():
    """The title read "running daemon, 1 requests per point" for the bench's own demo daemon."""
    from stagevisor.supervisor.bench.plot import heading

    one = {"model": "demo", "workload": {"requests_per_row": 1, "repeats": 1}}
    assert heading(one) == "stagevisor bench: demo, 1 request per point, one run per point (no spread)"
    many = {"model": None, "workload": {"requests_per_row": 16, "repeats": 3}}
    assert heading(many).startswith("stagevisor bench: running daemon, 16 requests per point, medians of 3 runs")
    timed = {"model": "demo", "workload": {"requests_per_row": None, "duration_per_row": 30.0, "repeats": 1}}
    assert heading(timed).startswith("stagevisor bench: demo, 30 s per point, ")


def failing(label: str, rps: float, ttfa: float, failed: int, served: int = 2) -> TopologyResult:
    """A topology measured at c8 whose `failed` requests of `failed + served` failed UNAVAILABLE."""
    out = result(label, [(8, rps, ttfa)])
    out.rows[0].summary.requests = failed + served
    out.rows[0].summary.errors = {"UNAVAILABLE": failed} if failed else {}
    return out


def test_the_summary_says_how_many_requests_of_a_topology_failed_and_names_no_such_topology_best():
    """A run whose worker was SIGKILLed mid-run had 693 of 834 requests fail UNAVAILABLE and the summary said
    "best for throughput: `declared`" without a word of them: its figures were of the 141 that succeeded."""
    broken = failing("declared", 9.0, 0.05, failed=693, served=141)
    sound = failing("--isolate-stage vocoder", 4.0, 0.10, failed=0)
    add_ratios([broken, sound])
    lines = verdict([broken, sound])
    assert lines[0] == (
        "`declared`: 693 of 834 requests failed (693 UNAVAILABLE at c8); its figures are of the requests that succeeded"
    )
    assert not any(line.startswith("`--isolate-stage vocoder`:") for line in lines)  # none of its requests failed
    assert "best for throughput: `--isolate-stage vocoder` (4.00 requests/s at the highest load)" in lines
    assert (
        "best for latency: `--isolate-stage vocoder` (100.0 ms median time to first audio at the lowest load)" in lines
    )
    assert "`declared` is left out of best: requests failed on it (above)" in lines


def test_when_requests_failed_on_every_topology_no_best_is_named():
    broken = [failing("declared", 9.0, 0.05, failed=3), failing("--isolate-stage vocoder", 4.0, 0.1, failed=1)]
    add_ratios(broken)
    lines = verdict(broken)
    assert lines[1].startswith("`--isolate-stage vocoder`: 1 of 3 requests failed (1 UNAVAILABLE at c8)")
    assert "no best topology named: requests failed on every topology (above); rerun once they succeed" in lines
    assert not any(line.startswith("best for") for line in lines)


@pytest.mark.parametrize("failed", [0, 3])
def test_one_topology_measured_names_no_best(failed):
    """`bench --topology declared` said "best for throughput: `declared`" of the only topology it measured (and,
    when some of its requests failed, that no best was named because requests failed "on every topology")."""
    only = failing("declared", 9.0, 0.05, failed=failed)
    add_ratios([only])
    lines = verdict([only])
    assert not any(line.startswith(("best for", "no best topology")) for line in lines)
    assert lines == (
        ["`declared`: 3 of 5 requests failed (3 UNAVAILABLE at c8); its figures are of the requests that succeeded"]
        if failed
        else []
    )


def test_the_table_counts_refused_requests_apart_from_failed_ones_beside_the_completed_throughput(capsys):
    """A row whose requests were mostly refused by admission read `req/s 1.00 ... errors n 9`: neither what the
    throughput counted nor that the errors were refusals."""
    from stagevisor.supervisor.bench.table import COLUMNS, print_table

    refused = result("declared", [(8, 1.0, 0.1)])
    refused.rows[0].summary.errors = {"RESOURCE_EXHAUSTED": 90, "UNAVAILABLE": 2}
    refused.rows[0].summary.real_time_factor = None
    add_ratios([refused])
    print_table(report_of(refused, repeats=1))
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("topology"))
    row = next(line for line in lines if line.startswith("declared"))
    cells = dict(zip([name for name, _, _ in COLUMNS][1:], row[35:].split(), strict=False))
    assert "ok req/s" in header and "refused n" in header and "failed n" in header
    assert row.split()[-4:-2] == ["90", "2"] and cells["ok req/s"] == "1.00"
    assert "rtf x" in header and " 0.00 " not in row  # no real-time factor measured is "-", not 0.00
    assert any("refused n = turned away by the daemon's admission" in line for line in lines)


def test_a_topology_that_could_not_be_measured_shows_its_whole_error(capsys):
    """The table cut a topology's error at 90 characters, often before the advice that ends it."""
    from stagevisor.supervisor.bench.table import print_table

    message = "every request was refused: " + "x" * 120 + " -- raise --max-concurrent-requests to measure it"
    broken = TopologyResult(
        Topology("declared", PlacementRequest()), error={"code": "REQUESTS_FAILED", "message": message}
    )
    print_table(report_of(broken, repeats=1))
    out = capsys.readouterr().out
    shown = " ".join(line[35:] for line in out.splitlines() if line[:34].strip() in ("declared", "") and line[35:])
    assert f"REQUESTS_FAILED: {message}" in shown


def test_two_topologies_whose_labels_differ_past_the_column_width_stay_apart_and_an_unknown_rss_is_no_zero(capsys):
    """Labels were cut at 34 characters: `--isolate-stage vocoder --process-replicas vocoder=2` and `...=3` read as one
    topology twice. A worker whose peak RSS was not measured read `0 MiB`."""
    from stagevisor.supervisor.bench.table import print_table

    two = result("--isolate-stage vocoder --process-replicas vocoder=2", [(1, 2.0, 0.1)])
    three = result("--isolate-stage vocoder --process-replicas vocoder=3", [(1, 2.1, 0.1)])
    three.rows[0].resources = {"vocoder/0": {"cpu_seconds": None, "peak_rss_bytes": None}}
    add_ratios([two, three])
    print_table(report_of(two, three, repeats=1))
    out = capsys.readouterr().out
    assert out.count("--isolate-stage vocoder --process-replicas vocoder=2 ") == 2  # its row and its resources
    assert out.count("--isolate-stage vocoder --process-replicas vocoder=3 ") == 2
    assert "vocoder/0 - s - MiB" in out and "0 MiB" not in out


def test_the_summary_says_refused_requests_were_refused_not_that_they_failed():
    """Requests admission turned away (RESOURCE_EXHAUSTED) were summed with failures: "92 of 100 requests failed
    (90 RESOURCE_EXHAUSTED at c8, 2 UNAVAILABLE at c8)", where the table counts them apart."""
    crowded = failing("declared", 1.0, 0.05, failed=0, served=8)
    crowded.rows[0].summary.errors = {"RESOURCE_EXHAUSTED": 90, "UNAVAILABLE": 2}
    crowded.rows[0].summary.requests = 100
    add_ratios([crowded])
    assert verdict([crowded])[0] == (
        "`declared`: 90 of 100 requests were refused by the daemon's admission (90 RESOURCE_EXHAUSTED at c8); "
        "2 of 100 requests failed (2 UNAVAILABLE at c8); its figures are of the requests that succeeded"
    )
