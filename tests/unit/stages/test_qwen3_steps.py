"""When the talker's decode steps may take the direct code-predictor loop (stages/qwen3/steps.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.qwen3  # transformers


def predictor(vocab: int = 2048, **generation: object) -> SimpleNamespace:
    from transformers import GenerationConfig

    return SimpleNamespace(generation_config=GenerationConfig(**generation), config=SimpleNamespace(vocab_size=vocab))


def test_a_generation_config_that_changes_no_draw_takes_the_direct_loop():
    from stagevisor.stages.qwen3.steps import own_loop_refusal

    assert own_loop_refusal(predictor()) is None
    assert own_loop_refusal(predictor(eos_token_id=151645, pad_token_id=0, bos_token_id=1)) is None
    assert own_loop_refusal(predictor(eos_token_id=[151645, 151643])) is None


@pytest.mark.parametrize(
    ("generation", "reason"),
    [
        ({"eos_token_id": 7}, r"an EOS id inside the codebook \(7\)"),
        ({"eos_token_id": [151645, 2047]}, r"an EOS id inside the codebook"),
        ({"repetition_penalty": 1.1}, "sets repetition_penalty"),
        ({"suppress_tokens": [1, 2], "min_p": 0.1}, "sets min_p, suppress_tokens"),
    ],
)
def test_a_generation_config_asking_for_more_goes_through_the_packages_decode_step(generation, reason):
    from stagevisor.stages.qwen3.steps import own_loop_refusal

    refusal = own_loop_refusal(predictor(**generation))
    assert refusal is not None and re.search(reason, refusal), refusal
