"""The talker's step loop: one codec frame per step, the code predictor coupled in, frames handed out as they are made.

qwen-tts's `generate()` runs the talker through transformers' sampling loop
and returns the codes at the end. This loop makes the same calls one step at
a time: the talker's prefill, then per step the logits processors that
transformers builds for the package's arguments (repetition penalty, EOS
barred for the first `MIN_NEW_TOKENS`, the suppressed control ids,
temperature, top-k, top-p, in that order), one multinomial draw, and the
talker's decode step, inside which the package's code predictor draws
codebooks 1-15 of the previous frame. Draws come from torch's global
generator in the package's order, so a seeded request yields the package's
codes; that generator and the talker's rope offset are per process, which is
why requests take turns on the talker (stages/qwen3/turns.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from stagevisor.stages.qwen3.prompt import Prompt
from stagevisor.stages.qwen3.request import Sampling

MIN_NEW_TOKENS = 2
"""The package asks transformers for at least two steps before EOS may be drawn."""
CONTROL_IDS = 1024
"""The talker's last 1,024 ids are control tokens; all but EOS are suppressed while sampling."""


@dataclass
class Talker:
    """A loaded talker (with its code predictor)."""

    model: Any
    """Qwen3TTSForConditionalGeneration."""

    @property
    def eos(self) -> int:
        return int(self.model.config.talker_config.codec_eos_token_id)


def _processors(talker: Talker, sampling: Sampling, device: torch.device) -> LogitsProcessorList:
    vocab = talker.model.config.talker_config.vocab_size
    eos = torch.tensor([talker.eos], device=device)
    suppressed = [i for i in range(vocab - CONTROL_IDS, vocab) if i != talker.eos]
    processors = LogitsProcessorList()
    if sampling.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(penalty=sampling.repetition_penalty))
    processors.append(MinNewTokensLengthLogitsProcessor(0, MIN_NEW_TOKENS, eos, device=device))
    processors.append(SuppressTokensLogitsProcessor(suppressed, device=device))
    if sampling.do_sample:
        if sampling.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k != 0:
            processors.append(TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
        if sampling.top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    return processors


@dataclass
class Outcome:
    frames: int = 0
    stopped: str = ""
    """"eos", "max_new_tokens" or "cancelled"."""


@torch.inference_mode()
def frames(
    talker: Talker, prompt: Prompt, sampling: Sampling, cancelled: Callable[[], bool], outcome: Outcome
) -> Iterator[torch.Tensor]:
    """Yield each codec frame, a (16,) long tensor, as soon as its last codebook is drawn.

    The caller has seeded torch's generator; between two steps it may step other
    requests if it puts back this one's generator state and the talker's
    `rope_deltas` first (stages/qwen3/turns.py). Frame t's first code is drawn
    after step t, its other 15 inside step t+1, so a frame is yielded one
    talker step after its first code.
    """
    model = talker.model.talker
    device = prompt.embeds.device
    length = prompt.embeds.shape[1]
    processors = _processors(talker, sampling, device)
    generated = torch.empty((1, 0), dtype=torch.long, device=device)
    mask = torch.ones((1, length), dtype=torch.long, device=device)
    sub = {
        "subtalker_dosample": sampling.subtalker_dosample,
        "subtalker_top_k": sampling.subtalker_top_k,
        "subtalker_top_p": sampling.subtalker_top_p,
        "subtalker_temperature": sampling.subtalker_temperature,
    }
    out = model(
        inputs_embeds=prompt.embeds,
        attention_mask=mask,
        past_key_values=DynamicCache(),
        use_cache=True,
        cache_position=torch.arange(length, device=device),
        trailing_text_hidden=prompt.trailing,
        tts_pad_embed=prompt.pad,
        return_dict=True,
        **sub,
    )
    while True:
        logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        scores = processors(generated, logits)
        if sampling.do_sample:
            token = torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1)
        else:
            token = torch.argmax(scores, dim=-1, keepdim=True)
        generated = torch.cat([generated, token], dim=-1)
        if int(token) == talker.eos:
            outcome.stopped = "eos"
            return
        if generated.shape[1] >= sampling.max_new_tokens:
            outcome.stopped = "max_new_tokens"
            return
        if cancelled():
            outcome.stopped = "cancelled"
            return
        mask = torch.cat([mask, mask.new_ones((1, 1))], dim=-1)
        out = model(
            input_ids=token,
            attention_mask=mask,
            past_key_values=out.past_key_values,
            use_cache=True,
            cache_position=torch.tensor([length + generated.shape[1] - 1], device=device),
            past_hidden=out.past_hidden,
            generation_step=out.generation_step,
            trailing_text_hidden=out.trailing_text_hidden,
            tts_pad_embed=out.tts_pad_embed,
            return_dict=True,
            **sub,
        )
        outcome.frames += 1
        yield out.hidden_states[1][0]
