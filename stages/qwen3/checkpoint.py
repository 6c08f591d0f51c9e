"""Where a Qwen3-TTS checkpoint lives and what it supports: a local directory or a hub id in the local HF cache.

Pure standard library: the daemon calls it before any worker starts, so an
operator who names a missing checkpoint learns it at once, with the paths
searched. Nothing here downloads: a hub id is looked up in the local Hugging
Face cache only (the layout `huggingface_hub` writes: `models--ORG--NAME/refs/main`
naming a folder under `snapshots/`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
TOKENIZER_12HZ = "qwen3_tts_tokenizer_12hz"
MODEL_KEY = "qwen3-tts"
"""The registry key, which names the model but no checkpoint."""
HUB_IDS = (
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
)
"""The released 12 Hz checkpoints; any other local directory whose config.json names the architecture works too."""

TEXT_TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
BASE, CUSTOM_VOICE, VOICE_DESIGN = "base", "custom_voice", "voice_design"
KIND_NAMES = {BASE: "Base", CUSTOM_VOICE: "CustomVoice", VOICE_DESIGN: "VoiceDesign"}


class CheckpointError(Exception):
    """The checkpoint cannot be used; `code` names why, the message says what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class Checkpoint:
    """A located 12 Hz checkpoint and what its config says it can do."""

    directory: Path
    kind: str
    """`tts_model_type`: base (voice cloning), custom_voice (preset speakers) or voice_design (instructions)."""
    size: str
    """`tts_model_size` (e.g. 1b7, 0b6)."""
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    dtype: str | None = None
    """The dtype its weights were saved in (config.json's `dtype`, or `torch_dtype` as transformers before 4.56
    wrote it), which the stages' `dtype: auto` loads on a GPU."""

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    @property
    def clones(self) -> bool:
        """Voice cloning from reference audio (and its transcript): Base checkpoints only."""
        return self.kind == BASE

    @property
    def has_speakers(self) -> bool:
        """Preset speakers: CustomVoice checkpoints."""
        return self.kind == CUSTOM_VOICE and bool(self.speakers)

    @property
    def follows_instructions(self) -> bool:
        """`instructions`: VoiceDesign, and CustomVoice except the 0.6B size (whose package drops them)."""
        return self.kind == VOICE_DESIGN or (self.kind == CUSTOM_VOICE and self.size != "0b6")

    def summary(self) -> str:
        """What an operator is told the served checkpoint is and does, in one line."""
        if self.clones:
            voices = "voices cloned from reference audio"
        elif self.has_speakers:
            voices = f"preset speakers {', '.join(self.speakers)}"
        else:
            voices = "voices described in instructions"
        instructions = "follows instructions" if self.follows_instructions else "no instructions"
        size = f" {self.size}" if self.size else ""
        return (
            f"Qwen3-TTS {self.kind_name}{size} checkpoint {str(self.directory)!r}: {voices}; {instructions}; "
            f"languages {', '.join(self.languages)}"
        )


def qwen_tts_available() -> bool:
    """True when the `qwen3` extra's packages can be imported (checked without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("qwen_tts", "torch", "torchaudio"))


def hub_cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache to search, as huggingface_hub picks it: HF_HUB_CACHE (or its old name
    HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else ~/.cache/huggingface/hub; the first set is the only one, so a
    checkpoint the operator's cache setting leaves out is not served from another."""
    env = os.environ if environ is None else environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(env[name]).expanduser()
    home = env.get("HF_HOME")
    return (Path(home).expanduser() if home else Path("~/.cache/huggingface").expanduser()) / "hub"


def _repo_folder(root: Path, repo_id: str) -> Path:
    """The cache's folder for `repo_id`, as written or in another case: the hub resolves ids in any case (so
    does `--model-path`), and the folder is named as the id was spelled when it was downloaded."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    if repo.is_dir():
        return repo
    try:
        return next((child for child in root.iterdir() if child.name.lower() == repo.name.lower()), repo)
    except OSError:  # no such cache here
        return repo


def _snapshot(root: Path, repo_id: str) -> Path | None:
    repo = _repo_folder(root, repo_id)
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
        if candidate.is_dir():
            return candidate
    snapshots = sorted((repo / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return snapshots[-1].parent if snapshots else None


def _looks_like_hub_id(model_path: str) -> bool:
    parts = model_path.split("/")
    return len(parts) == 2 and all(parts) and not model_path.startswith((".", "~"))


def read_config(directory: Path) -> dict[str, Any]:
    """The checkpoint's config.json as a dict; CheckpointError when unreadable."""
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError("QWEN3_BAD_CHECKPOINT", f"cannot read {str(path)!r}: {error}") from None
    if not isinstance(data, dict):
        raise CheckpointError("QWEN3_BAD_CHECKPOINT", f"{str(path)!r} is not a JSON object")
    return data


def config_mismatch(directory: Path | str, why: str) -> CheckpointError:
    """QWEN3_BAD_CHECKPOINT for a config.json the package cannot build the model of its weights from, `why` saying
    what is wrong: found when the weights load (the loader's exception) or, where config.json alone shows it (no
    talker_config, from which the package would build a talker of its own default sizes), before anything loads."""
    return CheckpointError(
        "QWEN3_BAD_CHECKPOINT",
        f"{str(Path(directory) / 'config.json')!r} does not describe a model its weights load into ({why}); "
        "restore the checkpoint's own config.json",
    )


def _typed(config: Mapping[str, Any], name: str, kind: type, directory: Path, where: str = "") -> Any:
    """`config[name]` (an empty `kind` when absent or null); CheckpointError when it is of another JSON type."""
    value = config.get(name)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a list"
        raise CheckpointError(
            "QWEN3_BAD_CHECKPOINT",
            f"{str(directory / 'config.json')!r}: {where}{name} is {json.dumps(value)[:80]}, expected {expected}",
        )
    return value


def describe(directory: Path) -> Checkpoint:
    """What the checkpoint in `directory` is; CheckpointError unless it is a usable 12 Hz Qwen3-TTS checkpoint."""
    config = read_config(directory)
    if ARCHITECTURE not in _typed(config, "architectures", list, directory):
        raise CheckpointError(
            "QWEN3_BAD_CHECKPOINT",
            f"{str(directory)!r} is not a Qwen3-TTS checkpoint: its config.json names architectures "
            f"{config.get('architectures')!r}, not {ARCHITECTURE!r}",
        )
    if config.get("tokenizer_type") is None:
        raise CheckpointError(
            "QWEN3_BAD_CHECKPOINT",
            f"{str(directory / 'config.json')!r} names no tokenizer_type; a 12 Hz checkpoint's config.json says "
            f"{TOKENIZER_12HZ!r}: download the checkpoint again or point --model-path at a complete one",
        )
    if config.get("tokenizer_type") != TOKENIZER_12HZ:
        raise CheckpointError(
            "QWEN3_UNSUPPORTED_CHECKPOINT",
            f"{str(directory)!r} uses speech tokenizer {config.get('tokenizer_type')!r}; only the 12 Hz "
            f"checkpoints ({TOKENIZER_12HZ}) are served",
        )
    kind = config.get("tts_model_type")
    if not isinstance(kind, str) or kind not in KIND_NAMES:
        raise CheckpointError(
            "QWEN3_UNSUPPORTED_CHECKPOINT",
            f"{str(directory)!r} has tts_model_type {kind!r}; expected one of {sorted(KIND_NAMES)}",
        )
    for needed in ("speech_tokenizer/config.json", "generation_config.json"):
        if not (directory / needed).is_file():
            raise CheckpointError(
                "QWEN3_BAD_CHECKPOINT", f"{str(directory)!r} lacks {needed}; the checkpoint is incomplete"
            )
    # The text tokenizer loads from either form; with neither, transformers fails with a TypeError on a None path.
    if not any(all((directory / name).is_file() for name in form) for form in TEXT_TOKENIZER_FILES):
        raise CheckpointError(
            "QWEN3_BAD_CHECKPOINT",
            f"{str(directory)!r} lacks its text tokenizer (tokenizer.json, or vocab.json and merges.txt); "
            "the checkpoint is incomplete",
        )
    if config.get("talker_config") is None:
        raise config_mismatch(directory, "it has no talker_config")
    talker = _typed(config, "talker_config", dict, directory)
    language_ids = _typed(talker, "codec_language_id", dict, directory, "talker_config.")
    languages = ("auto", *(name for name in language_ids if "dialect" not in name))
    speakers = tuple(_typed(talker, "spk_id", dict, directory, "talker_config."))
    _check_dialects(
        directory, speakers, _typed(talker, "spk_is_dialect", dict, directory, "talker_config."), language_ids
    )
    # transformers reads `dtype` first and `torch_dtype` (what it wrote before 4.56, as the released checkpoints
    # have it) only without one; 4.57, which qwen-tts pins, writes `dtype` alone, as in any checkpoint saved with it.
    dtype = next((config[key] for key in ("dtype", "torch_dtype") if config.get(key) is not None), None)
    return Checkpoint(
        directory=directory,
        kind=kind,
        size=str(config.get("tts_model_size") or ""),
        speakers=speakers,
        languages=languages,
        dtype=dtype if isinstance(dtype, str) else None,
    )


def _check_dialects(
    directory: Path, speakers: tuple[str, ...], dialects: Mapping[str, Any], language_ids: Mapping[str, Any]
) -> None:
    """Every speaker is false or a dialect in spk_is_dialect: the prompt reads it for each chinese or auto request."""
    for speaker in speakers:
        dialect = dialects.get(speaker)
        if dialect is not False and (not isinstance(dialect, str) or dialect not in language_ids):
            raise CheckpointError(
                "QWEN3_BAD_CHECKPOINT",
                f"{str(directory / 'config.json')!r}: talker_config.spk_is_dialect[{speaker!r}] is "
                f"{json.dumps(dialect)[:80]}; expected false or a dialect named in talker_config.codec_language_id",
            )


def locate(model_path: str | None, environ: Mapping[str, str] | None = None) -> Checkpoint:
    """The checkpoint `model_path` names: a local directory, or a hub id found in the local cache.

    CheckpointError (QWEN3_NO_CHECKPOINT) names every path searched when none is found.
    """
    searched: list[str] = []
    root = hub_cache_root(environ)
    if model_path and model_path.strip():
        wanted = model_path.strip()
        directory = Path(wanted).expanduser()
        if directory.is_dir():
            return describe(directory)
        searched.append(str(directory))
        if _looks_like_hub_id(wanted.rstrip("/")):
            snapshot = _snapshot(root, wanted.rstrip("/"))
            searched.append(str(root / ("models--" + wanted.rstrip("/").replace("/", "--"))))
            if snapshot is not None:
                return describe(snapshot)
        what = f"no checkpoint found for {wanted!r}"
    else:
        what = "qwen3-tts needs a checkpoint and none was named"
    raise CheckpointError(
        "QWEN3_NO_CHECKPOINT",
        f"{what}; searched: {', '.join(searched) or '(nothing)'}. Pass --model-path a local checkpoint "
        f"directory or one of {', '.join(HUB_IDS)} already in the Hugging Face cache ({root}); "
        "nothing is downloaded",
    )


def requirements(model_path: str | None) -> list[str]:
    """What serving Qwen3-TTS from `model_path` lacks here: the checkpoint (empty: found). Pure; loads nothing.

    The model declaration's requirements check: `serve` stops before any
    worker starts with this message, which names the paths searched (the
    `qwen3` extra is checked beside it, with every executor's extra).
    """
    try:
        locate(None if model_path == MODEL_KEY else model_path)
    except CheckpointError as error:
        return [str(error)]
    return []
