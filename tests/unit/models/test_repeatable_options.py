"""What `check` and `bench --check-identical` add to their requests so a model's audio repeats byte for byte: each
model declares it (ModelDeclaration.repeatable_options); the commands name no model."""

from __future__ import annotations

import dataclasses

import pytest

from stagevisor.models.registry import builtin_models
from stagevisor.models.requirements import repeatable_options
from stagevisor.supervisor.cli import build_parser
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.qwen3_tiny import write_checkpoint


def test_a_qwen3_checkpoint_is_pinned_to_a_seed(tmp_path):
    """`check --edge tts_engine,vocoder` on a CustomVoice checkpoint reported EDGE_MISMATCH on data["seed"]: its
    preprocessing draws a random seed for a request without one, so two runs never matched."""
    plan = plan_placement(PlacementRequest(str(write_checkpoint(tmp_path))))
    assert plan.model == "qwen3-tts"
    assert repeatable_options(plan) == {"seed": "0"}
    assert repeatable_options(plan_placement(PlacementRequest("qwen3-tts"))) == {"seed": "0"}


@pytest.mark.parametrize(
    ("model", "options"),
    [(None, {}), ("demo", {}), ("piper", {"noise_scale": "0", "noise_w": "0"}), ("zonos2", {})],
)
def test_each_model_gets_what_it_declares(model, options):
    assert repeatable_options(plan_placement(PlacementRequest(model))) == options


def test_a_pipeline_declared_in_full_gets_what_the_models_whose_executors_it_runs_declare():
    piper = plan_placement(PlacementRequest("piper"))
    own = dataclasses.replace(piper, model=None, model_path=None)
    assert repeatable_options(own) == {"noise_scale": "0", "noise_w": "0"}
    stages = tuple(dataclasses.replace(stage, factory="my_pkg.stages:make") for stage in own.stages)
    assert repeatable_options(dataclasses.replace(own, stages=stages)) == {}


@pytest.mark.parametrize(("command", "option"), [("check", "--option"), ("bench", "--check-identical")])
def test_the_help_names_what_each_model_pins(command, option):
    text = " ".join(build_parser().commands[command].format_help().split())
    help_of = text[text.index(option) :]
    for model in builtin_models():
        for key, value in model.repeatable_options.items():
            assert f"{key}={value}" in help_of and model.key in help_of, (model.key, key)
