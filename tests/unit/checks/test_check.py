"""`stagevisor check`: each broken executor is a CONTRACT_VIOLATION naming the stage and the field."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from stagevisor.supervisor.checks.contract import check_pipeline
from tests.integration.daemon_helpers import make_plan

REQUEST = {"text": "hi", "voice": "", "reference_audio": b"", "reference_transcript": "", "options": {}}
HERE = "tests.unit.checks.test_check"


class Engine:
    def __init__(self, chunk=None, data=None):
        self.chunk = chunk if chunk is not None else {"level": 0.25}
        self.data = data if data is not None else {"frames": 2}

    async def process(self, payload, ctx):
        await ctx.stream(self.chunk)
        return self.data


class Vocoder:
    def __init__(self, audio=None, rate=16000):
        self.audio = audio
        self.rate = rate

    async def process(self, payload, ctx):
        async for chunk in ctx.chunks():
            if "level" not in chunk:
                raise KeyError("level")
            audio = self.audio if self.audio is not None else np.full(8, chunk["level"], dtype=np.float32)
            await ctx.stream({"audio": audio, "sample_rate": self.rate})
        return None


class SyncProcess:
    def process(self, payload, ctx):
        return {}


class WrongReturn:
    async def process(self, payload, ctx):
        return ["not", "a", "dict"]


def make_engine():
    return Engine()


def make_vocoder():
    return Vocoder()


def make_sync():
    return SyncProcess()


def make_wrong_return():
    return WrongReturn()


def make_none():
    return None


def plan_of(engine: str, vocoder: str, **args):
    plan = make_plan(
        "t",
        [("engine", "pipeline", None, None), ("vocoder", "pipeline", None, None)],
        factories={"engine": f"{HERE}:{engine}", "vocoder": f"{HERE}:{vocoder}"},
    )
    import dataclasses

    stages = tuple(dataclasses.replace(s, args=args.get(s.name, {})) for s in plan.stages)
    return dataclasses.replace(plan, stages=stages)


def run(plan):
    return asyncio.run(check_pipeline(plan, REQUEST))


def only_violation(report):
    assert not report.ok
    [violation] = report.violations
    return violation.stage, violation.field, violation.message


def test_a_good_pipeline_passes_with_a_report():
    report = run(plan_of("make_engine", "make_vocoder"))
    assert report.ok, report.violations
    assert report.sample_rate == 16000 and report.audio_seconds == pytest.approx(8 / 16000)
    assert report.stages["engine"].returned == {"frames": "int"}
    edge = report.edges[("engine", "vocoder", "stream_to")]
    assert edge.handoffs == 1 and edge.bytes > 0 and edge.transport == "in_process"


class ExitsInProcess:
    async def process(self, payload, ctx):
        raise SystemExit(0)


def make_exiting():
    raise SystemExit(0)  # as a model library's loader may do


def make_exits_in_process():
    return ExitsInProcess()


@pytest.mark.parametrize("factory, field", [("make_exiting", "factory"), ("make_exits_in_process", "process")])
def test_a_stage_that_calls_sys_exit_is_a_violation_not_a_silent_pass(factory, field):
    """`stagevisor check` ended with exit status 0 and no output when a factory or process() called
    sys.exit(0): a pass in the operator's CI for a pipeline that cannot serve."""
    stage, got, message = only_violation(run(plan_of("make_engine", factory)))
    assert (stage, got) == ("vocoder", field) and "SystemExit" in message


def test_a_non_async_process_is_named():
    stage, field, message = only_violation(run(plan_of("make_sync", "make_vocoder")))
    assert (stage, field) == ("engine", "process") and "async def" in message


def test_a_factory_returning_none_is_named():
    stage, field, message = only_violation(run(plan_of("make_engine", "make_none")))
    assert (stage, field) == ("vocoder", "executor") and "no process() method" in message


def test_a_wrong_return_type_is_named():
    stage, field, message = only_violation(run(plan_of("make_wrong_return", "make_vocoder")))
    assert (stage, field) == ("engine", "return value") and "got list" in message


def test_an_unencodable_payload_names_the_field_path(monkeypatch):
    import stagevisor.supervisor.worker.build as worker

    async def build(stage, spec):
        return Engine(data={"latent": object()}) if stage.name == "engine" else Vocoder()

    monkeypatch.setattr(worker, "build_stage", build)
    stage, field, message = only_violation(run(plan_of("make_engine", "make_vocoder")))
    assert (stage, field) == ("engine", "data['latent']")
    assert message.startswith("object cannot cross a process boundary; use None, bool, int")


@pytest.mark.parametrize(
    "vocoder, field, words",
    [
        (Vocoder(audio=np.full(8, 1.5, dtype=np.float32)), 'chunk["audio"]', "within [-1, 1]"),
        (Vocoder(audio=np.zeros(8, dtype=np.float64)), 'chunk["audio"]', "float32"),
        (Vocoder(rate=0), 'chunk["sample_rate"]', "positive int"),
    ],
)
def test_terminal_audio_out_of_contract_is_named(monkeypatch, vocoder, field, words):
    import stagevisor.supervisor.worker.build as worker

    async def build(stage, spec):
        return Engine() if stage.name == "engine" else vocoder

    monkeypatch.setattr(worker, "build_stage", build)
    stage, got_field, message = only_violation(run(plan_of("make_engine", "make_vocoder")))
    assert (stage, got_field) == ("vocoder", field) and words in message


def test_a_chunk_the_next_stage_rejects_names_the_receiving_stage(monkeypatch):
    import stagevisor.supervisor.worker.build as worker

    async def build(stage, spec):
        return Engine(chunk={"volume": 1}) if stage.name == "engine" else Vocoder()

    monkeypatch.setattr(worker, "build_stage", build)
    stage, field, message = only_violation(run(plan_of("make_engine", "make_vocoder")))
    assert (stage, field) == ("vocoder", "process") and "KeyError" in message


class Chatty(Engine):
    """Streams more chunks than the stream_to queue holds."""

    async def process(self, payload, ctx):
        for _ in range(50):
            await ctx.stream({"level": 0.25})
        return {"frames": 50}


class FailsAtOnce:
    async def process(self, payload, ctx):
        raise RuntimeError("vocoder weights missing")


class ReadsNothing:
    async def process(self, payload, ctx):
        await ctx.stream({"audio": np.zeros(8, dtype=np.float32), "sample_rate": 16000})
        return None


@pytest.mark.parametrize("vocoder", [FailsAtOnce(), ReadsNothing()], ids=["fails", "reads nothing"])
def test_a_stream_to_stage_that_ends_early_does_not_hang_the_check(monkeypatch, vocoder):
    """The engine streams on after its vocoder ended: the check reports the vocoder's failure, or passes
    as serve does (the chunks it never read are dropped), instead of waiting on a full queue forever."""
    import stagevisor.supervisor.worker.build as worker

    async def build(stage, spec):
        return Chatty() if stage.name == "engine" else vocoder

    monkeypatch.setattr(worker, "build_stage", build)
    report = asyncio.run(asyncio.wait_for(check_pipeline(plan_of("make_engine", "make_vocoder"), REQUEST), 30))
    if isinstance(vocoder, FailsAtOnce):
        stage, field, message = only_violation(report)
        assert (stage, field) == ("vocoder", "process") and "vocoder weights missing" in message
    else:
        assert report.ok, report.violations


class Endless:
    async def process(self, payload, ctx):
        while True:
            await ctx.stream({"audio": np.zeros(16000, dtype=np.float32), "sample_rate": 16000})


def test_a_stage_that_streams_audio_forever_fails_the_check_at_serves_audio_limit(monkeypatch):
    import stagevisor.supervisor.worker.build as worker

    async def build(stage, spec):
        return Engine() if stage.name == "engine" else Endless()

    monkeypatch.setattr(worker, "build_stage", build)
    report = asyncio.run(asyncio.wait_for(check_pipeline(plan_of("make_engine", "make_vocoder"), REQUEST), 60))
    stage, field, message = only_violation(report)
    assert (stage, field) == ("vocoder", "chunk") and "more than 600 s of audio" in message


def test_verify_edges_shares_one_graph_cache_that_it_removes_and_the_operators_own_setting_wins(monkeypatch):
    import os
    from pathlib import Path

    from stagevisor.supervisor.commands.check import _shared_graph_cache
    from stagevisor.supervisor import envs

    variable = envs.CACHE_DIR.name

    monkeypatch.delenv(variable, raising=False)
    with _shared_graph_cache():
        cache = Path(os.environ[variable])  # what every worker of every topology inherits
        assert cache.is_dir()
    assert variable not in os.environ and not cache.exists()
    for own in ("/var/cache/mine", ""):  # a persistent directory, or the cache turned off
        monkeypatch.setenv(variable, own)
        with _shared_graph_cache():
            assert os.environ[variable] == own
        assert os.environ[variable] == own


def test_a_misspelled_factory_attribute_is_named_plainly_with_the_close_match():
    stage, field, message = only_violation(run(plan_of("make_engine", "make_vocodr")))
    assert (stage, field) == ("vocoder", "factory")
    assert message == (
        f"'{HERE}:make_vocodr': module {HERE} has no attribute 'make_vocodr'; did you mean 'make_vocoder'?"
    )


def test_the_table_shows_no_row_for_a_stage_that_never_ran(capsys):
    """A stage built before another's build failed used to print `engine ... null -> null` first."""
    from stagevisor.supervisor.commands.check import _print_table

    report = run(plan_of("make_engine", "make_vocodr"))
    _print_table(report, [])
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [f"error: CONTRACT_VIOLATION: {report.violations[0]}"]


def lazy_vocoder():
    import not_installed_vocoder_dep  # noqa: F401 - the dependency a factory imports when it builds

    return Vocoder()


def test_a_factory_module_not_on_the_import_path_is_module_not_found_not_a_raw_import_error(capsys):
    """Before: `CONTRACT_VIOLATION: ... failed to build: ModuleNotFoundError: No module named '...'`."""
    from stagevisor.supervisor.commands.check import _print_table

    plan = plan_of("make_engine", "make_vocoder")
    import dataclasses

    typo = "tests.unit.checks.test_chek:make_vocoder"
    plan = dataclasses.replace(plan, stages=(plan.stages[0], dataclasses.replace(plan.stages[1], factory=typo)))
    report = run(plan)
    [violation] = report.violations
    assert (violation.code, violation.stage, violation.field) == ("MODULE_NOT_FOUND", "vocoder", "factory")
    assert str(violation).startswith(
        f"stage 'vocoder': factory '{typo}' cannot be imported: no module 'tests.unit.checks.test_chek' on the "
        "import path (searched: "
    )
    assert "did you mean 'tests.unit.checks.test_check'?" in str(violation)
    assert violation.to_json()["code"] == "MODULE_NOT_FOUND"
    assert (violation.to_json()["stage"], violation.to_json()["stages"]) == ("vocoder", ["vocoder"])
    _print_table(report, [])
    assert capsys.readouterr().out.strip() == f"error: MODULE_NOT_FOUND: {violation}"


def test_a_factory_that_imports_a_missing_package_is_missing_dependency_naming_the_import():
    report = run(plan_of("make_engine", "lazy_vocoder"))
    [violation] = report.violations
    assert (violation.code, violation.stage, violation.field) == ("MISSING_DEPENDENCY", "vocoder", "factory")
    assert str(violation).startswith(
        f"stage 'vocoder': factory '{HERE}:lazy_vocoder' cannot be imported: module '{HERE}' was found, but an "
        f"import failed: No module named 'not_installed_vocoder_dep' (at {__file__}:"
    )
    assert "install the package that provides 'not_installed_vocoder_dep'" in str(violation)


class Refuses:
    async def process(self, payload, ctx):
        from stagevisor.stages.base import InvalidRequest

        raise InvalidRequest(f"text must not be {payload.request['text']!r}")


def make_refuses():
    return Refuses()


def test_a_stage_refusing_the_checks_request_is_request_refused_not_a_contract_violation(capsys):
    """`check --option seed=-1` blamed the stage: `CONTRACT_VIOLATION: ... process: raised InvalidRequest: ...`,
    where the stage kept the contract (InvalidRequest is how it refuses a request) and the operator's request was
    wrong."""
    from stagevisor.supervisor.commands.check import _print_table

    report = run(plan_of("make_refuses", "make_vocoder"))
    [violation] = report.violations
    assert (violation.code, violation.stage, violation.field) == ("REQUEST_REFUSED", "engine", "request")
    assert str(violation) == (
        "stage 'engine' refused the check's request: text must not be 'hi'; the stage kept the contract: change the "
        "request (--text, --voice, --reference-audio, --reference-transcript, --option)"
    )
    _print_table(report, [])
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"error: REQUEST_REFUSED: {violation}"


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_a_jobs_count_below_one_is_an_invalid_option_not_a_placement_error(monkeypatch, capsys, jobs):
    """`--jobs 0` read MALFORMED_ASSIGNMENT, the code of a malformed --stage-process."""
    import stagevisor.supervisor.commands.placement_options as plan_command
    from stagevisor.supervisor.cli import main

    monkeypatch.setattr(plan_command, "plan_from_args", lambda args: plan_of("make_refuses", "make_vocoder"))
    assert main(["check", "--jobs", jobs, "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == {
        "code": "INVALID_CONFIG",
        "message": f"--jobs must be at least 1, got {jobs}",
    }


def test_an_empty_text_is_the_checks_request_not_a_fall_back_to_the_built_in_sentences(monkeypatch, capsys):
    """`check --text ""` checked the two built-in sentences instead, and passed."""
    import stagevisor.supervisor.commands.placement_options as plan_command
    from stagevisor.supervisor.cli import main

    monkeypatch.setattr(plan_command, "plan_from_args", lambda args: plan_of("make_refuses", "make_vocoder"))
    assert main(["check", "--text", ""]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        "error: REQUEST_REFUSED: stage 'engine' refused the check's request: text must not be ''; the stage kept "
        "the contract: change the request (--text, --voice, --reference-audio, --reference-transcript, --option)"
    )


@pytest.mark.parametrize("value", ["engine", "engine,", ",vocoder", "engine,vocoder,x"])
def test_an_edge_that_is_not_two_stage_names_is_malformed(value):
    """`--edge engine,vocoder,x` read as the edge 'engine' -> 'vocoder,x' and failed UNKNOWN_STAGE, where
    `--edge engine` was already MALFORMED_ASSIGNMENT."""
    from stagevisor.supervisor.commands.check import _edges
    from stagevisor.supervisor.errors import StagevisorError

    with pytest.raises(StagevisorError) as raised:
        _edges(["engine,vocoder", value])
    assert raised.value.to_json() == {
        "error": {"code": "MALFORMED_ASSIGNMENT", "message": f"--edge expects SRC,DST (two stage names), got {value!r}"}
    }


def test_an_edge_the_pipeline_lacks_is_named_in_the_error_object_with_the_pipelines_edges():
    """The error had no "edge" key (DESIGN 5: errors carry `edge` where one applies), and listed the pipeline's
    edges as `engine,vocoder, ...`, which reads as three names."""
    from stagevisor.supervisor.checks.edges import verify_edges
    from stagevisor.supervisor.errors import StagevisorError

    with pytest.raises(StagevisorError) as raised:  # refused before any daemon starts
        asyncio.run(verify_edges(plan_of("make_engine", "make_vocoder"), [REQUEST], [("vocoder", "engine")]))
    assert raised.value.to_json() == {
        "error": {
            "code": "UNKNOWN_STAGE",
            "message": "no edge 'vocoder' -> 'engine' in this pipeline; name one of its edges: 'engine' -> 'vocoder'",
            "edge": ["vocoder", "engine"],
        }
    }


def never_built(*args, **kwargs):
    raise AssertionError("the check built the pipeline before refusing what it cannot verify")


@pytest.mark.parametrize(
    ("argv", "engine_tp_size", "code"),
    [
        (["--edge", "vocoder,engine"], 1, "UNKNOWN_STAGE"),
        (["--verify-edges"], 2, "TP_STAGE"),
    ],
)
def test_an_edge_or_pipeline_it_cannot_verify_is_refused_before_any_stage_is_built(
    monkeypatch, capsys, argv, engine_tp_size, code
):
    """`check --edge vocoder,engine` built every stage and ran the smoke request (minutes for a real model) before
    it said the pipeline has no such edge; a tensor-parallel pipeline's refusal came as late."""
    import dataclasses

    import stagevisor.supervisor.checks.contract as contract
    import stagevisor.supervisor.commands.placement_options as plan_command
    from stagevisor.supervisor.cli import main

    plan = plan_of("make_engine", "make_vocoder")
    stages = tuple(dataclasses.replace(s, tp_size=engine_tp_size) if s.name == "engine" else s for s in plan.stages)
    plan = dataclasses.replace(plan, stages=stages)
    monkeypatch.setattr(plan_command, "plan_from_args", lambda args: plan)
    monkeypatch.setattr(contract, "check_pipeline", never_built)
    assert main(["check", *argv, "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == code


def test_a_stream_to_edge_alone_is_named_as_such_not_silently_skipped():
    """An edge declared only as `stream_to` was accepted by `--edge` and then dropped from the `next` edges the check
    splits: the command verified nothing and exited 0."""
    import dataclasses

    from stagevisor.supervisor.checks.edges import edges_to_verify
    from stagevisor.supervisor.errors import StagevisorError
    from stagevisor.supervisor.plan import Edge

    plan = plan_of("make_engine", "make_vocoder")
    plan = dataclasses.replace(plan, edges=(*plan.edges, Edge("vocoder", "engine", "stream_to", False, True)))
    assert edges_to_verify(plan, [("engine", "vocoder")]) == [("engine", "vocoder")]
    with pytest.raises(StagevisorError) as raised:
        edges_to_verify(plan, [("vocoder", "engine")])
    assert raised.value.to_json() == {
        "error": {
            "code": "UNKNOWN_STAGE",
            "message": "edge 'vocoder' -> 'engine' is a stream_to edge: --edge names a `next` edge, and splitting "
            "there carries every handoff that crosses, streams included; name one of: 'engine' -> 'vocoder'",
            "edge": ["vocoder", "engine"],
        }
    }


def test_the_tables_columns_are_as_wide_as_their_longest_cell(capsys):
    """zonos2's `preprocessing -> speaker_encode` overran the edge column (29 wide) and pushed the row's verdicts out
    of line (`preprocessing -> speaker_encode safe      identical`); a group name over 12 did the same to the stage
    table."""
    from stagevisor.supervisor.checks.contract import CheckReport, StageReport
    from stagevisor.supervisor.checks.edges import EdgeVerdict
    from stagevisor.supervisor.commands.check import _print_table

    stages = {
        "speaker_encode": StageReport("speaker_encode", "speaker_encode_group", received={}, returned={}),
        "g2p": StageReport("g2p", "pipeline", received={}, returned={}),
    }
    verdicts = [
        EdgeVerdict("preprocessing", "speaker_encode", True, True, None),
        EdgeVerdict("tts_engine", "vocoder", False, False, "request 1: audio differs from sample 3"),
    ]
    _print_table(CheckReport("zonos2", stages=stages), verdicts)
    lines = capsys.readouterr().out.splitlines()

    def starts(line: str, *cells: str) -> list[int]:
        """Where each cell starts, each searched after the one before (the edge name holds a `-` too)."""
        at = [line.index(cells[0], line.index("  "))]
        for cell in cells[1:]:
            at.append(line.index(cell, at[-1] + 1))
        return at

    stage_header = next(line for line in lines if line.startswith("stage"))
    stage_rows = [line for line in lines if line.startswith(("speaker_encode ", "g2p "))]
    assert [starts(row, "speaker_encode_group" if "speaker" in row else "pipeline") for row in stage_rows] == [
        starts(stage_header, "group")
    ] * 2
    assert all(row.index("ms") == stage_rows[0].index("ms") for row in stage_rows)
    edge_header = next(line for line in lines if line.startswith("edge "))
    assert starts(lines[-2], "safe", "identical", "-") == starts(edge_header, "declared", "observed", "first")
    assert starts(lines[-1], "unsafe", "differs", "request") == starts(edge_header, "declared", "observed", "first")
    assert lines[-2].startswith("preprocessing -> speaker_encode  safe")


def test_the_table_counts_one_handoff_in_the_singular(capsys):
    """An edge a single request crossed once read `in_process, 1 handoffs` (every `next` edge of a default check)."""
    from stagevisor.supervisor.checks.contract import CheckReport, EdgeReport
    from stagevisor.supervisor.commands.check import _print_table

    report = CheckReport("demo")
    report.edges[("a", "b", "next")] = EdgeReport("a", "b", "next", False, "in_process", bytes=23, handoffs=1)
    report.edges[("b", "c", "stream_to")] = EdgeReport("b", "c", "stream_to", False, "in_process", bytes=9, handoffs=2)
    _print_table(report, [])
    lines = capsys.readouterr().out.splitlines()
    assert "edge a -> b (next): in_process, 1 handoff, 23 bytes encoded" in lines
    assert "edge b -> c (stream_to): in_process, 2 handoffs, 9 bytes encoded" in lines
