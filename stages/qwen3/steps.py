"""The talker's step loop: one codec frame per step, the code predictor coupled in, frames handed out as they are made.

qwen-tts's `generate()` runs the talker through transformers' sampling loop
and returns the codes at the end. This loop makes the same calls one step at
a time: the talker's prefill, then per step the logits processors that
transformers builds for the package's arguments (repetition penalty, EOS
barred for the first `MIN_NEW_TOKENS`, the suppressed control ids,
temperature, top-k, top-p, in that order), one multinomial draw, and the
talker's decode step, which first has the code predictor draw codebooks 1-15
of the previous frame.

The package's decode step runs the code predictor through transformers'
`generate()` once per frame: 15 tokens behind a fixed cost of building and
checking a generation config, logits processors and stopping criteria, which
dominates a small model's step. `decode_step` makes the same module calls and
draws directly: the code predictor's prefill and 14 decode calls with the
arguments `generate()` passes them, its warpers, then the talker's inner model
and codec head with the position ids the package's forward computes. The
floats and draws are the same, so the codes are. A checkpoint whose code
predictor's generation config asks for more than that loop reproduces (see
`own_loop_refusal`) is served through the package's own decode step instead. Draws come from torch's global
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


OWN_LOOP_KEYS = frozenset({"_from_model_config", "transformers_version", "use_cache", "bos_token_id", "pad_token_id"})
"""Code-predictor generation-config keys that change no draw of `generate()` with the package's arguments."""


def own_loop_refusal(predictor: Any) -> str | None:
    """Why `decode_step` cannot reproduce `predictor.generate()` for this checkpoint, or None when it can.

    The package passes do_sample, top_k, top_p and temperature; anything else in the code predictor's own
    generation config would add a logits processor or a stopping rule that loop does not make. An EOS id
    outside the codebook is never drawn, so it stops nothing.
    """
    config = predictor.generation_config.to_diff_dict()
    eos = config.pop("eos_token_id", None)
    ids = eos if isinstance(eos, list) else [eos]
    if any(i is not None and 0 <= int(i) < predictor.config.vocab_size for i in ids):
        return f"its code predictor's generation config has an EOS id inside the codebook ({eos})"
    extra = sorted(set(config) - OWN_LOOP_KEYS)
    if extra:
        return f"its code predictor's generation config sets {', '.join(extra)}"
    return None


@dataclass
class Talker:
    """A loaded talker (with its code predictor), and whether its decode steps take the direct loop."""

    model: Any
    """Qwen3TTSForConditionalGeneration."""
    own_loop: bool = True

    @property
    def eos(self) -> int:
        return int(self.model.config.talker_config.codec_eos_token_id)


def _warpers(processors: LogitsProcessorList, temperature: float, top_k: int, top_p: float) -> LogitsProcessorList:
    """transformers' sampling warpers, in its order, for these settings."""
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k != 0:
        processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return processors


def _draw(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """One (1, 1) token: a multinomial draw from torch's global generator, or the argmax."""
    if do_sample:
        return torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1)
    return torch.argmax(scores, dim=-1, keepdim=True)


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
        _warpers(processors, sampling.temperature, sampling.top_k, sampling.top_p)
    return processors


def _subtalker_processors(sampling: Sampling) -> LogitsProcessorList:
    """What the package's code-predictor generate() builds for its subtalker arguments: the warpers, when sampling."""
    processors = LogitsProcessorList()
    if sampling.subtalker_dosample:
        t, k, p = sampling.subtalker_temperature, sampling.subtalker_top_k, sampling.subtalker_top_p
        _warpers(processors, t, k, p)
    return processors


@dataclass
class Step:
    """What a talker step leaves for the next: its logits, cache, last hidden state and the frame it completed."""

    logits: torch.Tensor
    past_key_values: Any
    past_hidden: torch.Tensor
    generation_step: int
    codes: torch.Tensor | None = None
    """(1, 16): the frame whose codebooks 1-15 this step drew (None after the prefill)."""


def _codebooks(predictor: Any, context: torch.Tensor, processors: LogitsProcessorList, do_sample: bool) -> torch.Tensor:
    """Codebooks 1-15 of a frame, (1, 15): what `predictor.generate(inputs_embeds=context, max_new_tokens=15, ...)`
    draws, from the same module calls (those arguments, recorded from transformers 4.57) and the same draws."""
    device = context.device
    count = predictor.config.num_code_groups - 1
    prefill = context.shape[1]
    out = predictor(
        inputs_embeds=context,
        past_key_values=DynamicCache(),
        use_cache=True,
        cache_position=torch.arange(prefill, device=device),
        return_dict=True,
    )
    generated = torch.empty((1, 0), dtype=torch.long, device=device)
    for index in range(count):
        scores = processors(generated, out.logits[:, -1, :].to(copy=True, dtype=torch.float32))
        token = _draw(scores, do_sample)
        generated = torch.cat([generated, token], dim=-1)
        if index + 1 == count:
            return generated
        out = predictor(
            input_ids=token,
            past_key_values=out.past_key_values,
            use_cache=True,
            cache_position=torch.tensor([prefill + index], device=device),
            generation_steps=out.generation_steps,
            return_dict=True,
        )
    return generated


def decode_step(
    model: Any,
    token: torch.Tensor,
    last: Step,
    prompt: Prompt,
    mask: torch.Tensor,
    cache_position: torch.Tensor,
    rope_deltas: torch.Tensor,
    sub: tuple[LogitsProcessorList, bool],
) -> Step:
    """The package's talker decode step (Qwen3TTSTalkerForConditionalGeneration.forward after the prefill), with
    the code predictor drawn by `_codebooks`; `model` is the talker, `rope_deltas` what its prefill set."""
    predictor = model.code_predictor
    last_id_hidden = model.get_input_embeddings()(token)
    codebooks = _codebooks(predictor, torch.cat((last.past_hidden, last_id_hidden), dim=1), *sub)
    embeddings = predictor.get_input_embeddings()
    hiddens = [last_id_hidden] + [embeddings[i](codebooks[..., i : i + 1]) for i in range(codebooks.shape[1])]
    inputs = torch.cat(hiddens, dim=1).sum(1, keepdim=True)
    if last.generation_step < prompt.trailing.shape[1]:
        inputs = inputs + prompt.trailing[:, last.generation_step].unsqueeze(1)
    else:
        inputs = inputs + prompt.pad
    batch, length = token.shape
    positions = torch.arange(length, device=token.device).view(1, -1).expand(batch, -1)
    positions = positions.add(cache_position[0] + rope_deltas).unsqueeze(0).expand(3, -1, -1)
    outputs = model.model(
        input_ids=None,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=last.past_key_values,
        inputs_embeds=inputs,
        use_cache=True,
        output_attentions=None,
        output_hidden_states=None,
        cache_position=cache_position,
    )
    hidden = outputs.last_hidden_state
    return Step(
        logits=model.codec_head(hidden),
        past_key_values=outputs.past_key_values,
        past_hidden=hidden[:, -1:, :],
        generation_step=last.generation_step + 1,
        codes=torch.cat((token, codebooks), dim=-1),
    )


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
    step = Step(out.logits, out.past_key_values, out.past_hidden, out.generation_step)
    rope_deltas = model.rope_deltas  # the prefill's: the direct decode steps read it from here, not the module
    own = (_subtalker_processors(sampling), sampling.subtalker_dosample)
    while True:
        scores = processors(generated, step.logits[:, -1, :].to(copy=True, dtype=torch.float32))
        token = _draw(scores, sampling.do_sample)
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
        position = torch.tensor([length + generated.shape[1] - 1], device=device)
        if talker.own_loop:
            step = decode_step(model, token, step, prompt, mask, position, rope_deltas, own)
        else:
            out = model(
                input_ids=token,
                attention_mask=mask,
                past_key_values=step.past_key_values,
                use_cache=True,
                cache_position=position,
                past_hidden=step.past_hidden,
                generation_step=step.generation_step,
                trailing_text_hidden=prompt.trailing,
                tts_pad_embed=prompt.pad,
                return_dict=True,
                **sub,
            )
            step = Step(out.logits, out.past_key_values, out.past_hidden, out.generation_step, out.hidden_states[1])
        outcome.frames += 1
        yield step.codes[0]  # type: ignore[index]  # a decode step's codes are set
