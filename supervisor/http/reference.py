"""Reference audio from clients (uploaded voices, `ref_audio`): format checks, limits, one WAV form for stages.

Stages receive reference audio as a 16-bit mono PCM WAV file (what
stages/reference.py and the Qwen3-TTS executors read), whatever the client
sent: WAV is checked and rewritten, FLAC, MP3 and Ogg (Vorbis/Opus) are
decoded by FFmpeg through PyAV. Every format takes the same sample rates
(MIN_SAMPLE_RATE to MAX_SAMPLE_RATE, as stages/reference.py over gRPC); audio above the gRPC service's
MAX_REFERENCE_SAMPLE_RATE is resampled to it, so that the WAV file stays
within what a request may carry (30 s of compressed 192 kHz audio is 11 MB as
16-bit WAV, twice that limit). Anything else, a file FFmpeg cannot decode, or
one outside the limits is a BadReference naming what is wrong.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import wave

import numpy as np

from stagevisor.stages.reference import frames_within, rate_problem, seconds_over
from stagevisor.supervisor.dataplane.synthesis import MAX_REFERENCE_SAMPLE_RATE

MAX_REFERENCE_BYTES = 3 * 1024 * 1024
"""Largest reference file accepted over HTTP (docs/api/http.md). Not the gRPC service's limit, which takes up to
60 s of raw 16-bit audio (dataplane.synthesis.MAX_REFERENCE_AUDIO_BYTES); HTTP's file may be compressed, and
holds at most MAX_REFERENCE_SECONDS once decoded."""
MAX_REFERENCE_SECONDS = 30.0
"""Longest reference accepted: cloning models use a few seconds to about half a minute."""
MIN_REFERENCE_SECONDS = 0.5
ACCEPTED_CONTAINERS = {"wav": "wav", "flac": "flac", "mp3": "mp3", "ogg": "ogg"}
"""FFmpeg demuxer names accepted -> the format named in errors and listings."""
_PCM_KINDS = {1: ("u1", 128.0, 128.0), 2: ("<i2", 0.0, 32768.0), 4: ("<i4", 0.0, 2147483648.0)}
"""Integer PCM sample width in bytes -> (numpy dtype, offset, scale) to floats in [-1, 1]."""
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[\w.+-]+)*;base64,(?P<data>.*)$", re.DOTALL)


class BadReference(ValueError):
    """Unusable reference audio; `code` is the API error code."""

    def __init__(self, message: str, code: str = "invalid_audio") -> None:
        super().__init__(message)
        self.code = code


def decode_base64_audio(text: str) -> bytes:
    """`ref_audio` as base64 or a `data:audio/...;base64,` URL -> the file's bytes."""
    match = _DATA_URL.match(text)
    if text.startswith("data:") and match is None:
        raise BadReference("ref_audio is a data URL but not a base64 one (data:audio/wav;base64,...)")
    payload = match.group("data") if match else text
    if len(payload) > MAX_REFERENCE_BYTES * 4 // 3 + 4:
        raise BadReference(f"ref_audio is larger than {MAX_REFERENCE_BYTES} bytes", code="audio_too_large")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise BadReference("ref_audio is not valid base64 (nor a data:...;base64, URL)") from None


def normalize_reference(data: bytes) -> tuple[bytes, float]:
    """Any accepted audio file -> (16-bit mono PCM WAV bytes at its own rate, seconds)."""
    if len(data) > MAX_REFERENCE_BYTES:
        raise BadReference(
            f"the audio is {len(data)} bytes; at most {MAX_REFERENCE_BYTES} are accepted", code="audio_too_large"
        )
    if not data:
        raise BadReference("the audio is empty")
    pcm = _read_pcm_wav(data) if data[:4] == b"RIFF" else None
    samples, rate = pcm if pcm is not None else _decode_with_ffmpeg(data)
    seconds = samples.size / rate
    if seconds > MAX_REFERENCE_SECONDS:
        raise BadReference(
            f"the audio is {seconds_over(seconds, MAX_REFERENCE_SECONDS)} s long; "
            f"at most {MAX_REFERENCE_SECONDS:g} s are accepted",
            code="audio_too_long",
        )
    if seconds < MIN_REFERENCE_SECONDS:
        raise BadReference(
            f"the audio is {seconds:.2f} s long; at least {MIN_REFERENCE_SECONDS:g} s are needed",
            code="audio_too_short",
        )
    if rate > MAX_REFERENCE_SAMPLE_RATE:
        import soxr

        samples, rate = soxr.resample(samples, rate, MAX_REFERENCE_SAMPLE_RATE), MAX_REFERENCE_SAMPLE_RATE
    return wav_bytes(samples, rate), seconds


def _check_rate(rate: int) -> None:
    """BadReference unless `rate` (Hz) is one accepted, whatever the file's format (the stages' rule)."""
    problem = rate_problem(rate)
    if problem:
        raise BadReference(f"the audio's sample rate is {problem}")


def stored_rate_problem(rate: int) -> str | None:
    """What is wrong with reference audio kept at `rate` Hz, to follow "its audio" (None: nothing): what
    normalize_reference keeps is at a rate rate_problem takes and at most MAX_REFERENCE_SAMPLE_RATE (resampled
    when higher), so that every request carrying it fits the gRPC service's limit. An uploaded voice stored before
    either check is held to it when read back (voices.stored_voice_problem)."""
    problem = rate_problem(rate)
    if problem:
        return f"has a sample rate of {problem}"
    if rate > MAX_REFERENCE_SAMPLE_RATE:
        return (
            f"is kept at {rate} Hz, above the {MAX_REFERENCE_SAMPLE_RATE} Hz a request carries (an upload is "
            "resampled to it now)"
        )
    return None


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """float samples in [-1, 1] -> a 16-bit mono PCM WAV file."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return out.getvalue()


def _read_pcm_wav(data: bytes) -> tuple[np.ndarray, int] | None:
    """An 8, 16 or 32-bit integer PCM WAV file -> (mono float samples, rate); None for a WAV file of another
    sample format (float, 24-bit, A-law, ...), which FFmpeg decodes."""
    try:
        with wave.open(io.BytesIO(data), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            if width not in _PCM_KINDS:
                return None
            _check_rate(rate)  # before reading: frames_within reads up to MAX_REFERENCE_SECONDS at this rate
            # What the file holds counts, not its header's length (stagevisor's own streamed WAV gives none).
            raw, too_long = frames_within(wav, len(data), MAX_REFERENCE_SECONDS)
            if too_long:
                raise BadReference(
                    f"the audio {too_long}; at most {MAX_REFERENCE_SECONDS:g} s are accepted", code="audio_too_long"
                )
    except wave.Error as error:
        if str(error).startswith("unknown format"):  # wave reads integer PCM only
            return None
        raise BadReference(f"not a valid WAV file: {error}") from None
    except EOFError:  # wave's, with no text, for a file cut off inside its header
        raise BadReference("not a complete WAV file: it ends inside its header") from None
    dtype, offset, scale = _PCM_KINDS[width]
    samples = (np.frombuffer(raw[: len(raw) - len(raw) % (width * channels)], dtype=dtype) - offset) / scale
    return samples.reshape(-1, channels).mean(axis=1).astype(np.float32), rate


def _decode_with_ffmpeg(data: bytes) -> tuple[np.ndarray, int]:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            kind = next(
                (ACCEPTED_CONTAINERS[n] for n in container.format.name.split(",") if n in ACCEPTED_CONTAINERS), None
            )
            if kind is None or not container.streams.audio:
                raise BadReference(
                    f"audio of format {container.format.name!r} is not accepted; send WAV, FLAC, MP3 or Ogg",
                    code="unsupported_audio_format",
                )
            stream = container.streams.audio[0]
            rate = stream.rate or 0
            _check_rate(rate)  # before decoding, as for WAV
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            pieces: list[np.ndarray] = []
            total = 0
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    piece = out.to_ndarray().reshape(-1)
                    pieces.append(piece)
                    total += piece.size
                if total > MAX_REFERENCE_SECONDS * rate:
                    raise BadReference(
                        f"the audio is longer than {MAX_REFERENCE_SECONDS:g} s, the limit", code="audio_too_long"
                    )
    except BadReference:
        raise
    except (av.error.FFmpegError, ValueError, StopIteration) as error:
        raise BadReference(
            f"the file is not audio FFmpeg can decode ({type(error).__name__}); send WAV, FLAC, MP3 or Ogg",
            code="unsupported_audio_format",
        ) from None
    if not rate or not pieces:
        raise BadReference("the file holds no audio samples")
    return np.concatenate(pieces).astype(np.float32), rate
