"""Qwen3-TTS's three stages: preprocessing -> tts_engine ~> vocoder, on qwen-tts's own model classes.

- `preprocessing` checks the request against the checkpoint, applies the chat
  template, tokenizes, encodes a cloned voice's reference (codes and speaker
  vector, kept for the next request with the same audio:
  stages/qwen3/references.py) and embeds the talker's prompt with the model
  its process's tts_engine loaded. The prompt stays in this process: it is published in the
  process-local `PREPARED_REQUESTS` registry and the payload carries only its key.
- `tts_engine` takes the prompt and runs the talker and code predictor step by
  step (stages/qwen3/steps.py), up to `max_streams` requests taking turns a
  step each (stages/qwen3/turns.py), streaming codec frames to the vocoder as they
  are made: `{"codes": int64 (frames, 16)}`, the first chunk after
  `first_chunk_frames` frames, then every `chunk_frames`; a cloned voice's first
  chunk also carries `"context"`, the reference's codes.
- `vocoder` decodes each chunk with the speech tokenizer's decoder after up to
  `left_context_frames` earlier frames and streams `{"audio": float32, "sample_rate": 24000}`.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stagevisor.stages.base import InvalidRequest, StageContext, StageError, StagePayload
from stagevisor.stages.prepared import ProcessLocalRegistry
from stagevisor.stages.qwen3.prompt import (
    REF_TAIL_TOKENS,
    ROLE_TOKENS,
    Prompt,
    Voice,
    assistant_text,
    build,
    instruction_text,
    reference_text,
)
from stagevisor.stages.qwen3.checkpoint import BASE, Checkpoint, CheckpointError
from stagevisor.stages.qwen3.decoding import DEFAULT_LEFT_CONTEXT, StreamingDecoder
from stagevisor.stages.qwen3.loading import LoadedModel, loaded_model
from stagevisor.stages.qwen3.request import (
    MAX_TEXT_CHARS,
    MIN_REFERENCE_SECONDS,
    Qwen3Request,
    Sampling,
    listed_voices,
    parse,
    sampling_defaults,
)
from stagevisor.stages.qwen3.steps import Outcome
from stagevisor.stages.qwen3.references import DEFAULT_CAPACITY as DEFAULT_CACHED_REFERENCES, ReferenceCache
from stagevisor.stages.qwen3.turns import Turns
from stagevisor.stages.reference import decode_reference_wav

# Module-level on purpose: the prompt's tensors never leave the process that embedded them.
PREPARED_REQUESTS = ProcessLocalRegistry("Qwen3-TTS prepared requests", ("preprocessing", "tts_engine"))
SAMPLE_RATE = 24000
FRAME_RATE = 12.5
log = logging.getLogger(__name__)
DEFAULT_MAX_STREAMS = 4
"""Requests the talker steps in turn (stage arg `max_streams`); later ones wait for a turn."""


@dataclass
class _Ended:
    """The last item of a request's frame queue: its generation ended, with this error if it failed."""

    error: BaseException | None


@dataclass
class Prepared:
    """A request ready for the talker: its prompt, sampling and seed."""

    prompt: Prompt
    sampling: Sampling
    seed: int


def non_streaming_text(checkpoint: Checkpoint) -> bool:
    """Whether the whole text goes into the prefill: the package's default per checkpoint type (Base: no)."""
    return checkpoint.kind != BASE


def warm_resampler() -> None:
    """librosa's first resample loads its resampling backend, about 1 s here: at build, not in the first request
    that clones a voice from reference audio at another rate than the speaker encoder's."""
    import librosa

    librosa.resample(y=np.zeros(480, np.float32), orig_sr=48000, target_sr=16000)


class Preprocessing:
    """Request -> talker prompt, published for the tts_engine of this process."""

    max_text_chars = MAX_TEXT_CHARS

    def __init__(
        self, checkpoint: Checkpoint, cached_references: int = DEFAULT_CACHED_REFERENCES, stage: str = "preprocessing"
    ) -> None:
        self.checkpoint = checkpoint
        self.stage = stage
        self.references = ReferenceCache(cached_references)
        self._defaults: Sampling | None = None
        if checkpoint.clones:
            warm_resampler()

    @property
    def voices(self) -> list[dict[str, Any]]:
        """The preset speakers (CustomVoice), else the one unnamed voice (not usable alone on a Base checkpoint);
        GET /v1/audio/voices lists them."""
        return listed_voices(self.checkpoint, SAMPLE_RATE)

    def _model(self) -> LoadedModel:
        loaded = loaded_model(self.checkpoint.directory)
        if loaded is None:
            raise StageError(
                f"stage {self.stage!r} embeds prompts with the Qwen3-TTS model its process's tts_engine loads, and "
                "no tts_engine in this process has loaded it: place preprocessing and tts_engine in the same process"
            )
        return loaded

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        loaded = self._model()
        if self._defaults is None:
            self._defaults = sampling_defaults(loaded.wrapper.generate_defaults)
        request = parse(payload.request, self.checkpoint, self._defaults)
        prepared = await asyncio.to_thread(self.prepare, loaded, request)
        PREPARED_REQUESTS.put(payload.request_id, prepared)
        return {"prepared_request": payload.request_id, "seed": prepared.seed}

    def prepare(self, loaded: LoadedModel, request: Qwen3Request) -> Prepared:
        voice = Voice(speaker=request.speaker)
        if request.reference_audio is not None:
            voice = self._clone(loaded, request)
        instruction_ids = None
        if request.instructions:
            instruction_ids = self._tokens(loaded, instruction_text(request.instructions))
        prompt = build(
            loaded.model,
            self._tokens(loaded, assistant_text(request.text)),
            request.language,
            voice,
            instruction_ids=instruction_ids,
            non_streaming=non_streaming_text(self.checkpoint),
        )
        seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(4), "little")
        return Prepared(prompt=prompt, sampling=request.sampling, seed=seed)

    def _tokens(self, loaded: LoadedModel, text: str) -> torch.Tensor:
        ids = loaded.wrapper.processor(text=text, return_tensors="pt", padding=True)["input_ids"].to(loaded.device)
        return ids.unsqueeze(0) if ids.dim() == 1 else ids

    def _clone(self, loaded: LoadedModel, request: Qwen3Request) -> Voice:
        wav = request.reference_audio or b""
        samples, rate = decode_reference_wav(wav)
        if samples.size < MIN_REFERENCE_SECONDS * rate:
            raise InvalidRequest(
                f"reference_audio is {samples.size / rate:.2f} s long; at least {MIN_REFERENCE_SECONDS:g} s of the "
                "voice are needed to clone it",
                code="QWEN3_REFERENCE_TOO_SHORT",
                field="reference_audio",
            )
        model = loaded.model

        def embed() -> torch.Tensor:
            import librosa

            target = int(model.speaker_encoder_sample_rate)
            resampled = samples if rate == target else librosa.resample(y=samples, orig_sr=rate, target_sr=target)
            return model.extract_speaker_embedding(audio=resampled.astype(np.float32), sr=target)

        def encode() -> torch.Tensor:
            return loaded.speech_tokenizer.encode(samples, sr=rate).audio_codes[0]

        reference = self.references.encoded(wav, request.in_context, embed, encode)
        if not request.in_context:
            return Voice(speaker_embedding=reference.speaker_embedding)
        return Voice(
            speaker_embedding=reference.speaker_embedding,
            reference_ids=self._tokens(loaded, reference_text(request.reference_transcript or ""))[
                :, ROLE_TOKENS:-REF_TAIL_TOKENS
            ],
            reference_codes=reference.codes,
        )


class TtsEngine:
    """Talker + code predictor in one step loop; streams codec frames in chunks as they are made."""

    def __init__(
        self,
        loaded: LoadedModel,
        first_chunk_frames: int = 1,
        chunk_frames: int = 25,
        max_streams: int = DEFAULT_MAX_STREAMS,
        stage: str = "tts_engine",
    ) -> None:
        if first_chunk_frames < 1 or chunk_frames < 1:
            raise ValueError("first_chunk_frames and chunk_frames must be >= 1")
        try:
            # Read here, at build, so a value the sampling cannot take fails the start, not every request.
            sampling_defaults(loaded.wrapper.generate_defaults)
        except ValueError as error:
            raise CheckpointError("QWEN3_BAD_CHECKPOINT", f"{str(loaded.checkpoint.directory)!r}: {error}") from None
        self.loaded = loaded
        self.first_chunk_frames = first_chunk_frames
        self.chunk_frames = chunk_frames
        self.stage = stage
        # One thread steps the talker for every request, so requests waiting for a turn hold no thread of the
        # loop's executor, where the vocoder's decode and preprocessing run.
        self.turns = Turns(loaded.talker, loaded.device, max_streams)

    def _take(self, payload: StagePayload) -> Prepared:
        return PREPARED_REQUESTS.pop(str(payload.data.get("prepared_request", payload.request_id)), self.stage)

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        prepared = self._take(payload)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        ended = loop.create_future()
        outcome = Outcome()

        def finish(error: BaseException | None) -> None:
            queue.put_nowait(_Ended(error))  # after every frame: both come through call_soon_threadsafe, in order
            ended.set_result(None)

        stop = self.turns.start(
            prepared.prompt,
            prepared.sampling,
            prepared.seed,
            outcome,
            lambda frame: loop.call_soon_threadsafe(queue.put_nowait, frame),
            lambda error: loop.call_soon_threadsafe(finish, error),
        )
        context = prepared.prompt.reference_codes
        pending: list[np.ndarray] = []
        target = self.first_chunk_frames
        try:
            while not isinstance(item := await queue.get(), _Ended):
                if ctx.cancelled:
                    stop()
                pending.append(item)
                if len(pending) >= target:
                    await ctx.stream(self._chunk(pending, context))
                    pending, context, target = [], None, self.chunk_frames
            if item.error is not None:
                raise item.error
            if pending:
                await ctx.stream(self._chunk(pending, context))
        finally:
            stop()
            # The talker is free for the next request when this returns, even if this task was cancelled.
            await asyncio.shield(ended)
        if outcome.stopped == "max_new_tokens":
            # The client's stream ends as after EOS (qwen-tts's generate() returns such codes as silently): only
            # this line tells the operator why the audio was cut off.
            log.warning(
                "request %s reached max_new_tokens=%d before the talker ended its speech: its audio is cut off "
                "after %d frames (%.1f s)",
                payload.request_id,
                prepared.sampling.max_new_tokens,
                outcome.frames,
                outcome.frames / FRAME_RATE,
            )
        return {"frames": outcome.frames, "stopped": outcome.stopped, "seed": prepared.seed}

    @staticmethod
    def _chunk(pending: list[np.ndarray], context: torch.Tensor | None) -> dict[str, Any]:
        chunk: dict[str, Any] = {"codes": np.stack(pending).astype(np.int64)}
        if context is not None:
            chunk["context"] = context.cpu().numpy().astype(np.int64)
        return chunk


class Vocoder:
    """Speech-tokenizer decoder, chunk by chunk with left context: streams 24 kHz PCM."""

    def __init__(self, tokenizer: Any, left_context_frames: int = DEFAULT_LEFT_CONTEXT) -> None:
        if left_context_frames < 0:
            # Checked here, at build: StreamingDecoder would refuse it only per request, on a READY stage.
            raise ValueError(f"left_context_frames must be >= 0, got {left_context_frames}")
        self.tokenizer = tokenizer
        self.left_context_frames = left_context_frames
        self.sample_rate = int(tokenizer.model.get_output_sample_rate())

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        decoder = StreamingDecoder(self.tokenizer, self.left_context_frames)
        samples = 0
        async for chunk in ctx.chunks():
            if not isinstance(chunk, dict) or "codes" not in chunk:
                raise StageError(
                    "vocoder received a chunk without 'codes'; its upstream must be the Qwen3-TTS tts_engine"
                )
            if chunk.get("context") is not None:
                decoder.prime(chunk["context"])
            audio = await asyncio.to_thread(decoder.push, chunk["codes"])
            samples += len(audio)
            await ctx.stream({"audio": audio, "sample_rate": self.sample_rate})
        return {"samples": samples, "sample_rate": self.sample_rate}


def reference_wav(samples: np.ndarray, rate: int) -> bytes:
    """16-bit PCM WAV bytes of float samples (for clients and tests that send a reference voice)."""
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


__all__ = ["Preprocessing", "TtsEngine", "Vocoder", "PREPARED_REQUESTS", "reference_wav"]
