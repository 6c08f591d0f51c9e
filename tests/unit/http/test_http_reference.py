"""Reference audio from clients: every WAV sample format a recorder writes is read, a broken file says why."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

from stagevisor.supervisor.http.reference import BadReference, normalize_reference

RATE = 16000


def tone(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def riff(fmt_tag: int, bits: int, payload: bytes, channels: int = 1) -> bytes:
    """A WAV file with a plain fmt chunk of `fmt_tag` (1 integer PCM, 3 IEEE float)."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, RATE, RATE * align, align, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def samples_of(wav_file: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav_file), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, RATE)
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float32) / 32767


def test_integer_pcm_wav_is_read_as_it_was():
    samples = tone()
    out, seconds = normalize_reference(riff(1, 16, (samples * 32767).astype("<i2").tobytes()))
    assert seconds == pytest.approx(1.0)
    np.testing.assert_allclose(samples_of(out), samples, atol=2e-4)


@pytest.mark.parametrize(
    ("fmt_tag", "bits", "encode"),
    [
        (3, 32, lambda s: s.astype("<f4").tobytes()),
        (1, 24, lambda s: b"".join(int(v).to_bytes(3, "little", signed=True) for v in (s * 8388607).astype(int))),
    ],
    ids=["float32", "24-bit"],
)
def test_a_wav_of_another_sample_format_is_decoded_by_ffmpeg_to_the_same_samples(fmt_tag, bits, encode):
    # wave reads integer PCM of 8, 16 or 32 bits only: a float WAV was refused with "unknown format: 3".
    samples = tone()
    out, seconds = normalize_reference(riff(fmt_tag, bits, encode(samples)))
    assert seconds == pytest.approx(1.0)
    np.testing.assert_allclose(samples_of(out), samples, atol=2e-4)


def test_a_wav_cut_off_inside_its_header_says_so():
    whole = riff(1, 16, (tone() * 32767).astype("<i2").tobytes())
    with pytest.raises(BadReference, match=r"ends inside its header$"):
        normalize_reference(whole[:30])


def test_a_wav_streamed_without_its_length_is_read_to_its_end():
    """stagevisor's own streamed WAV (http.audio.wav_header: length unknown, 0xFFFFFFFF) was refused as 44739.2 s
    long when uploaded back as a voice; what the file holds counts, and only that is held to the limit."""
    from stagevisor.supervisor.http.audio import wav_header
    from stagevisor.supervisor.http.reference import MAX_REFERENCE_SECONDS

    samples = tone(2.0)
    streamed = wav_header(RATE) + (samples * 32767).astype("<i2").tobytes()
    out, seconds = normalize_reference(streamed)
    assert seconds == pytest.approx(2.0)
    np.testing.assert_allclose(samples_of(out), samples, atol=2e-4)
    too_long = wav_header(RATE) + bytes(2 * int(RATE * (MAX_REFERENCE_SECONDS + 1)))
    with pytest.raises(BadReference, match=r"^the audio runs past the limit; at most 30 s are accepted$") as caught:
        normalize_reference(too_long)
    assert caught.value.code == "audio_too_long"


def test_a_wav_longer_than_the_limit_says_how_long_it_is():
    from stagevisor.supervisor.http.reference import MAX_REFERENCE_SECONDS

    with pytest.raises(BadReference, match=r"^the audio is 31.0 s long; at most 30 s are accepted$"):
        normalize_reference(riff(1, 16, bytes(2 * int(RATE * (MAX_REFERENCE_SECONDS + 1)))))


@pytest.mark.parametrize("extra_samples, shown", [(1, "30.0001"), (int(RATE * 0.04), "30.04")])
def test_a_wav_just_over_the_limit_is_not_said_to_be_as_long_as_the_limit(extra_samples, shown):
    """One sample over 30 s read "the audio is 30.0 s long; at most 30 s are accepted": the length shown is
    rounded no further than it takes to be over the limit."""
    from stagevisor.supervisor.http.reference import MAX_REFERENCE_SECONDS

    samples = int(RATE * MAX_REFERENCE_SECONDS) + extra_samples
    with pytest.raises(BadReference, match=rf"^the audio is {shown}\d* s long; at most 30 s are accepted$"):
        normalize_reference(riff(1, 16, bytes(2 * samples)))


def flac(samples: np.ndarray, rate: int) -> bytes:
    """A mono 16-bit FLAC file of `samples` (floats in [-1, 1]) at `rate`, as FFmpeg writes it."""
    import av

    out = io.BytesIO()
    with av.open(out, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        stream.codec_context.format = "s16"
        pcm = (samples * 32767).astype("<i2")
        for start in range(0, pcm.size, 4096):
            frame = av.AudioFrame.from_ndarray(pcm[None, start : start + 4096], format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()


def test_a_long_compressed_reference_at_a_high_rate_fits_what_a_synthesis_request_carries():
    """29 s of FLAC at 192 kHz is a small upload, but was stored as 11 MB of 16-bit WAV at 192 kHz: the voice was
    listed as usable and every request naming it got 400 `reference audio is 11136044 bytes; the limit is 5764096`.
    Audio above the gRPC service's rate is resampled to it."""
    from stagevisor.supervisor.dataplane.synthesis import MAX_REFERENCE_AUDIO_BYTES, MAX_REFERENCE_SAMPLE_RATE

    rate = 192000
    t = np.arange(rate * 29) / rate
    out, seconds = normalize_reference(flac((0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate))
    assert seconds == pytest.approx(29.0)
    assert len(out) <= MAX_REFERENCE_AUDIO_BYTES
    with wave.open(io.BytesIO(out), "rb") as wav:
        assert wav.getframerate() == MAX_REFERENCE_SAMPLE_RATE
        assert wav.getnframes() == pytest.approx(29 * MAX_REFERENCE_SAMPLE_RATE, abs=2)


@pytest.mark.parametrize("rate", [1000, 4000, 384000])
@pytest.mark.parametrize("kind", ["wav", "flac"])
def test_every_format_takes_the_same_sample_rates(kind, rate):
    """A WAV file at 4 kHz was refused while a FLAC file at 1 kHz or 384 kHz was stored: the rule is one."""
    samples = np.zeros(rate, dtype=np.float32)
    data = (
        flac(samples, rate)
        if kind == "flac"
        else riff(1, 16, bytes(2 * rate)).replace(
            struct.pack("<II", RATE, 2 * RATE), struct.pack("<II", rate, 2 * rate), 1
        )
    )
    with pytest.raises(BadReference, match=rf"^the audio's sample rate is {rate} Hz; 8000 to 192000 are accepted"):
        normalize_reference(data)


@pytest.mark.parametrize("rate", [8000, 44100])
def test_a_reference_at_an_ordinary_rate_keeps_it(rate):
    out, seconds = normalize_reference(flac(np.zeros(rate, dtype=np.float32), rate))
    assert seconds == pytest.approx(1.0)
    with wave.open(io.BytesIO(out), "rb") as wav:
        assert wav.getframerate() == rate
