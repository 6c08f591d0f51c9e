"""The talker's prompt: chat template, text and codec embeddings, speaker and reference codes, as qwen-tts lays them.

`build` turns one request's token ids (and its speaker embedding, instruction
ids, reference codes) into what the talker's step loop needs: the prefill
embeddings, the text embeddings that trail into the decode steps, and the
`tts_pad` embedding added once the text has run out. The layout is the one
`Qwen3TTSForConditionalGeneration.generate` builds for a batch of one, with the
same module calls on tensors of the same shapes, so the floats (and so the
sampled codes) are the ones the package's own generate() produces; the test
tests/integration/test_qwen3_stages.py compares them code for code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ROLE_TOKENS = 3
"""`<|im_start|>assistant\\n`: the template's leading tokens."""
TAIL_TOKENS = 5
"""`<|im_end|>\\n<|im_start|>assistant\\n`: the template's closing tokens after the text."""
REF_TAIL_TOKENS = 2
"""`<|im_end|>\\n`: what closes a reference transcript."""


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def reference_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruction_text(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n"


@dataclass
class Voice:
    """Who speaks: a preset speaker id, or a cloned speaker embedding with optional reference codes (ICL)."""

    speaker: str | None = None
    """A CustomVoice preset, spelled as the checkpoint's `spk_id` spells it, or None."""
    speaker_embedding: torch.Tensor | None = None
    """(hidden,) from the speaker encoder, for cloning on a Base checkpoint."""
    reference_ids: torch.Tensor | None = None
    """(1, n) token ids of the reference transcript in its template; with `reference_codes`, in-context cloning."""
    reference_codes: torch.Tensor | None = None
    """(frames, 16) codec frames of the reference audio (in-context cloning only)."""


@dataclass
class Prompt:
    """What the step loop starts from; tensors live on the talker's device."""

    embeds: torch.Tensor
    """(1, length, hidden): the prefill."""
    trailing: torch.Tensor
    """(1, n, hidden): added to the codec embedding of decode step i while i < n."""
    pad: torch.Tensor
    """(1, 1, hidden): added once the trailing text has run out."""
    reference_codes: torch.Tensor | None = None
    """(frames, 16): the reference's codes, left context for the vocoder (the package decodes them too)."""


def _codec(talker: Any, ids: list[list[int]], like: torch.Tensor) -> torch.Tensor:
    return talker.get_input_embeddings()(torch.tensor(ids, device=talker.device, dtype=like.dtype))


def _text(talker: Any, ids: torch.Tensor) -> torch.Tensor:
    return talker.text_projection(talker.get_text_embeddings()(ids))


def _language_id(config: Any, language: str, speaker: str | None) -> int | None:
    talker = config.talker_config
    language_id = None if language == "auto" else talker.codec_language_id[language]
    # A dialect speaker speaks its dialect when the language is Chinese or left to the model.
    if language in ("chinese", "auto") and speaker:
        dialect = talker.spk_is_dialect[speaker]
        if dialect:
            language_id = talker.codec_language_id[dialect]
    return language_id


def _reference_block(
    model: Any, text_ids: torch.Tensor, voice: Voice, pad: torch.Tensor, eos: torch.Tensor, non_streaming: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-context cloning: reference transcript + text, over codec-BOS + the reference's summed codebook embeddings."""
    talker, config = model.talker, model.config.talker_config
    codes = voice.reference_codes.to(talker.device)
    text = torch.cat([_text(talker, torch.cat([voice.reference_ids, text_ids], dim=-1)), eos], dim=1)
    layers = [talker.get_input_embeddings()(codes[:, :1])]
    layers += [talker.code_predictor.get_input_embeddings()[i - 1](codes[:, i : i + 1]) for i in range(1, 16)]
    codec = torch.cat(layers, dim=1).sum(1).unsqueeze(0)
    codec = torch.cat([_codec(talker, [[config.codec_bos_id]], text_ids), codec], dim=1)
    if non_streaming:
        padded = text + _codec(talker, [[config.codec_pad_id] * text.shape[1]], text_ids)
        return torch.cat([padded, codec + pad], dim=1), pad
    if text.shape[1] > codec.shape[1]:
        return text[:, : codec.shape[1]] + codec, text[:, codec.shape[1] :]
    text = torch.cat([text] + [pad] * (codec.shape[1] - text.shape[1]), dim=1)
    return text + codec, pad


@torch.inference_mode()
def build(
    model: Any,
    input_ids: torch.Tensor,
    language: str,
    voice: Voice,
    instruction_ids: torch.Tensor | None = None,
    non_streaming: bool = True,
) -> Prompt:
    """The talker prompt for one request; `model` is a Qwen3TTSForConditionalGeneration, `input_ids` (1, n)."""
    talker, config = model.talker, model.config
    tc = config.talker_config
    specials = torch.tensor(
        [[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]],
        device=talker.device,
        dtype=input_ids.dtype,
    )
    bos, eos, pad = _text(talker, specials).chunk(3, dim=1)
    language_id = _language_id(config, language, voice.speaker)
    if language_id is None:
        think = [[tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id]]
    else:
        think = [[tc.codec_think_id, tc.codec_think_bos_id, language_id, tc.codec_think_eos_id]]
    codec = [_codec(talker, think, input_ids)]
    if voice.speaker_embedding is not None:
        codec.append(voice.speaker_embedding.to(talker.device).to(talker.dtype).view(1, 1, -1))
    elif voice.speaker:
        codec.append(
            talker.get_input_embeddings()(
                torch.tensor(tc.spk_id[voice.speaker], device=talker.device, dtype=input_ids.dtype)
            ).view(1, 1, -1)
        )
    codec.append(_codec(talker, [[tc.codec_pad_id, tc.codec_bos_id]], input_ids))
    codec_embeds = torch.cat(codec, dim=1)
    role = _text(talker, input_ids[:, :ROLE_TOKENS])
    head = torch.cat((pad.expand(-1, codec_embeds.shape[1] - 2, -1), bos), dim=1) + codec_embeds[:, :-1]
    embeds = torch.cat((role, head), dim=1)
    text_ids = input_ids[:, ROLE_TOKENS:-TAIL_TOKENS]
    if voice.reference_codes is not None:
        block, trailing = _reference_block(model, text_ids, voice, pad, eos, non_streaming)
        embeds = torch.cat([embeds, block], dim=1)
    elif non_streaming:
        # The whole text in the prefill, each token over codec-pad, then codec-BOS: nothing trails.
        text = torch.cat((_text(talker, text_ids), eos), dim=1)
        text = text + _codec(talker, [[tc.codec_pad_id] * (text_ids.shape[1] + 1)], input_ids)
        embeds = torch.cat([embeds, text, pad + _codec(talker, [[tc.codec_bos_id]], input_ids)], dim=1)
        trailing = pad
    else:
        # The first text token in the prefill over codec-BOS; the rest trails into the decode steps.
        first = _text(talker, input_ids[:, ROLE_TOKENS : ROLE_TOKENS + 1]) + codec_embeds[:, -1:]
        embeds = torch.cat([embeds, first], dim=1)
        trailing = torch.cat((_text(talker, input_ids[:, ROLE_TOKENS + 1 : -TAIL_TOKENS]), eos), dim=1)
    if instruction_ids is not None:
        embeds = torch.cat([_text(talker, instruction_ids), embeds], dim=1)
    return Prompt(embeds=embeds, trailing=trailing, pad=pad, reference_codes=voice.reference_codes)
