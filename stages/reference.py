"""Reference audio: decoding the client's WAV and the stand-in speaker/reference encoder stage.

Models that clone a voice encode the client's reference audio in a stage of
their own (Higgs-TTS audio_encoder, Ming-Omni-TTS reference_encode, Audar-TTS
reference_encoder, Zonos2 speaker_encode). The stand-in encoder does real work
on the reference: it decodes the WAV and computes a small deterministic
embedding (mean log energy in mel-spaced bands). The embedded voice has a
single speaker and cannot be conditioned, so the engine carries the embedding
and reports it but the audio does not change; with no reference the stage
passes the payload through untouched.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import wave
from typing import Any

import numpy as np

from stagevisor.stages.base import InvalidRequest, StageContext, StagePayload

EMBEDDING_DIM = 16
MAX_REFERENCE_SECONDS = 60.0
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
"""Sample rates a reference may have, over gRPC as over HTTP (supervisor/http/reference.py)."""
_FRAME = 1024
_HOP = 512


def seconds_over(seconds: float, limit: float) -> str:
    """`seconds`, which is over `limit`, rounded no further than it takes to still read as over it ("30.0001",
    not "30.0" beside a limit of 30)."""
    for digits in range(1, 7):
        shown = f"{seconds:.{digits}f}"
        if float(shown) > limit:
            return shown
    return repr(seconds)


def frames_within(wav: wave.Wave_read, file_size: int, seconds: float) -> tuple[bytes, str]:
    """At most `seconds` of an open WAV file's frames, as many as the file holds (its header's length may be the
    "unknown" 0xFFFFFFFF of a WAV streamed as it was made, or more than a cut-off file holds): (the frames, ""), or
    (b"", how long it is, in words) when it holds more than `seconds`."""
    channels, width, rate, count = wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()
    limit = int(seconds * rate)
    raw = wav.readframes(min(count, limit + 1))
    if len(raw) // max(1, width * channels) <= limit:
        return raw, ""
    if count * width * channels > file_size:
        return b"", "runs past the limit"
    return b"", f"is {seconds_over(count / rate, seconds)} s long"


WAVE_FORMATS = {
    "3": "float samples (WAVE format 3)",
    "6": "A-law samples (WAVE format 6)",
    "7": "mu-law samples (WAVE format 7)",
    "65534": "samples of an extensible format (WAVE format 65534) it cannot read",
}
"""WAVE format tags Python's wave module refuses ("unknown format: 3"), named for the client."""
CONVERT = (
    "convert it to 16-bit PCM (`ffmpeg -i IN -c:a pcm_s16le out.wav`), or send it over HTTP, which decodes other "
    "formats"
)
"""What to do with a reference this reader does not take."""
RESAMPLE = "resample it (`ffmpeg -i IN -ar 24000 -c:a pcm_s16le out.wav`)"


REFERENCE_UNREADABLE = "REFERENCE_UNREADABLE"
"""The code of an InvalidRequest for reference audio this reader does not take (not a WAV file, not PCM, no
samples, a sample rate out of range): HTTP's `invalid_audio`."""
REFERENCE_TOO_LONG = "REFERENCE_TOO_LONG"
"""The code of an InvalidRequest for reference audio over MAX_REFERENCE_SECONDS: HTTP's `audio_too_long`."""
REFERENCE_FIELD = "reference_audio"
"""The request field these refusals name (StageError's `field`; HTTP's `param` names it `ref_audio`)."""


def rate_problem(rate: int) -> str | None:
    """What is wrong with a reference at `rate` Hz, to follow "sample rate of" (None: it is taken), one rule over
    gRPC (here) and HTTP (supervisor/http/reference.py), whatever the file's format."""
    if MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        return None
    return f"{rate} Hz; {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} are accepted: {RESAMPLE}"


def decode_reference_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A PCM WAV file -> (float32 mono samples in [-1, 1], sample rate); InvalidRequest if unusable."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            problem = rate_problem(rate)
            if problem:
                # A header of 1 Hz was cloned from (60 samples); one of 4294967295 Hz failed the request in the daemon.
                raise InvalidRequest(
                    f"reference_audio has a sample rate of {problem}", code=REFERENCE_UNREADABLE, field=REFERENCE_FIELD
                )
            raw, too_long = frames_within(wav, len(data), MAX_REFERENCE_SECONDS)
            if too_long:
                raise InvalidRequest(
                    f"reference_audio {too_long}; at most {MAX_REFERENCE_SECONDS:g} s are accepted",
                    code=REFERENCE_TOO_LONG,
                    field=REFERENCE_FIELD,
                )
    except (wave.Error, EOFError) as exc:
        why = str(exc) or "it ends inside its header"  # wave's EOFError (a file cut off there) has no text
        kind = WAVE_FORMATS.get(why.removeprefix("unknown format: "), "") if why.startswith("unknown format") else ""
        if kind:  # a WAV file, of samples this reader does not take: say which and how to convert it
            raise InvalidRequest(
                f"reference_audio must be a PCM WAV file; this one holds {kind}: {CONVERT}",
                code=REFERENCE_UNREADABLE,
                field=REFERENCE_FIELD,
            ) from None
        if why == "file does not start with RIFF id":  # another format altogether (MP3, FLAC, Ogg)
            raise InvalidRequest(
                f"reference_audio must be a PCM WAV file; this one is no WAV file: {CONVERT}",
                code=REFERENCE_UNREADABLE,
                field=REFERENCE_FIELD,
            ) from None
        raise InvalidRequest(
            f"reference_audio must be a PCM WAV file: {why}", code=REFERENCE_UNREADABLE, field=REFERENCE_FIELD
        ) from None
    if width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 4:
        samples = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    else:
        raise InvalidRequest(
            f"reference_audio uses {8 * width}-bit samples; 8, 16 or 32-bit PCM is accepted: {CONVERT}",
            code=REFERENCE_UNREADABLE,
            field=REFERENCE_FIELD,
        )
    samples = samples[: len(samples) - len(samples) % channels].reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise InvalidRequest("reference_audio contains no samples", code=REFERENCE_UNREADABLE, field=REFERENCE_FIELD)
    return samples.astype(np.float32), rate


def speaker_embedding(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """A unit-norm float32 vector of EMBEDDING_DIM mean log band energies; deterministic."""
    if samples.size < _FRAME:
        samples = np.pad(samples, (0, _FRAME - samples.size))
    starts = np.arange(0, samples.size - _FRAME + 1, _HOP)
    frames = samples[starts[:, None] + np.arange(_FRAME)] * np.hanning(_FRAME).astype(np.float32)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    freqs = np.fft.rfftfreq(_FRAME, 1.0 / sample_rate)
    # Band edges evenly spaced on the mel scale up to Nyquist.
    mel_max = 2595.0 * np.log10(1.0 + (sample_rate / 2) / 700.0)
    edges = 700.0 * (10 ** (np.linspace(0.0, mel_max, EMBEDDING_DIM + 1) / 2595.0) - 1.0)
    bands = np.stack(
        [power[:, (freqs >= lo) & (freqs < hi)].sum(axis=1) for lo, hi in itertools.pairwise(edges)], axis=1
    )
    vector = np.log(bands.mean(axis=0) + 1e-10)
    vector -= vector.mean()
    norm = np.linalg.norm(vector)
    return (vector / norm if norm > 0 else vector).astype(np.float32)


def encode_reference(request: dict[str, Any]) -> dict[str, Any]:
    """The reference conditioning for a request: {} without reference audio, else the embedding and facts."""
    data = request.get("reference_audio") or b""
    if not data:
        return {}
    samples, rate = decode_reference_wav(bytes(data))
    return {
        "speaker_embedding": speaker_embedding(samples, rate),
        "reference_seconds": round(samples.size / rate, 3),
        "reference_transcript": str(request.get("reference_transcript") or ""),
    }


class ReferenceEncoder:
    """Stand-in speaker/reference encoder stage: adds the reference embedding to the payload's data."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        conditioning = await asyncio.to_thread(encode_reference, payload.request)
        return {**payload.data, **conditioning}
