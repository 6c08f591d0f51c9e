"""The planning entry point: a PlacementRequest in, a Plan out (node pins included), options round-trip."""

from __future__ import annotations

import argparse

import pytest

from stagevisor.supervisor.commands.placement_options import add_placement_options, request_from_args
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.placement.request import PlacementRequest, hub_ids, plan_placement

PINNED = """\
pipeline:
  name: pinned
  stages:
    - {name: front, factory: "m:f", process: front, next: [back]}
    - {name: back, factory: "m:f", process: back}
  process_safe_edges: [[front, back]]
processes:
  back: {node: tts-b, replicas: 2}
"""


def test_a_config_s_node_pins_reach_the_plan_with_its_replicas(tmp_path):
    config = tmp_path / "pinned.yaml"
    config.write_text(PINNED)
    plan = plan_placement(PlacementRequest(config_path=str(config)))
    assert plan.group("back").node == "tts-b" and plan.group("back").replicas == 2
    assert plan.group("front").node is None


def test_settings_for_a_process_the_plan_lacks_are_refused_by_name(tmp_path):
    config = tmp_path / "pinned.yaml"
    config.write_text(PINNED.replace("back: {node", "nowhere: {node"))
    with pytest.raises(StagevisorError) as caught:
        plan_placement(PlacementRequest(config_path=str(config)))
    assert caught.value.code is ErrorCode.MISSING_PROCESS and "'nowhere'" in caught.value.message


def test_options_parsed_by_the_cli_round_trip_through_the_request():
    parser = argparse.ArgumentParser()
    add_placement_options(parser)
    argv = ["--model-path", "fishaudio/s2-pro", "--isolate-stage", "vocoder", "--process-replicas", "vocoder=1"]
    request = request_from_args(parser.parse_args(argv))
    assert request == PlacementRequest("fishaudio/s2-pro", None, ("vocoder",), (), ("vocoder=1",))
    assert request.argv() == argv
    assert request_from_args(parser.parse_args(request.argv())) == request


def test_a_request_is_hashable_and_takes_lists_as_tuples():
    request = PlacementRequest("demo", isolate_stages=["vocoder"])
    assert request.isolate_stages == ("vocoder",) and hash(request) == hash(
        PlacementRequest("demo", None, ("vocoder",))
    )
    assert not request.is_declared() and PlacementRequest("demo").is_declared()


def test_a_single_string_is_refused_rather_than_split_into_letters():
    with pytest.raises(TypeError, match="isolate_stages"):
        PlacementRequest("demo", isolate_stages="vocoder")  # type: ignore[arg-type]


def test_the_entry_point_plans_what_the_options_ask():
    plan = plan_placement(PlacementRequest("fishaudio/s2-pro", isolate_stages=("vocoder",)))
    assert [g.name for g in plan.groups] == ["preprocessing", "pipeline", "vocoder"] and plan.changed


def test_the_hub_ids_the_http_api_may_list_are_the_models_own_and_none_for_a_pipeline_in_full(tmp_path):
    """GET /v1/models lists --model-path only where it is one of these: a hub id of the served model."""
    assert "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice" in hub_ids("qwen3-tts", None)
    config = tmp_path / "pinned.yaml"
    config.write_text(PINNED)
    assert hub_ids(None, str(config)) == ()
