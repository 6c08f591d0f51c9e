"""`plan --explain`: the source of every effective setting (model, YAML line, CLI option, edge, default)."""

import json
from pathlib import Path

import pytest

from stagevisor.models.registry import builtin_models
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.placement.explain import explain, render_explain
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))


def settings_of(model_path=None, config=None, isolate=(), stage_process=(), replicas=()):
    plan = plan_placement(PlacementRequest(model_path, config, isolate, stage_process, replicas))
    found = explain(model_path, config, plan, isolate, stage_process, replicas)
    return plan, {(s.subject, s.key): s for s in found}


def source(settings, subject, key):
    s = settings[(subject, key)]
    return s.source.kind, s.source.where


def test_an_isolated_stage_takes_its_process_from_the_option_and_its_fraction_from_the_split_edge():
    _, settings = settings_of("fishaudio/s2-pro", isolate=["vocoder"])
    assert source(settings, "stage vocoder", "process") == ("cli", "--isolate-stage 'vocoder'")
    assert settings[("stage vocoder", "process")].value == "vocoder"
    kind, where = source(settings, "stage vocoder", "total_gpu_memory_fraction")
    assert kind == "recommended" and "'tts_engine' -> 'vocoder'" in where
    assert settings[("stage tts_engine", "total_gpu_memory_fraction")].value == 0.85
    assert source(settings, "stage tts_engine", "process") == ("model", "built-in fishaudio-s2-pro")
    assert source(settings, "stage tts_engine", "tp_size") == ("default", "schema default")
    assert source(settings, "model", "name") == ("cli", "--model-path fishaudio/s2-pro")


def test_a_role_alias_is_explained_under_the_stage_it_resolves_to():
    _, settings = settings_of("ming-omni-tts", isolate=["vocoder"])
    assert source(settings, "stage audio_decode", "process") == ("cli", "--isolate-stage 'vocoder'")


def test_a_no_op_option_leaves_the_declared_source():
    """higgs-tts already runs the vocoder alone: --isolate-stage vocoder changes nothing, so the model decided."""
    plan, settings = settings_of("higgs-tts", isolate=["vocoder"])
    assert not plan.changed
    assert source(settings, "stage vocoder", "process") == ("model", "built-in higgs-tts")


def test_yaml_overrides_name_their_file_and_line(tmp_path):
    config = tmp_path / "over.yaml"
    config.write_text(
        "model_path: fishaudio/s2-pro\n"  # 1
        "placement:\n"  # 2
        "  max_total_gpu_memory_fraction_per_gpu: 0.99\n"  # 3
        "stages:\n"  # 4
        "  - name: tts_engine\n"  # 5
        "    args: {temperature: 0.5}\n"  # 6
        "    runtime:\n"  # 7
        "      resources:\n"  # 8
        "        total_gpu_memory_fraction: 0.7\n"  # 9
        "  - name: vocoder\n"  # 10
        "    process: vocoder\n"  # 11
        "    runtime: {resources: {total_gpu_memory_fraction: 0.1}}\n"  # 12
        "processes:\n"  # 13
        "  vocoder:\n"  # 14
        "    replicas: 2\n"  # 15
    )
    _, settings = settings_of(config=str(config))
    at = f"{config} line"
    assert source(settings, "model", "name") == ("yaml", f"{at} 1")
    assert source(settings, "placement", "max_total_gpu_memory_fraction_per_gpu") == ("yaml", f"{at} 3")
    assert source(settings, "placement", "strict_runtime_fractions") == ("default", "schema default")
    assert source(settings, "stage tts_engine", "args.temperature") == ("yaml", f"{at} 6")
    assert settings[("stage tts_engine", "args.temperature")].value == 0.5
    assert source(settings, "stage tts_engine", "args.model") == ("model", "built-in fishaudio-s2-pro")
    assert source(settings, "stage tts_engine", "total_gpu_memory_fraction") == ("yaml", f"{at} 9")
    assert source(settings, "stage vocoder", "process") == ("yaml", f"{at} 11")
    assert source(settings, "stage vocoder", "total_gpu_memory_fraction") == ("yaml", f"{at} 12")
    assert source(settings, "group vocoder", "replicas") == ("yaml", f"{at} 15")
    assert settings[("group vocoder", "replicas")].value == 2
    assert source(settings, "group pipeline", "replicas") == ("default", "schema default")


def test_a_replicas_option_overrides_the_yaml_and_says_so(tmp_path):
    config = tmp_path / "r.yaml"
    config.write_text("model_path: demo\nprocesses:\n  pipeline:\n    replicas: 2\n")
    _, settings = settings_of(config=str(config), replicas=["pipeline=3"])
    assert source(settings, "group pipeline", "replicas") == ("cli", "--process-replicas 'pipeline=3'")
    assert settings[("group pipeline", "replicas")].value == 3


def test_a_pipeline_declared_in_full_is_explained_from_its_own_lines():
    config = str(ROOT / "deploy" / "examples" / "custom-pipeline.yaml")
    lines = Path(config).read_text().splitlines()
    _, settings = settings_of(config=config)
    kind, where = source(settings, "stage engine", "stream_to")
    assert kind == "yaml"
    line = int(where.rsplit(" ", 1)[1])
    assert lines[line - 1].strip().startswith("stream_to:")
    assert source(settings, "stage engine", "gpu") == ("default", "schema default")
    assert source(settings, "model", "name")[0] == "yaml"


@pytest.mark.parametrize("key", [m.key for m in builtin_models()])
def test_every_setting_of_every_built_in_model_has_a_source(key):
    plan, settings = settings_of(key)
    assert all(s.source.where for s in settings.values())
    for stage in plan.stages:
        assert ("stage " + stage.name, "process") in settings
        assert ("stage " + stage.name, "total_gpu_memory_fraction") in settings
    for group in plan.groups:
        assert ("group " + group.name, "replicas") in settings


@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: p.name)
def test_every_setting_of_every_example_config_has_a_source(config):
    plan, settings = settings_of(config=str(config))
    assert all(s.source.where for s in settings.values())
    assert {(f"stage {s.name}", "process") for s in plan.stages} <= set(settings)
    # Whatever the file writes for a stage is traced to the file, never to the model.
    yaml_rows = [s for s in settings.values() if s.source.kind == "yaml"]
    assert all(str(config) in s.source.where for s in yaml_rows)


def test_the_table_has_a_row_per_setting_with_its_source():
    plan = plan_placement(PlacementRequest("fishaudio/s2-pro", None, ["vocoder"], []))
    settings = explain("fishaudio/s2-pro", None, plan, ["vocoder"])
    lines = render_explain(settings).splitlines()
    assert lines[0].split() == ["SUBJECT", "SETTING", "VALUE", "SOURCE"]
    assert len(lines) == len(settings) + 1
    row = next(line for line in lines if line.startswith("stage vocoder") and " process " in line)
    assert row.split()[-3:] == ["cli:", "--isolate-stage", "'vocoder'"]


def test_the_cli_prints_the_explanation_in_table_and_json(capsys):
    assert main(["plan", "--model-path", "fishaudio/s2-pro", "--isolate-stage", "vocoder", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "SUBJECT" in out and "cli: --isolate-stage 'vocoder'" in out
    assert main(["plan", "--model-path", "fishaudio/s2-pro", "--explain", "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert {
        "subject": "stage vocoder",
        "key": "process",
        "value": "pipeline",
        "source": "model",
        "where": "built-in fishaudio-s2-pro",
    } in body["explain"]


def test_without_explain_the_json_plan_is_unchanged(capsys):
    assert main(["plan", "--model-path", "fishaudio/s2-pro", "--format", "json"]) == 0
    assert "explain" not in json.loads(capsys.readouterr().out)
