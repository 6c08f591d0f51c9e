"""The model registry: resolve a registry key, an HF-style path or a local directory to a declaration."""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from stagevisor.models.declaration import ModelDeclaration
from stagevisor.supervisor.errors import ConfigError, ErrorCode

ENTRY_POINT_GROUP = "stagevisor.models"

BUILTIN_MODELS = (
    ("higgs-tts", "stagevisor.models.higgs"),
    ("fishaudio-s2-pro", "stagevisor.models.fishaudio"),
    ("voxtral-tts", "stagevisor.models.voxtral"),
    ("ming-omni-tts", "stagevisor.models.ming"),
    ("moss-tts-local", "stagevisor.models.moss"),
    ("moss-tts-local-split", "stagevisor.models.moss"),
    ("qwen3-tts", "stagevisor.models.qwen3"),
    ("moss-tts-delay", "stagevisor.models.moss"),
    ("audar-tts", "stagevisor.models.audar"),
    ("zonos2", "stagevisor.models.zonos"),
    ("demo", "stagevisor.models.demo"),
    ("piper", "stagevisor.models.piper"),
)
"""Every built-in model: its registry key and the module whose DECLARATIONS hold it, in the order
`stagevisor models` lists them (the design's model table)."""
DEFAULT_MODEL = "demo"


@lru_cache(maxsize=1)
def builtin_models() -> tuple[ModelDeclaration, ...]:
    """Every built-in declaration, in BUILTIN_MODELS order; a key its module does not declare is an error."""
    declarations = []
    for key, module in BUILTIN_MODELS:
        found = [d for d in importlib.import_module(module).DECLARATIONS if d.key == key]
        if len(found) != 1:
            raise LookupError(f"{module} declares {len(found)} models with key {key!r}, not one")
        declarations.append(found[0])
    return tuple(declarations)


def third_party_models() -> tuple[ModelDeclaration, ...]:
    """Declarations contributed by installed packages through the `stagevisor.models` entry points.

    An entry point may name a ModelDeclaration, an iterable of them, or a
    callable returning either.
    """
    from importlib.metadata import entry_points

    declarations: list[ModelDeclaration] = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
            if callable(loaded) and not isinstance(loaded, ModelDeclaration):
                loaded = loaded()
        except Exception as error:  # a broken plugin must not hide the built-ins
            raise ConfigError(
                ErrorCode.UNKNOWN_MODEL,
                f"model plugin {entry.name!r} ({entry.value}) failed to load: {error}",
            ) from error
        items = [loaded] if isinstance(loaded, ModelDeclaration) else list(loaded)
        for item in items:
            if not isinstance(item, ModelDeclaration):
                raise ConfigError(
                    ErrorCode.UNKNOWN_MODEL,
                    f"model plugin {entry.name!r} ({entry.value}) gave {type(item).__name__}, "
                    "expected a models.declaration.ModelDeclaration",
                )
            declarations.append(item)
    return tuple(declarations)


def names_hub_id(model_path: str, hub_ids: Iterable[str]) -> bool:
    """Whether `model_path` is one of `hub_ids` (a declaration's `paths`) as --model-path is matched: surrounding
    spaces and a trailing slash dropped, in any case (operators type HF repository ids by hand)."""
    return hub_id_named(model_path, hub_ids) is not None


def hub_id_named(model_path: str, hub_ids: Iterable[str]) -> str | None:
    """The one of `hub_ids` that `model_path` names as `names_hub_id` matches it, spelled as declared; None for none."""
    wanted = model_path.strip().rstrip("/").lower()
    return next((hub_id for hub_id in hub_ids if wanted == hub_id.lower()), None)


def declared_model(model_path: str) -> ModelDeclaration | None:
    """The model whose registry key or declared hub id `model_path` is (built-ins first, then plugins), without
    looking at the file system: None for anything else (a local directory, an unknown name)."""
    return _match(model_path, builtin_models()) or _match(model_path, third_party_models())


def _match(model_path: str, declarations: tuple[ModelDeclaration, ...]) -> ModelDeclaration | None:
    wanted = model_path.strip().rstrip("/")
    for declaration in declarations:
        if wanted == declaration.key:
            return declaration
    for declaration in declarations:
        if names_hub_id(wanted, declaration.paths):
            return declaration
    return None


def _architectures_of(directory: Path) -> tuple[str, ...] | None:
    config = directory / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(ErrorCode.UNKNOWN_MODEL, f"cannot read {str(config)!r}: {error}") from None
    architectures = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(architectures, list):
        return ()
    return tuple(a for a in architectures if isinstance(a, str))


def _without_config(model_path: str, directory: Path, known: str) -> str:
    """Why a directory that holds no config.json names no model, and where its checkpoint may be."""
    snapshots = directory / "snapshots"
    hint = (
        f"; it looks like a Hugging Face cache folder, whose checkpoints are in {str(snapshots)!r}/REVISION "
        "(or pass the hub id itself)"
        if snapshots.is_dir()
        else ""
    )
    return (
        f"unknown model directory {model_path!r}: it holds no config.json, which names the model's architecture"
        f"{hint}; pass --model-path the checkpoint's own directory (the one with config.json), a hub id or a model "
        f"key; known models: {known}"
    )


def resolve_model(model_path: str | None) -> ModelDeclaration:
    """The declaration for a model path: None (demo), a key, an HF-style path, or a local directory."""
    if model_path is None:
        return next(d for d in builtin_models() if d.key == DEFAULT_MODEL)
    if not model_path.strip():
        raise ConfigError(ErrorCode.UNKNOWN_MODEL, "--model-path is empty; name a model or omit it for the demo")
    builtins = builtin_models()
    found = _match(model_path, builtins)
    if found is not None:
        return found
    try:
        directory = Path(model_path).expanduser()
    except RuntimeError:  # `~user` for a user this machine does not know: not a local directory
        directory = Path(model_path)
    architectures = _architectures_of(directory) if directory.is_dir() else None
    # Plugins are consulted only when the built-ins do not match, so `plan`
    # for a built-in model never pays for scanning installed distributions.
    plugins = third_party_models()
    found = _match(model_path, plugins)
    if found is not None:
        return found
    if architectures:
        for declaration in builtins + plugins:
            if set(architectures) & set(declaration.architectures):
                return declaration
    known = ", ".join(d.key for d in builtins + plugins)
    if architectures is None and directory.is_dir():
        raise ConfigError(ErrorCode.UNKNOWN_MODEL, _without_config(model_path, directory, known))
    if architectures is not None:
        detail = (
            f"its config.json names architectures {list(architectures)}, none of which a known model declares"
            if architectures
            else "its config.json has no `architectures` list"
        )
        raise ConfigError(
            ErrorCode.UNKNOWN_MODEL,
            f"unknown model directory {model_path!r}: {detail}; known models: {known}",
        )
    raise ConfigError(
        ErrorCode.UNKNOWN_MODEL,
        f"unknown model {model_path!r}: not a registry key, a known model path, or a directory with a "
        f"config.json; known models: {known} (run `stagevisor models` for their paths)",
    )
