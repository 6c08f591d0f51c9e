"""Engine memory arguments in a stage's `args` are checked against its placement fraction (plan and serve)."""

from __future__ import annotations

import json
import textwrap

import pytest

from stagevisor.models.declaration import ModelDeclaration
from stagevisor.models.registry import resolve_model
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.config import PipelineConfig, PlacementConfig, parse_config_text
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.placement.planner import plan_pipeline
from stagevisor.supervisor.placement.runtime_fractions import ENGINE_MEMORY_ARGS

KNOWN = (*ENGINE_MEMORY_ARGS,)


def two_groups(engine_args: dict, engine_fraction: float | None = 0.1, strict: bool = False):
    """engine (GPU 0, its own process) -> vocoder (GPU 0, another process): both need fractions."""
    pipeline = PipelineConfig.model_validate(
        {
            "name": "custom",
            "stages": [
                {
                    "name": "engine",
                    "factory": "m:f",
                    "process": "engine",
                    "gpu": 0,
                    "next": ["vocoder"],
                    "args": engine_args,
                    "runtime": {"resources": {"total_gpu_memory_fraction": engine_fraction}},
                },
                {
                    "name": "vocoder",
                    "factory": "m:f",
                    "process": "vocoder",
                    "gpu": 0,
                    "runtime": {"resources": {"total_gpu_memory_fraction": 0.2}},
                },
            ],
            "process_safe_edges": [["engine", "vocoder"]],
        }
    )
    return pipeline, PlacementConfig(strict_runtime_fractions=strict)


def runtime_warnings(plan) -> list[str]:
    return [w for w in plan.warnings if "placement fraction" in w]


@pytest.mark.parametrize("argument", KNOWN)
def test_a_known_argument_that_disagrees_is_a_warning_naming_stage_argument_values_and_winner(argument):
    pipeline, placement = two_groups({argument: 0.85})
    (warning,) = runtime_warnings(plan_pipeline(pipeline, placement=placement))
    assert f"stage 'engine' passes args.{argument} 0.85" in warning
    assert "placement fraction on GPU 0 is 0.1" in warning
    assert "the runtime uses the argument 0.85" in warning
    assert "out-of-memory" in warning  # above the placement: the allocator cap bites


@pytest.mark.parametrize("argument", KNOWN)
def test_a_known_argument_that_disagrees_is_a_coded_error_in_strict_mode(argument):
    pipeline, placement = two_groups({argument: 0.05}, strict=True)
    with pytest.raises(StagevisorError) as caught:
        plan_pipeline(pipeline, placement=placement)
    error = caught.value
    assert error.code is ErrorCode.RUNTIME_FRACTION_MISMATCH
    assert error.stages == ("engine",) and error.gpu == 0
    assert f"args.{argument} 0.05" in error.message and "strict_runtime_fractions" in error.message


@pytest.mark.parametrize("argument", KNOWN)
@pytest.mark.parametrize("strict", [False, True])
def test_consistent_arguments_get_nothing(argument, strict):
    pipeline, placement = two_groups({argument: 0.1, "unrelated": 0.9}, strict=strict)
    assert plan_pipeline(pipeline, placement=placement).warnings == ()


def test_nested_engine_settings_are_found_by_their_dotted_path():
    pipeline, placement = two_groups({"server_args": {"mem_fraction_static": "0.7"}})
    (warning,) = runtime_warnings(plan_pipeline(pipeline, placement=placement))
    assert "args.server_args.mem_fraction_static 0.7" in warning


def test_a_lower_argument_says_the_difference_stays_unused():
    pipeline, placement = two_groups({"gpu_memory_utilization": 0.05})
    (warning,) = runtime_warnings(plan_pipeline(pipeline, placement=placement))
    assert "0.05 of GPU 0 stays reserved but unused" in warning


def test_total_gpu_memory_fraction_in_args_loses_to_the_placement_value():
    pipeline, placement = two_groups({"total_gpu_memory_fraction": 0.5})
    (warning,) = runtime_warnings(plan_pipeline(pipeline, placement=placement))
    assert "the runtime uses the placement value 0.1" in warning


def test_a_stage_alone_on_its_gpu_without_a_fraction_is_not_compared():
    pipeline = PipelineConfig.model_validate(
        {
            "name": "solo",
            "stages": [
                {"name": "engine", "factory": "m:f", "process": "p", "gpu": 0, "args": {"mem_fraction_static": 0.85}}
            ],
        }
    )
    assert plan_pipeline(pipeline).warnings == ()


@pytest.mark.parametrize("value", [float("nan"), "nan", float("inf"), "-inf"])
@pytest.mark.parametrize("argument", KNOWN)
def test_a_non_finite_argument_is_a_mismatch_not_taken_for_a_match(argument, value):
    """NaN made `abs(value - fraction) > tolerance` false, so `mem_fraction_static: .nan` passed as consistent."""
    pipeline, placement = two_groups({argument: value})
    (warning,) = runtime_warnings(plan_pipeline(pipeline, placement=placement))
    shown = str(float(value))
    assert warning.endswith(
        f"{shown} is no share of GPU memory, so whatever the runtime makes of it, it is not what placement "
        f"accounts. Set args.{argument} to 0.1"
    )
    pipeline, placement = two_groups({argument: value}, strict=True)
    with pytest.raises(StagevisorError) as caught:
        plan_pipeline(pipeline, placement=placement)
    assert caught.value.code is ErrorCode.RUNTIME_FRACTION_MISMATCH


def test_a_non_finite_total_gpu_memory_fraction_in_args_still_loses_to_the_placement_value():
    pipeline, placement = two_groups({"total_gpu_memory_fraction": float("nan")})
    (warning,) = runtime_warnings(plan_pipeline(pipeline, placement=placement))
    assert "the runtime uses the placement value 0.1" in warning


def test_non_numeric_values_are_not_compared():
    pipeline, placement = two_groups({"mem_fraction_static": None, "gpu_memory_utilization": True})
    assert plan_pipeline(pipeline, placement=placement).warnings == ()


def test_a_model_declaration_may_name_more_arguments_for_its_stages():
    pipeline, placement = two_groups({"kv_cache_share": 0.6})
    assert plan_pipeline(pipeline, placement=placement).warnings == ()
    plan = plan_pipeline(pipeline, placement=placement, runtime_fraction_args={"engine": ("kv_cache_share",)})
    (warning,) = runtime_warnings(plan)
    assert "args.kv_cache_share 0.6" in warning
    assert ModelDeclaration("k", "K", pipeline).runtime_fraction_args == {}


def test_recommended_fractions_are_what_the_arguments_are_compared_with(capsys, tmp_path):
    """fishaudio recommends tts_engine 0.85 when the vocoder is isolated: 0.85 agrees, 0.9 does not."""
    for value, expected in ((0.85, 0), (0.9, 1)):
        config = tmp_path / "c.yaml"
        config.write_text(
            f"model_path: fishaudio/s2-pro\nstages:\n  - {{name: tts_engine, args: {{mem_fraction_static: {value}}}}}\n"
        )
        assert main(["plan", "--config", str(config), "--isolate-stage", "vocoder", "--format", "json"]) == 0
        warnings = json.loads(capsys.readouterr().out)["warnings"]
        assert len(warnings) == expected
        assert all(f"args.mem_fraction_static {value} " in w and "is 0.85" in w for w in warnings)


def test_plan_table_and_strict_yaml_error_from_the_cli(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        textwrap.dedent("""\
        model_path: higgs-tts
        stages:
          - {name: vocoder, args: {gpu_memory_fraction: 0.3}}
        """)
    )
    assert main(["plan", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("warning: stage 'vocoder' passes args.gpu_memory_fraction 0.3")
    config.write_text(config.read_text() + "placement: {strict_runtime_fractions: true}\n")
    assert main(["plan", "--config", str(config), "--format", "json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "RUNTIME_FRACTION_MISMATCH" and error["stages"] == ["vocoder"]


def test_strict_runtime_fractions_must_be_a_boolean():
    with pytest.raises(StagevisorError) as caught:
        parse_config_text("placement: {strict_runtime_fractions: 'yes'}\n")
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert "strict_runtime_fractions" in caught.value.message


def test_builtin_models_plan_without_runtime_fraction_warnings():
    for key in ("higgs-tts", "fishaudio-s2-pro", "moss-tts-local"):
        declaration = resolve_model(key)
        assert not [w for w in plan_pipeline(declaration.pipeline).warnings if "placement fraction" in w]
