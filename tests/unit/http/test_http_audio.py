"""Streaming audio encoders: each format decodes back (FFmpeg via PyAV) to the samples given, chunk by chunk."""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np
import pytest

from stagevisor.supervisor.http.audio import UNKNOWN_SIZE, FORMATS, Resampler, make_encoder, wav_file, wav_header

RATE = 22050


def tone(seconds: float) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * 220 * t) * 0.4 * 32767).astype("<i2").tobytes()


def encode(fmt: str, pcm: bytes, pieces: int = 8) -> list[bytes]:
    encoder = make_encoder(fmt, RATE)
    step = len(pcm) // pieces // 2 * 2
    out = [encoder.encode(pcm[i : i + step]) for i in range(0, len(pcm), step)]
    out.append(encoder.finish())
    return out


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "pcm"])
def test_each_format_decodes_to_the_duration_given(fmt):
    pcm = tone(2.0)
    data = b"".join(encode(fmt, pcm))
    with av.open(io.BytesIO(data), format={"opus": "ogg", "aac": "aac"}.get(fmt)) as container:
        frames = list(container.decode(audio=0))
    seconds = sum(f.samples for f in frames) / frames[0].sample_rate
    assert 2.0 - 0.01 <= seconds <= 2.0 + 0.12, seconds


@pytest.mark.parametrize("fmt", FORMATS)
def test_encoded_bytes_come_out_while_audio_goes_in(fmt):
    pieces = encode(fmt, tone(2.0))
    assert sum(1 for p in pieces[:-1] if p) >= len(pieces[:-1]) // 2, [len(p) for p in pieces]


def test_pcm_is_the_samples_and_wav_is_a_streaming_header_then_the_samples():
    pcm = tone(0.5)
    assert b"".join(encode("pcm", pcm)) == pcm
    wav = b"".join(encode("wav", pcm))
    assert wav[:44] == wav_header(RATE) and wav[44:] == pcm
    assert struct.unpack("<I", wav[40:44])[0] == UNKNOWN_SIZE == 0x7FFFF000  # SoX's "length unknown"
    assert struct.unpack("<I", wav[4:8])[0] == UNKNOWN_SIZE + 36
    assert wav_header(RATE, 100)[40:44] == struct.pack("<I", 100)


def test_a_whole_wav_file_has_exact_sizes_that_python_wave_reads():
    pcm = tone(0.5)
    with wave.open(io.BytesIO(wav_file(pcm, RATE))) as wav:
        assert (wav.getnframes(), wav.getframerate(), wav.readframes(10**6)) == (len(pcm) // 2, RATE, pcm)


@pytest.mark.parametrize("out_rate", [24000, 16000, 48000])
def test_the_resampler_keeps_duration_and_pitch_whatever_the_chunking(out_rate):
    t = np.arange(RATE) / RATE
    audio = np.sin(2 * np.pi * 440 * t).astype(np.float32) * 0.5
    whole = Resampler(RATE, out_rate)
    one = np.concatenate([whole.push(audio), whole.flush()])
    pieces = Resampler(RATE, out_rate)
    chunked = np.concatenate([*(pieces.push(audio[i : i + 1000]) for i in range(0, audio.size, 1000)), pieces.flush()])
    assert abs(one.size - out_rate) <= 2 and np.allclose(one, chunked, atol=1e-6)
    spectrum = np.abs(np.fft.rfft(one[out_rate // 10 : -out_rate // 10]))
    peak = np.argmax(spectrum) * out_rate / (2 * (spectrum.size - 1))
    assert abs(peak - 440) < 3, peak


def test_an_empty_stream_is_still_a_valid_header():
    assert make_encoder("wav", RATE).finish() == wav_header(RATE)
    assert make_encoder("pcm", RATE).finish() == b""


def test_opus_is_resampled_to_a_rate_opus_supports():
    encoder = make_encoder("opus", RATE)
    assert encoder.output_rate == 24000
    encoder.close()


def test_unknown_format_is_a_value_error():
    with pytest.raises(ValueError, match="one of mp3"):
        make_encoder("ogg", RATE)
