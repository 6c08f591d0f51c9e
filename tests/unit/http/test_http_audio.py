"""Streaming audio encoders: each format decodes back (FFmpeg via PyAV) to the samples given, chunk by chunk."""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np
import pytest

from stagevisor.supervisor.http.audio import (
    FORMATS,
    MEDIA_TYPES,
    UNKNOWN_SIZE,
    Resampler,
    make_encoder,
    wav_file,
    wav_header,
)

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


@pytest.mark.parametrize("rate", [24000, 44100])
@pytest.mark.parametrize("pcm", [b"", b"\x00\x01"], ids=["nothing", "one-sample"])
@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_a_stream_with_no_audio_or_too_little_to_encode_still_opens_in_a_decoder(fmt, pcm, rate):
    """MP3 and AAC were 0 bytes and Ogg Opus its headers alone (also one sample at 44.1 kHz, which the resampler
    to 48 kHz turns into none): FFmpeg opens none of them. They carry the codec's shortest silence instead; FLAC
    keeps its empty stream."""
    encoder = make_encoder(fmt, rate)
    data = encoder.encode(pcm) + encoder.finish()
    with av.open(io.BytesIO(data)) as container:
        out_rate = container.streams.audio[0].rate
        samples = sum(frame.samples for frame in container.decode(audio=0))
    assert samples / out_rate <= 0.1
    if fmt == "flac" and not pcm:
        assert samples == 0


def test_opus_is_resampled_to_a_rate_opus_supports():
    encoder = make_encoder("opus", RATE)
    assert encoder.output_rate == 24000
    encoder.close()


def test_unknown_format_is_a_value_error():
    with pytest.raises(ValueError, match="one of mp3"):
        make_encoder("ogg", RATE)


@pytest.mark.parametrize("rate", [8000, 22050, 48000])
def test_the_wav_header_describes_16_bit_mono_pcm_at_the_rate_given(rate):
    header = wav_header(rate, 1000)
    assert len(header) == 44
    assert (header[:4], header[8:12], header[12:16], header[36:40]) == (b"RIFF", b"WAVE", b"fmt ", b"data")
    assert struct.unpack("<I", header[4:8])[0] == 36 + 1000
    size, pcm_format, channels, frame_rate, byte_rate, block_align, bits = struct.unpack("<IHHIIHH", header[16:36])
    assert (size, pcm_format, channels, frame_rate, bits) == (16, 1, 1, rate, 16)
    assert (byte_rate, block_align) == (rate * 2, 2)


def test_a_streaming_wav_sends_its_header_once_before_the_first_samples():
    encoder = make_encoder("wav", RATE)
    assert encoder.encode(b"\x01\x00") == wav_header(RATE) + b"\x01\x00"
    assert encoder.encode(b"\x02\x00") == b"\x02\x00"
    assert encoder.finish() == b""


@pytest.mark.parametrize("rate, expected", [(96000, 48000), (16000, 16000), (11025, 12000), (4000, 8000)])
def test_opus_takes_a_rate_it_supports_as_is_else_the_next_one_up_else_its_highest(rate, expected):
    encoder = make_encoder("opus", rate)
    try:
        assert (encoder.sample_rate, encoder.output_rate) == (rate, expected)
    finally:
        encoder.close()


def test_an_encoder_closed_twice_or_finished_after_closing_gives_nothing_more():
    encoder = make_encoder("mp3", RATE)
    assert encoder.output_rate == RATE
    assert encoder.encode(b"") == b""
    encoder.close()
    encoder.close()
    assert encoder.finish() == b""


def test_a_finished_encoder_is_not_finished_again_and_closing_it_is_harmless():
    encoder = make_encoder("flac", RATE)
    encoder.encode(tone(0.2))
    assert encoder.finish()
    assert encoder.finish() == b""
    encoder.close()


def test_pcm_and_wav_encode_on_the_event_loop_and_codecs_off_it():
    assert not make_encoder("pcm", RATE).threaded and not make_encoder("wav", RATE).threaded
    encoder = make_encoder("aac", RATE)
    assert encoder.threaded
    encoder.close()


def test_each_format_has_its_media_type():
    assert {fmt: MEDIA_TYPES[fmt] for fmt in FORMATS} == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
    }


def test_the_audio_module_loads_without_pyav(monkeypatch):
    import importlib.util
    import sys

    from stagevisor.supervisor.http import audio

    monkeypatch.delitem(sys.modules, "av")
    spec = importlib.util.spec_from_file_location("audio_without_pyav", audio.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a fresh copy: the package's own module stays as it is
    assert "av" not in sys.modules
    assert module.make_encoder("wav", RATE).encode(b"\x01\x00")[-2:] == b"\x01\x00"


def test_an_encoder_closed_before_it_finished_writes_nothing_more_not_even_a_header():
    encoder = make_encoder("flac", RATE)
    encoder.close()
    assert encoder.finish() == b""
    unclosed = make_encoder("flac", RATE)
    assert unclosed.finish().startswith(b"fLaC")  # what a finished empty stream holds


@pytest.mark.parametrize("in_rate, out_rate", [(16000, 32000), (22050, 24000), (24000, 16000), (48000, 24000)])
def test_a_second_of_audio_resampled_and_flushed_is_exactly_a_second_at_the_new_rate(in_rate, out_rate):
    resampler = Resampler(in_rate, out_rate)
    audio = np.sin(np.arange(in_rate) / 10).astype(np.float32) * 0.5
    assert resampler.push(audio).size + resampler.flush().size == out_rate


def test_closing_an_encoder_whose_stream_cannot_be_closed_cleanly_does_not_raise(monkeypatch):
    opened = []

    class ClosingFails:
        """The real container, except that closing it fails as a muxer writing its trailer might."""

        def __init__(self, container) -> None:
            self.container = container

        def __getattr__(self, name):
            return getattr(self.container, name)

        def close(self) -> None:
            self.container.close()
            raise av.error.FFmpegError(5, "the trailer could not be written")

    real_open = av.open

    def open_failing_on_close(*args, **kwargs):
        opened.append(ClosingFails(real_open(*args, **kwargs)))
        return opened[-1]

    monkeypatch.setattr(av, "open", open_failing_on_close)
    encoder = make_encoder("flac", RATE)
    encoder.encode(tone(0.1))
    encoder.close()
    assert opened and encoder.finish() == b""


@pytest.mark.parametrize("rate", [22050, 44100])
def test_opus_resampled_from_a_rate_it_cannot_take_keeps_every_sample_to_the_end(rate):
    # the codec's resampler holds the last few samples until the stream is finished
    t = np.arange(rate) / rate
    pcm = (np.sin(2 * np.pi * 220 * t) * 0.4 * 32767).astype("<i2").tobytes()
    encoder = make_encoder("opus", rate)
    step = rate // 5 * 2
    data = b"".join(encoder.encode(pcm[i : i + step]) for i in range(0, len(pcm), step)) + encoder.finish()
    with av.open(io.BytesIO(data), format="ogg") as container:
        frames = list(container.decode(audio=0))
    assert encoder.output_rate != rate
    assert sum(f.samples for f in frames) == frames[0].sample_rate  # one second, to the sample


def test_the_resampler_keeps_a_tone_near_the_top_of_the_band_faithful():
    # 9 kHz: below both Nyquist rates; soxr's HQ filter is within 2e-4 of it, its lower qualities 1e-2 or worse
    in_rate, out_rate, freq = 22050, 24000, 9000
    resampler = Resampler(in_rate, out_rate)
    tone_in = np.sin(2 * np.pi * freq * np.arange(in_rate) / in_rate).astype(np.float32)
    out = np.concatenate([resampler.push(tone_in), resampler.flush()])
    ideal = np.sin(2 * np.pi * freq * np.arange(out.size) / out_rate)
    steady = slice(1000, out.size - 1000)  # away from the filter's start and end
    assert np.max(np.abs(out[steady] - ideal[steady])) < 2e-3


def test_the_same_audio_encoded_twice_as_opus_gives_the_same_bytes():
    pcm = tone(0.5)
    assert b"".join(encode("opus", pcm)) == b"".join(encode("opus", pcm))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_each_codec_stream_is_mono(fmt):
    data = b"".join(encode(fmt, tone(0.5)))
    with av.open(io.BytesIO(data), format={"opus": "ogg", "aac": "aac"}.get(fmt)) as container:
        assert container.streams.audio[0].codec_context.channels == 1


@pytest.mark.parametrize("fmt, magic", [("flac", b"fLaC"), ("opus", b"OggS")])
def test_the_first_piece_of_audio_comes_back_encoded_at_once_behind_the_stream_header(fmt, magic):
    encoder = make_encoder(fmt, RATE)
    try:
        assert encoder.encode(tone(0.5)).startswith(magic)
    finally:
        encoder.close()


@pytest.mark.parametrize("fmt", ["mp3", "flac"])
def test_closing_an_encoder_while_a_thread_encodes_frees_the_codec_only_once_that_chunk_is_done(fmt, monkeypatch):
    """A client that leaves mid-chunk: the stream closes on the event loop while the chunk encodes in a thread.

    1. a thread encodes a chunk; the muxer holds it mid-write
    2. the encoder is closed meanwhile: the container must not be closed under the muxer (FFmpeg crashed)
    3. the chunk's write ends: the container is closed then, once
    """
    import threading

    muxing, let_go = threading.Event(), threading.Event()
    events: list[str] = []

    class HeldMuxer:
        """The real container, except that muxing waits for the test, and closing it is recorded."""

        def __init__(self, container) -> None:
            self.container = container

        def __getattr__(self, name):
            return getattr(self.container, name)

        def mux(self, packet) -> None:
            events.append("mux")
            muxing.set()
            let_go.wait(10)
            self.container.mux(packet)
            events.append("muxed")

        def close(self) -> None:
            events.append("close")
            self.container.close()

    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *args, **kwargs: HeldMuxer(real_open(*args, **kwargs)))
    encoder = make_encoder(fmt, RATE)
    worker = threading.Thread(target=encoder.encode, args=(tone(0.5),))
    worker.start()
    assert muxing.wait(10)
    encoder.close()
    assert "close" not in events
    let_go.set()
    worker.join(10)
    assert not worker.is_alive()
    assert events.count("close") == 1 and events.index("close") > events.index("muxed")
    assert encoder.encode(tone(0.1)) == b"" and encoder.finish() == b""
