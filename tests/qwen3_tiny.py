"""A tiny random Qwen3-TTS 12 Hz checkpoint, built at test time with qwen-tts's own classes (never committed).

`build(directory, kind)` writes what `Qwen3TTSModel.from_pretrained(directory)`
loads offline: config.json and weights of a Qwen3TTSForConditionalGeneration
with a few small layers, a byte-level BPE text tokenizer trained here on a
handful of sentences (with the chat-template special tokens), generation
defaults, and speech_tokenizer/ (a small Qwen3TTSTokenizerV2Model: Mimi encoder
and the 12 Hz decoder, 16 codebooks, 1,920 samples per frame at 24 kHz).
Weights are random from a fixed seed, so the audio is noise, but every code
path the real checkpoints take runs.

Also run as a script: `python tests/qwen3_tiny.py DIR [--kind base|custom_voice|voice_design]`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

CODEBOOK = 2048
"""Codebook entries; the talker's vocabulary is these plus 1,024 control ids (the package suppresses the last 1,024)."""
CODEC_IDS = {
    "codec_pad_id": CODEBOOK + 100,
    "codec_bos_id": CODEBOOK + 101,
    "codec_eos_token_id": CODEBOOK + 102,
    "codec_think_id": CODEBOOK + 106,
    "codec_nothink_id": CODEBOOK + 107,
    "codec_think_bos_id": CODEBOOK + 108,
    "codec_think_eos_id": CODEBOOK + 109,
}
LANGUAGES = {"english": CODEBOOK + 150, "chinese": CODEBOOK + 151}
SPEAKERS = {"ryan": CODEBOOK + 200, "vivian": CODEBOOK + 201}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|tts_pad|>", "<|tts_text_bos|>", "<|tts_text_eod|>"]
CORPUS = [
    "assistant",
    "user",
    "Hello, this is a tiny test checkpoint speaking.",
    "The quick brown fox jumps over the lazy dog.",
    "Speak slowly and calmly, like a radio host.",
    "A reference transcript for voice cloning.",
]
HIDDEN = 64


def _text_tokenizer(directory: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    # "assistant" and "\n" must each be one token: the package slices the chat template by token count.
    tokenizer.train_from_iterator(CORPUS * 50 + ["assistant\n"] * 200, trainer=trainer)
    fast = Qwen2TokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIALS[1:],
    )
    fast.save_pretrained(directory)
    return fast


def _speech_tokenizer(directory: Path, seed: int) -> None:
    import torch
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from transformers import EncodecFeatureExtractor

    config = Qwen3TTSTokenizerV2Config(
        encoder_config={
            "hidden_size": 32,
            "num_filters": 4,
            "num_residual_layers": 1,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 64,
            "codebook_size": CODEBOOK,
            "codebook_dim": 16,
            "vector_quantization_hidden_dimension": 16,
            "num_quantizers": 16,
            "num_semantic_quantizers": 1,
            "sliding_window": 64,
            "use_cache": False,
            "upsample_groups": 32,
        },
        decoder_config={
            "codebook_size": CODEBOOK,
            "codebook_dim": 32,
            "hidden_size": 32,
            "latent_dim": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_quantizers": 16,
            "decoder_dim": 32,
        },
    )
    config.architectures = ["Qwen3TTSTokenizerV2Model"]
    torch.manual_seed(seed + 1)
    model = Qwen3TTSTokenizerV2Model(config)
    # The codebooks start as zeros (they are learnt as running sums): all codes would decode to silence.
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if "embed" in name and tensor.is_floating_point() and not tensor.any():
                tensor.normal_(0.0, 1.0)
        # transformers' small init leaves the waveform near 1e-8, which 16-bit PCM rounds to silence: scale the
        # last convolution (a linear map of what precedes it) so random codes peak near 0.5.
        last = model.decoder.decoder[-1].conv
        peak = model.decoder(torch.randint(0, CODEBOOK, (1, 16, 24))).abs().max()
        last.weight.mul_(0.5 / peak)
        last.bias.mul_(0.5 / peak)
    model.save_pretrained(directory)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(directory)


def _loadable_by_the_package(directory: Path) -> None:
    """Drop what Qwen3TTSSpeakerEncoderConfig cannot read back from `speaker_encoder_config` (its `model_type`).

    The package cannot reload its own save otherwise; the released checkpoints
    have no such key. stages/qwen3/loading.py copes with a checkpoint that has it.
    """
    path = directory / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["speaker_encoder_config"].pop("model_type", None)
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")


def write_checkpoint(directory: Path, kind: str = "custom_voice", size: str = "1b7", **overrides: object) -> Path:
    """A checkpoint's files without weights (config.json naming its type, size, speakers and languages, and the
    files beside it that `locate` looks for): what recognising a checkpoint reads, in no time."""
    config = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_type": kind,
        "tts_model_size": size,
        "talker_config": {
            "spk_id": {"ryan": 3000, "vivian": 3001} if kind == "custom_voice" else {},
            "spk_is_dialect": {"ryan": False, "vivian": "sichuan_dialect"} if kind == "custom_voice" else {},
            "codec_language_id": {"english": 2050, "chinese": 2051, "sichuan_dialect": 2052},
        },
        **overrides,
    }
    (directory / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "speech_tokenizer" / "config.json").write_text("{}")
    (directory / "generation_config.json").write_text("{}")
    (directory / "vocab.json").write_text("{}")
    (directory / "merges.txt").write_text("")
    return directory


def build(directory: str | Path, kind: str = "custom_voice", size: str = "1b7", seed: int = 0) -> Path:
    """Write a tiny random checkpoint of `kind` (base, custom_voice, voice_design) into `directory`."""
    import torch
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    text = _text_tokenizer(directory)
    ids = text.convert_tokens_to_ids
    talker = {
        "vocab_size": CODEBOOK + 1024,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_code_groups": 16,
        "text_hidden_size": 32,
        "text_vocab_size": len(text),
        "rope_scaling": {"mrope_section": [2, 3, 3], "interleaved": True, "type": "default"},
        "codec_language_id": LANGUAGES,
        "spk_id": SPEAKERS if kind == "custom_voice" else {},
        "spk_is_dialect": {name: False for name in SPEAKERS} if kind == "custom_voice" else {},
        "code_predictor_config": {
            "vocab_size": CODEBOOK,
            "hidden_size": 48,
            "intermediate_size": 96,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 12,
            "num_code_groups": 16,
        },
        **CODEC_IDS,
    }
    speaker_encoder = {
        "enc_dim": HIDDEN,
        "enc_channels": [32, 32, 32, 32, 96],
        "enc_attention_channels": 16,
        "enc_res2net_scale": 4,
        "enc_se_channels": 16,
    }
    config = Qwen3TTSConfig(
        talker_config=talker,
        speaker_encoder_config=speaker_encoder,
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size=size,
        tts_model_type=kind,
        im_start_token_id=ids("<|im_start|>"),
        im_end_token_id=ids("<|im_end|>"),
        tts_pad_token_id=ids("<|tts_pad|>"),
        tts_bos_token_id=ids("<|tts_text_bos|>"),
        tts_eos_token_id=ids("<|tts_text_eod|>"),
    )
    config.architectures = ["Qwen3TTSForConditionalGeneration"]
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(config)
    model.save_pretrained(directory)
    _loadable_by_the_package(directory)
    generation = {
        "do_sample": True,
        "top_k": 50,
        "top_p": 1.0,
        "temperature": 0.9,
        "repetition_penalty": 1.05,
        "subtalker_dosample": True,
        "subtalker_top_k": 50,
        "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9,
        "max_new_tokens": 48,
    }
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    _speech_tokenizer(directory / "speech_tokenizer", seed)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--kind", default="custom_voice", choices=("base", "custom_voice", "voice_design"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.directory, args.kind, seed=args.seed))


if __name__ == "__main__":
    main()
