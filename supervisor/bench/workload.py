"""What `stagevisor bench` measures: the workload and the candidate topologies, each validated as `plan` does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from stagevisor.supervisor.errors import StagevisorError
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.bench.loadgen import VoiceFields

DEFAULT_TEXTS = (
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon.",
    "A supervisor decides where each stage runs; the vocoder may share the engine's process or have its own, "
    "and only a measurement on the real workload says which is faster.",
    "Yes.",
    "Streaming synthesis sends the first audio while the rest of the sentence is still being generated.",
)
"""A mixed default workload: short and long sentences, as a voice assistant sees them."""


@dataclass(frozen=True)
class Topology:
    """One candidate placement: its label as the operator wrote it and the PlacementRequest it stands for."""

    label: str
    request: PlacementRequest


@dataclass
class Workload:
    """What to measure: `requests` per concurrency (or rate), or for `duration` seconds where it is None.

    No defaults for the figures: `stagevisor bench`'s options hold them (commands/bench_options.py), in one place."""

    texts: Sequence[str]
    requests: int | None
    concurrency: Sequence[int]
    warmup: int
    duration: float | None = None
    rate: float | None = None
    options: dict[str, str] = field(default_factory=dict)
    voice: VoiceFields = field(default_factory=VoiceFields)
    """Who every request speaks as (--voice, --reference-audio, --reference-transcript)."""


def validate(topology: Topology) -> dict[str, Any] | None:
    """None when the topology plans; else the `{"code", "message", ...}` error `plan` would print."""
    try:
        plan_placement(topology.request)
    except StagevisorError as error:
        return error.to_json()["error"]
    return None
