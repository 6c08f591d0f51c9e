"""The daemon seen from the HTTP API: what the app asks of it (SpeechDaemon) and the served model as requests see it."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping, Protocol

from stagevisor.supervisor.http.names import (
    SpeechSettings,
    declared_names,
    model_names,
    served_hub_id,
    unlisted_model_names,
    voice_map,
)
from stagevisor.supervisor.http.fields import accepted_fields
from stagevisor.supervisor.http.request import Served, SpeechRequest, parse_speech_request, requested_voice
from stagevisor.supervisor.http.speech import FALLBACK_SAMPLE_RATE, SpeechGateway
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import StatusReport, TopologyReport
from stagevisor.supervisor.http.voices import VoiceStore


class SpeechDaemon(Protocol):
    """What the HTTP app needs from the daemon."""

    @property
    def plan(self) -> Plan:
        """The Plan served."""

    @property
    def gateway(self) -> SpeechGateway:
        """Where requests are admitted and started."""

    def topology(self) -> TopologyReport: ...
    def status(self) -> StatusReport: ...
    def voices(self) -> list[dict[str, Any]]:
        """The voices the executors declare: dicts with at least `id`."""

    @property
    def voice_names(self) -> Mapping[str, str]:
        """The config's `voices` map now (an apply may change it): a name clients send -> the model's voice."""


class SpeechService:
    """The served model as requests see it: its names, voices, uploaded voices and what it takes."""

    def __init__(self, daemon: SpeechDaemon, settings: SpeechSettings, store: VoiceStore | None) -> None:
        self.daemon = daemon
        self.settings = settings
        self.store = store

    def models(self) -> tuple[str, ...]:
        """The names GET /v1/models lists, the one requests default to first."""
        return model_names(self.daemon.plan.model, self.daemon.plan.model_path, self.settings)

    def unlisted_models(self) -> tuple[str, ...]:
        """Names accepted as `model` but not listed (--model-path as a local directory)."""
        return unlisted_model_names(self.daemon.plan.model, self.daemon.plan.model_path, self.settings)

    def served(self) -> Served:
        voices = self.daemon.voices()
        return Served(
            models=self.models(),
            unlisted_models=self.unlisted_models(),
            hub_id=served_hub_id(self.daemon.plan.model_path, self.settings),
            voices=voices,
            voice_map=voice_map(voices, self.daemon.voice_names),
            uploaded=self.store.find if self.store is not None else (lambda name: None),
            speech=self.settings.speech,
            sample_rate=self.settings.sample_rate,
        )

    def rate_hint_of(self, served: Served) -> int:
        return self.sample_rate_hint(served.voices)

    def sample_rate_hint(self, voices: list[dict[str, Any]]) -> int:
        rates = [int(v["sample_rate"]) for v in voices if v.get("sample_rate")]
        return rates[0] if rates else FALLBACK_SAMPLE_RATE

    async def parse(self, data: dict[str, Any]) -> tuple[SpeechRequest, Served]:
        """Check a request; off the event loop when it reads an uploaded voice or decodes reference audio."""
        served = self.served()
        voice = requested_voice(data)
        reads_files = data.get("ref_audio") is not None or (
            self.store is not None and isinstance(voice, str) and voice and voice not in declared_names(served.voices)
        )
        if reads_files:
            return await asyncio.to_thread(parse_speech_request, data, served), served
        return parse_speech_request(data, served), served

    def accepts(self) -> dict[str, Any]:
        """What a request to the model may carry (GET /v1/models)."""
        speech = self.settings.speech
        return {
            "fields": accepted_fields(speech),
            "clones": speech.clones,
            "instructions": speech.instructions,
            "seed": speech.seed,
            "seed_range": {"minimum": 0, "maximum": speech.seed_maximum} if speech.seed else None,
            "speed": speech.speed,
            "languages": list(speech.languages),
            "options": None
            if speech.options is None
            else {name: spec.model_dump() for name, spec in speech.options.items()},
            "response_formats": ["mp3", "opus", "aac", "flac", "wav", "pcm"],
            "sample_rates": {"minimum": 8000, "maximum": 48000, "default": self.settings.sample_rate},
        }
