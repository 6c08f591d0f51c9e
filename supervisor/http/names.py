"""The names clients send: model names and aliases, OpenAI's voice names and the map onto the model's voices."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from stagevisor.models.registry import hub_id_named
from stagevisor.supervisor.config import SpeechConfig
from stagevisor.supervisor.config.voices import declared_names, declared_spelling

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15", "gpt-4o-mini-tts-2025-03-20")
"""OpenAI's speech model names, its dated snapshots too (a client pinned to one sends it), accepted as aliases of
the served model unless --no-openai-aliases."""
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "onyx",
    "nova",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
"""OpenAI's built-in voice names (its SDKs' `voice` type lists them), in the order the default map hands out the
model's voices; names OpenAI adds go last, so the voices the older names stand for stay as they were."""
PCM_SAMPLE_RATE = 24000
"""OpenAI's `pcm` is 24 kHz 16-bit mono: `pcm` comes at this rate unless the request or --sample-rate says."""


@dataclass(frozen=True)
class SpeechSettings:
    """How the HTTP API names and shapes speech: `serve` options (the config's `voices` map is the daemon's, since an
    apply changes it: `Daemon.voice_names`)."""

    served_model_names: tuple[str, ...] = ()
    """--served-model-name: the first is the id /v1/models shows first; all are accepted as `model`."""
    hub_ids: tuple[str, ...] = ()
    """The served model's hub ids (its declaration's `paths`): a --model-path spelled as one of them (in any case)
    is listed by /v1/models; another, a local directory, is accepted as `model` but not listed."""
    openai_aliases: bool = True
    """Accept OpenAI's model names (OPENAI_MODELS: tts-1, tts-1-hd, gpt-4o-mini-tts and its snapshots) as the
    served model."""
    sample_rate: int | None = None
    """--sample-rate: every format's rate when the request gives none; None: pcm 24 kHz, others the model's."""
    voices_dir: Path | None = None
    """Where uploaded voices are kept (--voices-dir); None: voice uploads are off."""
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    """What the served model takes in a request (its declaration's `speech`)."""


def model_names(model: str | None, model_path: str | None, settings: SpeechSettings) -> tuple[str, ...]:
    """The names GET /v1/models lists, each accepted as `model`: --served-model-name names, the model's key,
    --model-path where it is one of the model's hub ids (spelled as the model declares it, however the operator
    typed it: the id clients know), then OpenAI's names."""
    names: list[str | None] = [*settings.served_model_names, model, served_hub_id(model_path, settings)]
    if settings.openai_aliases:
        names.extend(OPENAI_MODELS)
    return tuple(dict.fromkeys(n for n in names if n))


def served_hub_id(model_path: str | None, settings: SpeechSettings) -> str | None:
    """The model's hub id --model-path names, as the model declares it (None for another path): GET /v1/models lists
    it, and `model` takes it in any case, as --model-path does."""
    return hub_id_named(model_path, settings.hub_ids) if model_path else None


def unlisted_model_names(model: str | None, model_path: str | None, settings: SpeechSettings) -> tuple[str, ...]:
    """Names accepted as `model` that GET /v1/models leaves out: --model-path as the operator typed it where it is
    no hub id of the model (a local directory, which listed would show every client the daemon's directory
    layout); clients that were given it keep working."""
    if not model_path or model_path in model_names(model, model_path, settings):
        return ()
    return (model_path,)


def default_voice_map(voices: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """OpenAI's voice names -> the model's voices.

    A declared voice named like an OpenAI voice (id or alias) takes that name;
    the other names go to the declared voices in turn, in declaration order
    (one voice: every name is that voice). A model that declares no voice maps
    every name to "" (its default voice).
    """
    declared = declared_names(voices)
    ids = [str(v.get("id", "")) for v in voices]
    mapping: dict[str, str] = {}
    turn = 0
    for name in OPENAI_VOICES:
        if name in declared:
            mapping[name] = declared[name]
        elif ids:
            mapping[name] = ids[turn % len(ids)]
            turn += 1
        else:
            mapping[name] = ""
    return mapping


def voice_map(voices: Sequence[Mapping[str, Any]], overrides: Mapping[str, str]) -> dict[str, str]:
    """The names clients may send beyond the model's own: the default map, then the config's `voices` over it (each
    target in the model's own spelling, matched in any case)."""
    declared = declared_names(voices)
    mapping = {name: target for name, target in default_voice_map(voices).items() if name not in declared}
    mapping.update({name: declared_spelling(target, declared) for name, target in overrides.items()})
    return mapping
