"""`stagevisor plan` and `stagevisor models`: exact output shapes, exit codes and error objects (run in this
process; as processes of their own: tests/integration/test_cli_process.py)."""

import json
import sys
from pathlib import Path

import pytest

from stagevisor.models.registry import builtin_models
from stagevisor.supervisor.cli import main

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_higgs_example_prints_the_three_group_topology_of_the_spec(capsys):
    code, out, err = run(
        capsys,
        "plan",
        "--model-path",
        "bosonai/higgs-tts-3-4b",
        "--stage-process",
        "preprocessing=tts_frontend",
        "--stage-process",
        "audio_encoder=tts_frontend",
    )
    assert code == 0 and err == ""
    assert out.splitlines()[:3] == [
        "tts_frontend : preprocessing, audio_encoder",
        "pipeline     : tts_engine",
        "vocoder      : vocoder",
    ]


def test_both_placement_options_are_repeatable_on_the_command_line(capsys):
    code, out, err = run(
        capsys,
        "plan",
        "--model-path",
        "higgs-tts",
        "--isolate-stage",
        "preprocessing",
        "--isolate-stage",
        "audio_encoder",
        "--stage-process",
        "tts_engine=engine",
        "--stage-process",
        "vocoder=voc",
    )
    assert code == 0 and err == ""
    assert out.splitlines()[:4] == [
        "preprocessing : preprocessing",
        "audio_encoder : audio_encoder",
        "engine        : tts_engine",
        "voc           : vocoder",
    ]


def test_table_lists_gpu_totals_after_the_groups(capsys):
    _, out, _ = run(capsys, "plan", "--model-path", "higgs-tts")
    assert out.splitlines()[3:] == ["", "GPU 0: 0.98 of limit 1 (tts_frontend 0.03, pipeline 0.85, vocoder 0.1)"]


def test_table_ends_with_warnings(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "model_path: fishaudio/s2-pro\nstages:\n"
        "  - {name: tts_engine, runtime: {resources: {total_gpu_memory_fraction: 0.5}}}\n"
    )
    _, out, _ = run(capsys, "plan", "--config", str(config), "--isolate-stage", "vocoder")
    assert out.splitlines()[-1].startswith("warning: stage 'tts_engine' declares total_gpu_memory_fraction 0.5")


def test_json_output_has_the_design_shape(capsys):
    code, out, _ = run(capsys, "plan", "--model-path", "bosonai/higgs-tts-3-4b", "--format", "json")
    body = json.loads(out)
    assert code == 0
    assert list(body) == ["model", "model_path", "changed", "groups", "stages", "edges", "gpus", "warnings"]
    assert (body["model"], body["model_path"], body["changed"]) == ("higgs-tts", "bosonai/higgs-tts-3-4b", False)
    assert body["groups"][0] == {
        "name": "tts_frontend",
        "stages": ["preprocessing", "audio_encoder"],
        "gpu": 0,
        "total_gpu_memory_fraction": 0.03,
        "tp_rank": None,
    }
    assert body["stages"][1] == {
        "name": "audio_encoder",
        "process": "tts_frontend",
        "gpu": 0,
        "tp_size": 1,
        "total_gpu_memory_fraction": 0.03,
        "fraction_source": "declared",
        "stand_in": True,  # Higgs-TTS runs on stand-in executors (an added field; the design's are unchanged)
    }
    assert body["edges"][0] == {
        "src": "preprocessing",
        "dst": "audio_encoder",
        "kind": "next",
        "cross_process": False,
        "process_safe": True,
    }
    assert body["gpus"] == [
        {"id": 0, "total_gpu_memory_fraction": 0.98, "limit": 1.0, "groups": ["tts_frontend", "pipeline", "vocoder"]}
    ]
    assert body["warnings"] == []


def test_json_reports_recommended_fraction_source_and_changed(capsys):
    _, out, _ = run(capsys, "plan", "--model-path", "ming-omni-tts", "--isolate-stage", "vocoder", "--format", "json")
    body = json.loads(out)
    assert body["changed"] is True
    assert [s["fraction_source"] for s in body["stages"]] == [None, "recommended", "recommended", "recommended"]
    assert body["gpus"][0]["total_gpu_memory_fraction"] == 0.92


def test_error_exits_2_with_one_error_line_on_stderr(capsys):
    code, out, err = run(capsys, "plan", "--model-path", "qwen3-tts", "--isolate-stage", "preprocessing")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: 'preprocessing' -> 'tts_engine' cannot cross")


def test_error_with_json_format_prints_the_error_object(capsys):
    code, out, err = run(capsys, "plan", "--model-path", "zonos2", "--isolate-stage", "vocoder", "--format", "json")
    body = json.loads(out)["error"]
    assert code == 2 and err.startswith("error: ")
    assert body["code"] == "MISSING_FRACTION"
    assert body["stages"] == ["preprocessing", "speaker_encode", "tts_engine", "vocoder"]
    assert body["gpu"] == 0


@pytest.mark.parametrize("command", ["plan", "check"])
def test_an_error_in_a_config_file_names_its_file_line_and_column_on_stderr_and_in_json(capsys, tmp_path, command):
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        "pipeline:\n  name: my-tts\n  stages:\n"
        "    - {name: engine, process: p, next: [vocoder], stream_to: [decoder]}\n"
        "    - {name: vocoder, process: p}\n"
    )
    code, out, err = run(capsys, command, "--config", str(config), "--format", "json")
    message = f"{config}:4:63: stage 'engine': stream_to 'decoder' is not a stage; stages are 'engine', 'vocoder'"
    assert code == 2 and err == f"error: {message}\n"
    assert json.loads(out) == {
        "error": {
            "code": "INVALID_CONFIG",
            "message": message,
            "stages": ["engine", "decoder"],
            "file": str(config),
            "line": 4,
            "column": 63,
        }
    }


def test_unsafe_edge_error_object_names_the_edge(capsys):
    _, out, _ = run(
        capsys, "plan", "--model-path", "voxtral-tts", "--isolate-stage", "preprocessing", "--format", "json"
    )
    assert json.loads(out)["error"]["edge"] == ["preprocessing", "tts_generation"]


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--model-path", "nope"], "UNKNOWN_MODEL"),
        (["--isolate-stage", "ghost"], "UNKNOWN_STAGE"),
        (["--stage-process", "vocoder"], "MALFORMED_ASSIGNMENT"),
        (["--isolate-stage", "vocoder", "--stage-process", "vocoder=x"], "DUPLICATE_ASSIGNMENT"),
        (["--config", "/nonexistent/c.yaml"], "INVALID_CONFIG"),
    ],
)
def test_bad_input_gets_its_error_code(capsys, argv, code):
    status, out, _ = run(capsys, "plan", *argv, "--format", "json")
    assert status == 2
    assert json.loads(out)["error"]["code"] == code


def test_malformed_yaml_is_an_error_not_a_traceback(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("stages: [\n")
    code, _, err = run(capsys, "plan", "--config", str(config))
    assert code == 2 and "malformed YAML" in err and "Traceback" not in err


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_plans(capsys, example):
    code, out, err = run(capsys, "plan", "--config", str(example))
    assert code == 0, err
    assert " : " in out.splitlines()[0]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_configs_factories_name_an_installed_module(example):
    """`plan` never imports factories, `serve` does: an example names stagevisor's installed modules
    (the repository root, on the tests' path, would hide a stale pre-namespace name like `stages.demo`)."""
    import importlib.util

    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    plan = plan_placement(PlacementRequest(None, str(example)))
    for stage in plan.stages:
        module = stage.factory.partition(":")[0]
        assert module.startswith("stagevisor.") and importlib.util.find_spec(module), (stage.name, stage.factory)


def test_examples_cover_every_builtin_model():
    import yaml

    named = set()
    for example in EXAMPLES:
        data = yaml.safe_load(example.read_text()) or {}
        if "pipeline" not in data:
            from stagevisor.models.registry import resolve_model

            named.add(resolve_model(data.get("model_path")).key)
    assert named == {d.key for d in builtin_models()}


def test_models_table_shows_every_model_and_its_facts(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for declaration in builtin_models():
        assert f"key:                   {declaration.key}" in out
    assert "preprocessing -> tts_engine (preprocessing publishes into a process-local PreparedRequestQueue" in out
    assert "none needed; the config already declares 0.03 / 0.85 / 0.10" in out
    assert "all; placement declares GPU 0 while the codec runs on cuda:1" in out
    assert "vocoder -> audio_decode" in out
    assert out.count("stand-in executors on the default voice") == 9


def test_models_table_generates_the_recommendation_column(capsys):
    _, out, _ = run(capsys, "models")
    blocks = {b.splitlines()[0]: b for b in out.split("\n\n")}
    assert "none yet; declare fractions before splitting" in blocks["Audar-TTS"]
    assert "none yet; declare fractions before splitting" in blocks["Zonos2"]
    assert (
        "tts_engine -> audio_decode: reference_encode 0.08, tts_engine 0.72, audio_decode 0.12"
        in blocks["Ming-Omni-TTS"]
    )
    assert "none needed on CPU" in blocks["demo"]


def test_models_json_lists_the_applicability_facts(capsys):
    _, out, _ = run(capsys, "models", "--format", "json")
    models = {m["key"]: m for m in json.loads(out)["models"]}
    assert list(models) == [d.key for d in builtin_models()]
    assert models["qwen3-tts"]["unsupported_edges"][0]["edge"] == ["preprocessing", "tts_engine"]
    assert "PREPARED_REQUESTS" in models["qwen3-tts"]["unsupported_edges"][0]["reason"]
    assert models["moss-tts-local-split"]["all_edges_unsupported"] is True
    assert models["ming-omni-tts"]["role_aliases"] == {"vocoder": "audio_decode"}


def test_plan_help_shows_the_spec_examples(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--stage-process preprocessing=tts_frontend" in out
    assert "--isolate-stage vocoder" in out


@pytest.mark.parametrize(
    "argv", [["plan", "--format", "xml"], ["plan", "--model-path", "demo", "--isolate-stage"], ["plan", "--bogus"]]
)
def test_a_usage_error_exits_2_with_one_error_line(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "run `stagevisor plan --help`" in err


def test_a_usage_error_with_json_format_prints_the_error_object(capsys):
    code, out, err = run(capsys, "plan", "--format", "json", "--stage-process")
    assert code == 2 and err.count("\n") == 1
    body = json.loads(out)["error"]
    assert body["code"] == "MALFORMED_ASSIGNMENT"
    assert "--stage-process" in body["message"] and "error: " + body["message"] == err.strip()


def test_an_invalid_choice_with_json_format_is_invalid_config(capsys):
    code, out, _ = run(capsys, "plan", "--model-path", "demo", "--format=json", "--bogus")
    assert code == 2
    assert json.loads(out)["error"]["code"] == "INVALID_CONFIG"


def test_a_missing_command_is_a_one_line_usage_error(capsys):
    code, _, err = run(capsys)
    assert code == 2 and err.count("\n") == 1 and "run `stagevisor --help`" in err


def test_help_still_exits_0_with_the_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: stagevisor plan")


MY_TTS = ROOT / "deploy" / "examples" / "my-tts" / "my-tts.yaml"


def test_plan_warns_when_a_factorys_module_cannot_be_found_without_importing_it(capsys, tmp_path, monkeypatch):
    """Exit 0 (the plan may be for another machine), a warning naming the stage, in table and JSON;
    a package beside the YAML is found and none of its code runs."""
    (tmp_path / "my_tts").mkdir()
    (tmp_path / "my_tts" / "__init__.py").write_text("raise RuntimeError('plan imported the package')\n")
    (tmp_path / "my_tts" / "stages.py").write_text("")
    text = MY_TTS.read_text().replace("my_tts.stages:make_vocoder", "my_ttz.stages:make_vocoder")
    (tmp_path / "tts.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "plan", "--config", str(tmp_path / "tts.yaml"))
    assert code == 0 and err == ""
    [warning] = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warning.startswith(
        "warning: MODULE_NOT_FOUND: stage 'vocoder': factory 'my_ttz.stages:make_vocoder' cannot be imported: "
        "no module 'my_ttz.stages'"
    )
    assert "did you mean 'my_tts.stages'?" in warning
    code, out, _ = run(capsys, "plan", "--config", str(tmp_path / "tts.yaml"), "--format", "json")
    assert code == 0 and [w[:36] for w in json.loads(out)["warnings"]] == ["MODULE_NOT_FOUND: stage 'vocoder': f"]
    assert "my_tts" not in sys.modules


def test_plan_of_the_worked_example_has_no_warning(capsys):
    code, out, _ = run(capsys, "plan", "--config", str(MY_TTS))
    assert code == 0 and "warning" not in out


def test_plan_looks_for_factories_in_the_app_dirs_its_warning_suggests(capsys, tmp_path, monkeypatch):
    """The warning says `pass --app-dir DIR`; plan takes it, and a package found there is no warning."""
    apps = tmp_path / "apps"
    (apps / "my_tts").mkdir(parents=True)
    (apps / "my_tts" / "__init__.py").write_text("raise RuntimeError('plan imported the package')\n")
    (apps / "my_tts" / "stages.py").write_text("")
    (tmp_path / "tts.yaml").write_text(MY_TTS.read_text())
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "plan", "--config", str(tmp_path / "tts.yaml"))
    assert code == 0 and "or pass --app-dir DIR" in out
    code, out, err = run(capsys, "plan", "--config", str(tmp_path / "tts.yaml"), "--app-dir", str(apps))
    assert code == 0 and err == "" and "warning" not in out
    assert "my_tts" not in sys.modules
