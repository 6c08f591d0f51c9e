"""Stand-in executors for the nine built-in models without real executors here, built on the default voice.

Each such model declaration runs its own stage names, topology and edges
on these executors; the weights are the default hibari voice
(stages/hibari/voice.py, Apache-2.0), not the model's own. They run only when
the operator asks for them (`--stand-ins`) and are labelled as stand-ins.
What each stand-in keeps faithful is *where request state lives*:

- MOSS-TTS (local, local-split, delay): preprocessing publishes the prepared
  request into the module-level `PREPARED_REQUEST_QUEUE`; the engine pops it.
- Ming-Omni-TTS: preprocessing caches the prepared prompt in the module-level
  `_MING_PROMPTS`; reference_encode adds the reference encoding to that entry
  in place; the engine pops it.
- Voxtral TTS: preprocessing builds the voice prompt (reference encoding
  included) into the module-level `_VOXTRAL_VOICE_PROMPTS`; tts_generation
  pops it.
- Higgs-TTS, FishAudio S2-Pro, Audar-TTS, Zonos2: everything travels in
  `StagePayload.data`.

So the edges the spec calls unsafe really break when split: the consuming
stage, in another process, finds its module's registry empty and fails the
request with a StageError saying which stages must share a process. The audio
path is the demo's: with the same seed every model's audio for a text is
byte-identical to the demo's.

Factory: `stagevisor.stages.standins:make(model="<registry key>", stage="<stage name>")`.
"""

from __future__ import annotations

from typing import Any, Callable

from stagevisor.stages.base import StageContext, StagePayload
from stagevisor.stages.hibari.executors import Preprocessing, PreparedRequest, TtsEngine, Vocoder
from stagevisor.stages.prepared import PreparedRequestQueue, ProcessLocalRegistry
from stagevisor.stages.reference import ReferenceEncoder, encode_reference

# Module-level on purpose: this is the process-local state the unsafe edges depend on.
PREPARED_REQUEST_QUEUE = PreparedRequestQueue("MOSS PreparedRequestQueue", ("preprocessing", "tts_engine"))
_MING_PROMPTS = ProcessLocalRegistry("Ming-Omni-TTS prompt cache", ("preprocessing", "reference_encode", "tts_engine"))
_VOXTRAL_VOICE_PROMPTS = ProcessLocalRegistry("Voxtral voice-prompt cache", ("preprocessing", "tts_generation"))


def _with_stage(obj: Any, stage: str) -> Any:
    obj.stage = stage
    return obj


class PayloadPreprocessing(Preprocessing):
    """The default voice's preprocessing in front of a reference encoder stage, which takes the reference audio."""

    clones = True


class ReferencePreprocessing(Preprocessing):
    """Preprocessing that also encodes the reference audio (models without an encoder stage)."""

    clones = True

    def conditioning(self, request: dict[str, Any]) -> dict[str, Any]:
        return encode_reference(request)


class ConditionedEngine(TtsEngine):
    """Engine that reports the reference conditioning it received (the single-speaker voice cannot apply it)."""

    def final_extras(self, prepared: PreparedRequest) -> dict[str, Any]:
        seconds = prepared.extras.get("reference_seconds")
        return {"conditioning": "reference" if seconds is not None else "default_voice", "reference_seconds": seconds}


# --- MOSS-TTS: PreparedRequestQueue ------------------------------------------------


class MossPreprocessing(ReferencePreprocessing):
    """Publishes the prepared request into the process-local PreparedRequestQueue; the payload carries a key."""

    def publish(self, payload: StagePayload, prepared: PreparedRequest) -> dict[str, Any]:
        PREPARED_REQUEST_QUEUE.put(payload.request_id, prepared)
        return {"prepared_key": payload.request_id}


class MossEngine(ConditionedEngine):
    """Pops its prepared request from the process-local PreparedRequestQueue."""

    def take(self, payload: StagePayload) -> PreparedRequest:
        return PREPARED_REQUEST_QUEUE.pop(str(payload.data.get("prepared_key", payload.request_id)), self.stage)


# --- Ming-Omni-TTS: shared prompt cache across three stages ------------------------


class MingPreprocessing(Preprocessing):
    """Caches the prepared prompt process-locally for reference_encode and the engine."""

    clones = True  # reference_encode, after it, encodes the reference into the cached prompt

    def publish(self, payload: StagePayload, prepared: PreparedRequest) -> dict[str, Any]:
        _MING_PROMPTS.put(payload.request_id, prepared)
        return {"prompt_key": payload.request_id}


class MingReferenceEncode(ReferenceEncoder):
    """Encodes the reference into the cached prompt entry in place; only the key travels on."""

    def __init__(self) -> None:
        super().__init__("reference_encode")

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        key = str(payload.data.get("prompt_key", payload.request_id))
        prepared: PreparedRequest = _MING_PROMPTS.get(key, self.stage)
        try:
            conditioning = await super().process(StagePayload(payload.request_id, payload.request, {}), ctx)
        except BaseException:
            # The request ends here; the engine will never pop its prompt.
            _MING_PROMPTS.discard(key)
            raise
        prepared.extras.update(conditioning or {})
        return {"prompt_key": key}


class MingEngine(ConditionedEngine):
    """Pops the prompt (with its reference encoding) from the process-local cache."""

    def take(self, payload: StagePayload) -> PreparedRequest:
        return _MING_PROMPTS.pop(str(payload.data.get("prompt_key", payload.request_id)), self.stage)


# --- Voxtral TTS: voice-prompt cache ------------------------------------------------


class VoxtralPreprocessing(ReferencePreprocessing):
    """Builds the voice prompt (reference encoding included) into the process-local cache."""

    def publish(self, payload: StagePayload, prepared: PreparedRequest) -> dict[str, Any]:
        _VOXTRAL_VOICE_PROMPTS.put(payload.request_id, prepared)
        return {"prompt_key": payload.request_id}


class VoxtralGeneration(ConditionedEngine):
    """Pops the voice prompt from the process-local cache."""

    def take(self, payload: StagePayload) -> PreparedRequest:
        return _VOXTRAL_VOICE_PROMPTS.pop(str(payload.data.get("prompt_key", payload.request_id)), self.stage)


# --- the table --------------------------------------------------------------------

_Factory = Callable[[], Any]


def _payload_model(encoder: str | None, front: Callable[[], Any] = PayloadPreprocessing) -> dict[str, _Factory]:
    stages: dict[str, _Factory] = {"preprocessing": front}
    if encoder:
        stages[encoder] = lambda: ReferenceEncoder(encoder)
    stages["tts_engine"] = ConditionedEngine
    stages["vocoder"] = Vocoder
    return stages


def _moss() -> dict[str, _Factory]:
    return {"preprocessing": MossPreprocessing, "tts_engine": MossEngine, "vocoder": Vocoder}


# Stage names in order, exactly as the model declarations (models/) name them.
MODELS: dict[str, dict[str, _Factory]] = {
    "higgs-tts": _payload_model("audio_encoder"),
    "fishaudio-s2-pro": _payload_model(None, ReferencePreprocessing),
    "voxtral-tts": {
        "preprocessing": VoxtralPreprocessing,
        "tts_generation": lambda: _with_stage(VoxtralGeneration(), "tts_generation"),
        "vocoder": Vocoder,
    },
    "ming-omni-tts": {
        "preprocessing": MingPreprocessing,
        "reference_encode": MingReferenceEncode,
        "tts_engine": MingEngine,
        "audio_decode": lambda: _with_stage(Vocoder(), "audio_decode"),
    },
    "moss-tts-local": _moss(),
    "moss-tts-local-split": _moss(),
    "moss-tts-delay": _moss(),
    "audar-tts": _payload_model("reference_encoder"),
    "zonos2": _payload_model("speaker_encode"),
}


def make(
    model: str,
    stage: str,
    model_path: str | None = None,
    gpu_id: int | list[int] | None = None,
    total_gpu_memory_fraction: float | None = None,
) -> Any:
    """Build the stand-in executor for `stage` of built-in `model`.

    The injected `model_path`, `gpu_id` and `total_gpu_memory_fraction` are
    accepted and ignored: the default voice runs on the CPU whatever GPU the
    placement assigned, and selects no weights by path.
    """
    if model not in MODELS:
        raise ValueError(f"no stand-in for model {model!r}; known models: {', '.join(MODELS)}")
    stages = MODELS[model]
    if stage not in stages:
        raise ValueError(f"model {model!r} has no stage {stage!r}; its stages: {', '.join(stages)}")
    return stages[stage]()
