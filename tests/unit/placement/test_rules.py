"""The topology rules as an operator reads them: placement errors and warnings, replica layout, cycles."""

from __future__ import annotations

import dataclasses

import pytest

from stagevisor.supervisor.config import PipelineConfig, PlacementConfig
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.placement.options import parse_replica_options
from stagevisor.supervisor.placement.planner import plan_pipeline
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.placement.groups import layout_groups
from stagevisor.supervisor.placement.runtime_fractions import runtime_fraction_mismatches
from tests.unit.placement.configs import PIPELINE_WITH_TP as TP_PIPELINE


def error_of(call) -> StagevisorError:
    with pytest.raises(StagevisorError) as caught:
        call()
    return caught.value


def gpu_stage(name: str, process: str, fraction: float, gpu=0, **extra) -> dict:
    return {
        "name": name,
        "factory": "m:f",
        "process": process,
        "gpu": gpu,
        "runtime": {"resources": {"total_gpu_memory_fraction": fraction}},
        **extra,
    }


def test_the_over_limit_message_lists_each_stage_and_marks_only_replicated_ones():
    # higgs: 0.03 + 0.85 + 0.10 = 0.98 on GPU 0; a second vocoder replica there makes 1.08.
    error = error_of(lambda: plan_placement(PlacementRequest("higgs-tts", None, process_replicas=["vocoder=2"])))
    assert error.code is ErrorCode.OVER_LIMIT
    assert "(audio_encoder 0.03, tts_engine 0.85, vocoder 0.1 x 2 replicas)" in error.message


def test_a_tensor_parallel_stage_s_mismatch_names_its_first_gpu():
    pipeline = PipelineConfig.model_validate(
        {
            "name": "custom",
            "stages": [gpu_stage("engine", "engine", 0.8, gpu=[0, 1], tp_size=2, args={"mem_fraction_static": 0.5})],
        }
    )
    error = error_of(lambda: plan_pipeline(pipeline, placement=PlacementConfig(strict_runtime_fractions=True)))
    assert (error.code, error.gpu) == (ErrorCode.RUNTIME_FRACTION_MISMATCH, 0)
    assert "placement fraction on GPU 0 is 0.8" in error.message


def strict_error(engine_args: dict) -> StagevisorError:
    pipeline = PipelineConfig.model_validate(
        {
            "name": "custom",
            "stages": [
                gpu_stage("engine", "engine", 0.1, next=["vocoder"], args=engine_args),
                gpu_stage("vocoder", "vocoder", 0.2),
            ],
            "process_safe_edges": [["engine", "vocoder"]],
        }
    )
    return error_of(lambda: plan_pipeline(pipeline, placement=PlacementConfig(strict_runtime_fractions=True)))


def test_a_strict_error_lists_the_other_mismatches_only_when_there_are_some():
    alone = strict_error({"mem_fraction_static": 0.5})
    assert "also" not in alone.message
    both = strict_error({"mem_fraction_static": 0.5, "gpu_memory_utilization": 0.3})
    assert both.message.startswith("stage 'engine' passes args.mem_fraction_static 0.5 ")
    assert " (also: stage 'engine' passes args.gpu_memory_utilization 0.3 " in both.message


PIPELINE_WITH_TP = (
    TP_PIPELINE
    + """\
processes:
  engine: {node: tts-a}
  vocoder: {replicas: 2, gpus: [0, 1]}
"""
)


def test_a_node_only_entry_for_a_tp_stage_does_not_stop_the_entries_after_it(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(PIPELINE_WITH_TP)
    vocoder = plan_placement(PlacementRequest(None, str(config))).group("vocoder")
    assert (vocoder.replicas, vocoder.replica_gpus) == (2, (0, 1))


def test_replicas_one_with_gpus_runs_one_worker_on_the_declared_gpu(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: higgs-tts\nprocesses:\n  vocoder: {replicas: 1, gpus: [0, 1]}\n")
    vocoder = plan_placement(PlacementRequest(None, str(config))).group("vocoder")
    assert (vocoder.replicas, vocoder.replica_gpus, vocoder.gpu) == (1, (), 0)


def test_replica_requests_are_immutable_values():
    (request,) = parse_replica_options(["vocoder=2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.replicas = 3
    assert len({request, parse_replica_options(["vocoder=2"])[0]}) == 1


def test_a_stage_hanging_off_a_cycle_and_listed_first_still_gets_the_cycle_reported():
    # t's walk up the chain (c, b, c, ...) never returns to t: the length guard ends it, and b reports the cycle.
    stages = [
        {"name": "t", "factory": "m:f"},
        {"name": "b", "factory": "m:f", "next": ["c"]},
        {"name": "c", "factory": "m:f", "next": ["b", "t"]},
    ]
    error = error_of(lambda: plan_pipeline(PipelineConfig.model_validate({"name": "rho", "stages": stages})))
    assert error.code is ErrorCode.INVALID_CONFIG and error.stages == ("b", "c")
    assert "stages 'b', 'c' form a cycle" in error.message


def test_a_memory_argument_that_is_not_a_number_is_not_compared():
    pipeline = PipelineConfig.model_validate(
        {
            "name": "custom",
            "stages": [
                gpu_stage("engine", "engine", 0.1, next=["vocoder"], args={"mem_fraction_static": "auto"}),
                gpu_stage("vocoder", "vocoder", 0.2),
            ],
            "process_safe_edges": [["engine", "vocoder"]],
        }
    )
    assert plan_pipeline(pipeline).warnings == ()


def test_replicas_go_round_robin_forward_through_the_listed_gpus(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: higgs-tts\nprocesses:\n  vocoder: {replicas: 3, gpus: [0, 1, 2]}\n")
    assert plan_placement(PlacementRequest(None, str(config))).group("vocoder").replica_gpus == (0, 1, 2)


def test_runtime_fraction_mismatches_are_immutable_values():
    pipeline = PipelineConfig.model_validate(
        {
            "name": "custom",
            "stages": [
                gpu_stage("engine", "engine", 0.1, next=["vocoder"], args={"mem_fraction_static": 0.5}),
                gpu_stage("vocoder", "vocoder", 0.2),
            ],
            "process_safe_edges": [["engine", "vocoder"]],
        }
    )
    (mismatch,) = runtime_fraction_mismatches(pipeline, layout_groups(pipeline))
    with pytest.raises(dataclasses.FrozenInstanceError):
        mismatch.value = 0.1
    assert len({mismatch, *runtime_fraction_mismatches(pipeline, layout_groups(pipeline))}) == 1


def test_a_tp_process_whose_name_contains_tp_is_still_known_as_tensor_parallel(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        PIPELINE_WITH_TP.replace("      tp_size: 2\n", "      tp_size: 2\n      process: big_tp_engine\n").replace(
            "  engine: {node: tts-a}\n", "  big_tp_engine: {replicas: 2}\n"
        )
    )
    error = error_of(lambda: plan_placement(PlacementRequest(None, str(config))))
    assert error.code is ErrorCode.TP_STAGE and error.stages == ("engine",)
