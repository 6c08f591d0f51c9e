"""Stand-ins only when asked (before any worker starts) and labelled wherever a model is shown."""

from __future__ import annotations

import json
import shlex
import sys
from types import SimpleNamespace

import pytest

from stagevisor.models.requirements import check_runnable, standin_stages
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands.report_text import format_topology
from stagevisor.supervisor.reports import TopologyReport
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.plan import Plan


def build_plan(model: str | None) -> Plan:
    return plan_placement(PlacementRequest(model))


def test_a_seed_model_without_stand_ins_asked_for_is_refused_naming_its_stages_and_the_flag():
    plan = build_plan("higgs-tts")
    with pytest.raises(StagevisorError) as caught:
        check_runnable(plan, stand_ins=False)
    error = caught.value
    assert error.code is ErrorCode.STAND_IN_NOT_REQUESTED
    assert error.stages == ("preprocessing", "audio_encoder", "tts_engine", "vocoder")
    assert "not the model's weights" in error.message
    assert "stagevisor serve --model-path higgs-tts --stand-ins" in error.message


def test_stand_ins_asked_for_and_the_real_voices_run():
    check_runnable(build_plan("higgs-tts"), stand_ins=True)
    for model in (None, "demo", "piper"):
        plan = build_plan(model)
        assert standin_stages(plan) == ()
        check_runnable(plan, stand_ins=False)


@pytest.mark.parametrize("command", ["serve", "check", "bench"])
def test_the_commands_that_start_executors_refuse_a_seed_model_before_anything_starts(monkeypatch, capsys, command):
    started = []
    monkeypatch.setattr("stagevisor.supervisor.service.run", lambda *a, **k: started.append(a))
    monkeypatch.setattr("stagevisor.supervisor.checks.contract.check_pipeline", lambda *a, **k: started.append(a))
    argv = [command, "--model-path", "zonos2", *(["--format", "json"] if command != "serve" else [])]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and started == []
    if command == "serve":
        assert err.startswith("error: model 'zonos2' has no real executors here") and "--stand-ins" in err
    else:
        assert json.loads(out)["error"]["code"] == "STAND_IN_NOT_REQUESTED"


@pytest.mark.parametrize("command", ["serve", "check", "bench"])
def test_the_refusal_repeats_the_operators_own_command_with_the_flag_added(monkeypatch, capsys, tmp_path, command):
    """Before: `serve --config fishaudio-s2-pro.yaml --listen ...` was told `(stagevisor serve --model-path
    fishaudio/s2-pro --stand-ins)`, which drops the config (its placement and fractions) and the other options."""
    monkeypatch.setattr("stagevisor.supervisor.service.run", lambda *a, **k: None)
    config = tmp_path / "my config.yaml"
    config.write_text("model_path: fishaudio/s2-pro\n")
    placement = ["--topology", "--isolate-stage vocoder"] if command == "bench" else ["--isolate-stage", "vocoder"]
    assert main([command, "--config", str(config), *placement]) == 2
    err = capsys.readouterr().err
    typed = shlex.join(["stagevisor", command, "--config", str(config), *placement, "--stand-ins"])
    assert f"({typed})" in err, err


def test_plan_needs_no_flag_and_labels_stand_in_stages(capsys):
    assert main(["plan", "--model-path", "zonos2", "--format", "json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert {s["stand_in"] for s in stages} == {True}
    assert main(["plan", "--format", "json"]) == 0
    assert {s["stand_in"] for s in json.loads(capsys.readouterr().out)["stages"]} == {False}


def test_models_says_which_executors_are_stand_ins(capsys):
    assert main(["models", "--format", "json"]) == 0
    executors = {m["key"]: m["executors"] for m in json.loads(capsys.readouterr().out)["models"]}
    assert executors["demo"] == executors["piper"] == executors["qwen3-tts"] == "real: the model's own weights"
    seeds = [text for key, text in executors.items() if key not in ("demo", "piper", "qwen3-tts")]
    assert len(seeds) == 9 and all("stand-in" in text and "--stand-ins" in text for text in seeds)


def topology_of(model: str | None) -> TopologyReport:
    """A topology without runtime groups: the plan's stages are what the table's label reads."""
    data = {**build_plan(model).to_json(), "groups": [], "edges": [], "gpus": [], "warnings": []}
    return TopologyReport.from_json(data)


def test_the_topology_table_names_the_stand_in_stages():
    text = format_topology(topology_of("zonos2"))
    assert (
        "stand-ins: preprocessing, speaker_encode, tts_engine, vocoder (the default voice, not the model's weights)"
        in text
    )
    assert "stand-ins" not in format_topology(topology_of(None))


def test_serve_with_stand_ins_says_so_before_starting(monkeypatch, capsys, tmp_path):
    started = []

    async def run(*args, **kwargs) -> int:
        started.append(args)
        return 0

    monkeypatch.setattr("stagevisor.supervisor.service.run", run)
    argv = ["serve", "--model-path", "zonos2", "--stand-ins", "--admin-address", f"unix:{tmp_path}/admin.sock"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "note: model 'zonos2' runs stand-ins for preprocessing, speaker_encode, tts_engine, vocoder" in err
    assert "not the model's weights" in err and len(started) == 1


@pytest.fixture
def extras_installed(monkeypatch):
    """Which modules the extras check finds here: set the returned list to the ones missing (default: none)."""
    from stagevisor.stages import extras

    missing: list[str] = []
    monkeypatch.setattr(extras.missing_extras, "__defaults__", (lambda module: module not in missing,))
    return missing


@pytest.fixture
def nothing_starts(monkeypatch):
    """Fails the test if check builds a stage or bench starts a daemon."""
    from stagevisor.supervisor.commands import bench

    monkeypatch.setattr("stagevisor.supervisor.checks.contract.check_pipeline", lambda *a: pytest.fail("built"))
    monkeypatch.setattr(bench, "_one", lambda *a: pytest.fail("bench started a daemon"))
    monkeypatch.setattr("stagevisor.supervisor.service.run", lambda *a, **k: pytest.fail("serve started"))


@pytest.mark.parametrize(("command", "status"), [("check", 1), ("bench", 2)])
def test_check_and_bench_stop_on_a_missing_checkpoint_before_anything_starts(
    monkeypatch, capsys, tmp_path, extras_installed, nothing_starts, command, status
):
    """`check --model-path qwen3-tts` loaded torch and failed 20 s later, CONTRACT_VIOLATION from the stage's
    factory, where serve stopped at once with QWEN3_NO_CHECKPOINT."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert main([command, "--model-path", "qwen3-tts", "--format", "json"]) == status
    out = json.loads(capsys.readouterr().out)
    [error] = out["violations"] if command == "check" else [out["error"]]
    assert error["code"] == "MISSING_REQUIREMENT"
    assert "QWEN3_NO_CHECKPOINT: qwen3-tts needs a checkpoint and none was named" in error["message"]
    # The model's own requirement stops every stage: no one stage carries it, as bench's error object says.
    assert error["stages"] == ["preprocessing", "tts_engine", "vocoder"]
    if command == "check":
        assert error["stage"] is None


@pytest.mark.parametrize(("command", "status"), [("check", 1), ("bench", 2), ("serve", 1)])
def test_without_the_qwen3_extra_every_command_that_starts_executors_names_it_alike(
    capsys, tmp_path, extras_installed, nothing_starts, command, status
):
    """check said CONTRACT_VIOLATION with QWEN3_EXTRA_MISSING inside its message and `pip install
    'stagevisor[qwen3]'`, where serve said `pip install -e '.[qwen3]'`: now MISSING_DEPENDENCY before anything
    starts, with the install command right for this installation, in all three."""
    from stagevisor.supervisor.install import install_command
    from tests.qwen3_tiny import write_checkpoint

    extras_installed += ["qwen_tts", "torchaudio"]
    argv = [command, "--model-path", str(write_checkpoint(tmp_path))]
    if command == "serve":
        argv += ["--admin-address", f"unix:{tmp_path}/admin.sock"]
    else:
        argv += ["--format", "json"]
    assert main(argv) == status
    out, err = capsys.readouterr()
    if command == "serve":
        message = err
    else:
        [error] = json.loads(out)["violations"] if command == "check" else [json.loads(out)["error"]]
        assert error["code"] == "MISSING_DEPENDENCY"
        assert error["stages"] == ["preprocessing", "tts_engine", "vocoder"]
        if command == "check":
            assert error["stage"] is None  # the extra is missing for all three, not for the first
        message = error["message"]
    assert (
        "(missing: qwen_tts, torchaudio)" in message
        and f"install the 'qwen3' extra: {install_command('qwen3')}" in message
    )


def test_a_qwen3_stage_built_without_the_extra_gives_the_same_install_command(monkeypatch):
    import stagevisor.stages.qwen3 as qwen3_stages
    from stagevisor.stages.qwen3.checkpoint import CheckpointError
    from stagevisor.supervisor.install import install_command

    monkeypatch.setattr(qwen3_stages, "qwen_tts_available", lambda: False)
    # Its executors module as where only torchaudio is missing: importable (this environment may lack torch).
    monkeypatch.setitem(sys.modules, "stagevisor.stages.qwen3.executors", SimpleNamespace(Preprocessing=None))
    with pytest.raises(CheckpointError, match="QWEN3_EXTRA_MISSING") as caught:
        qwen3_stages.preprocessing("qwen3-tts")
    assert str(caught.value).endswith(f"install the 'qwen3' extra: {install_command('qwen3')}")


def test_plan_warns_of_a_checkpoint_serve_would_refuse_and_still_plans(capsys, tmp_path):
    """It printed a plan and exited 0 without a word for a 25 Hz checkpoint, which serve refuses before any
    worker starts; planning loads nothing and may plan for another host, so it warns."""
    checkpoint = tmp_path / "cfg25"
    checkpoint.mkdir()
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "tokenizer_type": "qwen3_tts_tokenizer_25hz",
        "tts_model_type": "base",
    }
    (checkpoint / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model-path", str(checkpoint), "--format", "json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert [w for w in warnings if "QWEN3_UNSUPPORTED_CHECKPOINT" in w and "25hz" in w], warnings
