"""The Piper voice's synthesis options: their defaults, bounds and the check of a request's option map."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from stagevisor.stages.base import InvalidRequest
from stagevisor.stages.codes import INVALID_OPTION, UNKNOWN_OPTION
from stagevisor.supervisor.numbers import decimal


@dataclass(frozen=True)
class SynthesisOptions:
    """The voice's synthesis knobs, validated. Both noise scales at 0 make synthesis deterministic."""

    noise_scale: float = 0.667
    noise_w: float = 0.8
    length_scale: float = 1.0

    def as_dict(self) -> dict[str, float]:
        return {"noise_scale": self.noise_scale, "noise_w": self.noise_w, "length_scale": self.length_scale}


# name -> (lowest, highest), both accepted: the bounds models/piper.py declares to the HTTP API (a test holds both).
_OPTION_BOUNDS: dict[str, tuple[float, float]] = {
    "noise_scale": (0.0, 2.0),
    "noise_w": (0.0, 2.0),
    "length_scale": (0.1, 5.0),  # 0.1: ten times as fast, past anything intelligible (0 made no audio)
}


def _describe_range(name: str) -> str:
    low, high = _OPTION_BOUNDS[name]
    return f"[{low:g}, {high:g}]"


def parse_options(options: Mapping[str, Any] | None, defaults: SynthesisOptions | None = None) -> SynthesisOptions:
    """Validate a request's string option map into SynthesisOptions.

    Raises InvalidRequest naming the option and its accepted range for an
    unknown key, a value that is not a finite number, or one out of range.
    """
    values = (defaults or SynthesisOptions()).as_dict()
    for name, raw in (options or {}).items():
        if name not in _OPTION_BOUNDS:
            known = ", ".join(sorted(_OPTION_BOUNDS))
            raise InvalidRequest(
                f"unknown option {name!r}; supported options: {known}", code=UNKNOWN_OPTION, field=name
            )
        try:
            value = decimal(str(raw).strip())
        except ValueError:
            raise InvalidRequest(
                f"option {name!r} must be a number in {_describe_range(name)}, got {raw!r}",
                code=INVALID_OPTION,
                field=name,
            ) from None
        low, high = _OPTION_BOUNDS[name]
        if not math.isfinite(value) or not low <= value <= high:
            raise InvalidRequest(
                f"option {name!r} must be in {_describe_range(name)}, got {raw!r}", code=INVALID_OPTION, field=name
            )
        values[name] = value
    return SynthesisOptions(**values)
