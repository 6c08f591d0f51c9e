"""Streaming audio encoders for the speech API: 16-bit mono PCM in, `response_format` bytes out, as they come.

`pcm` and `wav` need no codec: raw 16-bit little-endian samples, the WAV one
behind a header that goes out before the audio is made, so its sizes cannot
be known: it carries SoX's "length unknown" marker (data size 0x7FFFF000),
which soxi reports as an unknown duration and FFmpeg (ffprobe, browsers)
reads to the end of the stream; Python's `wave` has no "unknown" and reports
that placeholder count, while `readframes` returns the frames actually sent.
(0xFFFFFFFF, another common choice, makes soxi report 24.8 hours.) Where the
length is known (`wav_file`, the batch endpoint), the header is exact. `mp3`, `opus` (in Ogg), `aac`
(ADTS) and `flac` are encoded by FFmpeg through PyAV (its wheels bundle
LGPL FFmpeg builds with libmp3lame and libopus), muxed into an in-memory
sink that flushes after every packet, so each chunk's encoded bytes can go to
the client at once.
"""

from __future__ import annotations

import struct
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:  # PyAV loads only when a compressed format is asked for
    import av

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
# format -> (FFmpeg muxer, FFmpeg encoder)
_FFMPEG = {
    "mp3": ("mp3", "libmp3lame"),
    "opus": ("ogg", "libopus"),
    "aac": ("adts", "aac"),
    "flac": ("flac", "flac"),
}
_NO_EMPTY_STREAM = frozenset({"mp3", "opus", "aac"})
"""Formats with no empty stream a decoder opens (FFmpeg: Ogg Opus with its headers only, MP3 with an ID3 tag only,
AAC's zero bytes); an empty FLAC stream (its header) and WAV (its header) open as no audio."""
UNKNOWN_SIZE = 0x7FFFF000
"""SoX's marker for a WAV whose length is not known when its header is written (MS_UNSPEC in sox's wav.c)."""


class Encoder(Protocol):
    """Turns consecutive 16-bit mono PCM pieces into the bytes of one audio stream."""

    sample_rate: int
    """The rate of the PCM given."""
    output_rate: int
    """The rate of the stream made (Opus takes only some rates: 48 kHz for 44.1 kHz audio)."""
    threaded: bool
    """True when encoding costs enough CPU to run off the event loop (one thread at a time)."""

    def encode(self, pcm: bytes) -> bytes:
        """Encoded bytes ready after this piece (may be empty while the codec fills a frame)."""

    def finish(self) -> bytes:
        """Everything still buffered, then the stream's trailer."""

    def close(self) -> None:
        """Free what the encoder holds; the stream is abandoned (idempotent, also after finish).

        Safe while `encode` or `finish` runs in another thread (a client that left mid-chunk):
        the codec is then freed by that call once it returns."""


class PcmEncoder:
    """`pcm`: the samples themselves."""

    threaded = False

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = self.output_rate = sample_rate

    def encode(self, pcm: bytes) -> bytes:
        return pcm

    def finish(self) -> bytes:
        return b""

    def close(self) -> None:
        pass


def wav_header(sample_rate: int, data_size: int = UNKNOWN_SIZE) -> bytes:
    """A 44-byte RIFF/WAVE header for 16-bit mono PCM; the default size means "length unknown, read to the end"."""
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


def wav_file(pcm: bytes, sample_rate: int) -> bytes:
    """A whole 16-bit mono WAV file, its sizes exact."""
    return wav_header(sample_rate, len(pcm)) + pcm


class WavEncoder(PcmEncoder):
    """`wav`: a streaming header, then the samples."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = self.output_rate = sample_rate
        self._header: bytes | None = wav_header(sample_rate)

    def encode(self, pcm: bytes) -> bytes:
        header, self._header = self._header, None
        return (header or b"") + pcm

    def finish(self) -> bytes:
        header, self._header = self._header, None  # an empty stream is still a valid (empty) WAV file
        return header or b""


class _Sink:
    """A write-only file for FFmpeg's muxer: no seek, so muxers write streamable output."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class FFmpegEncoder:
    """`mp3`, `opus`, `aac`, `flac` through PyAV, resampled where the codec cannot take the model's rate."""

    threaded = True

    def __init__(self, fmt: str, sample_rate: int) -> None:
        import av

        muxer, codec_name = _FFMPEG[fmt]
        self.format = fmt
        self.sample_rate = sample_rate
        codec = av.codec.Codec(codec_name, "w")
        self.output_rate = _supported_rate(sample_rate, codec.audio_rates)
        self._sink = _Sink()
        # flush_packets: hand every packet to the sink now, not when a 32 KiB buffer fills;
        # page_duration (Ogg): close a page every 20 ms instead of every second;
        # bitexact (Ogg): a fixed stream serial number, so the same audio gives the same bytes.
        options = {"flush_packets": "1"}
        if muxer == "ogg":
            options.update(page_duration="20000", fflags="+bitexact")
        self._container = av.open(self._sink, mode="w", format=muxer, container_options=options)
        # Any: PyAV types add_stream as any kind of stream; an audio codec's is an AudioStream.
        stream: Any = self._container.add_stream(codec_name, rate=self.output_rate, layout="mono")
        self._stream = stream
        sample_format = stream.codec_context.format
        if not sample_format:
            formats = codec.audio_formats
            assert formats, f"codec {codec_name} lists no audio sample format"
            sample_format = formats[0]
        self._resampler = av.AudioResampler(format=sample_format.name, layout="mono", rate=self.output_rate)
        self._av = av
        # Closing the container while a thread muxes into it crashes FFmpeg (a use after free), and a client
        # that leaves mid-chunk closes the stream on the event loop while the chunk's encode runs in a thread:
        # _state guards the flags only, so close() never waits for a codec.
        self._state = threading.Lock()
        self._closed = False
        """No more audio goes in: finished, or closed by the caller."""
        self._busy = False
        """`encode` or `finish` is using the codec (in a thread); a close() meanwhile is carried out by it."""
        self._released = False
        self._coded = False
        """Some audio reached the codec."""

    def _write(self, frame: "av.AudioFrame | None") -> bytes:
        for resampled in self._resampler.resample(frame):
            self._coded = True
            self._encode(resampled)
        return self._sink.take()

    def _encode(self, frame: "av.AudioFrame | None") -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def _silence(self) -> "av.AudioFrame":
        """One sample of silence in the codec's own format and rate; the codec pads it to its shortest frame."""
        frame = self._av.AudioFrame(format=self._stream.codec_context.format.name, layout="mono", samples=1)
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        frame.sample_rate = self.output_rate
        frame.pts = 0
        return frame

    def _guarded(self, work: Callable[[], bytes]) -> bytes:
        """`work` on the codec unless the stream is closed; a close() that came meanwhile frees it after."""
        with self._state:
            if self._closed:
                return b""
            self._busy = True
        try:
            return work()
        finally:
            with self._state:
                self._busy = False
                abandoned = self._closed
            if abandoned:
                self._release()

    def encode(self, pcm: bytes) -> bytes:
        samples = np.frombuffer(pcm, dtype="<i2")
        if samples.size == 0:
            return b""
        frame = self._av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        return self._guarded(lambda: self._write(frame))

    def finish(self) -> bytes:
        return self._guarded(self._finish)

    def _finish(self) -> bytes:
        out = self._write(None)
        if not self._coded and self.format in _NO_EMPTY_STREAM:
            # No audio reached the codec (the stage streamed none, or too little for the resampler to give a
            # sample), and this format has no empty stream a decoder opens: the codec's shortest silence instead.
            self._encode(self._silence())
        self._encode(None)
        with self._state:
            self._closed = self._released = True
        self._container.close()
        return out + self._sink.take()

    def close(self) -> None:
        """Free the codec without finishing the stream (the client went away)."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            if self._busy:
                return  # the thread using the codec frees it when its call returns
        self._release()

    def _release(self) -> None:
        with self._state:
            if self._released:
                return
            self._released = True
        try:
            self._container.close()
        except Exception:  # noqa: BLE001 - a half-written stream nobody reads
            pass


def _supported_rate(rate: int, supported: Sequence[int] | None) -> int:
    """`rate` when the codec takes it, else the lowest supported rate above it (else the highest)."""
    rates = sorted(supported or ())
    if not rates or rate in rates:
        return rate
    higher = [r for r in rates if r > rate]
    return higher[0] if higher else rates[-1]


class Resampler:
    """Float mono audio from the model's rate to the rate asked for, chunk by chunk (soxr, high quality).

    One stream per request: soxr keeps the filter's state between chunks, so
    the output does not depend on where the chunks were cut.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        import soxr

        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def push(self, samples: "np.ndarray") -> "np.ndarray":
        out: np.ndarray = self._stream.resample_chunk(np.asarray(samples, dtype=np.float32).reshape(-1), last=False)
        return out

    def flush(self) -> "np.ndarray":
        """What the filter still holds, at the end of the stream."""
        out: np.ndarray = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return out


def make_encoder(fmt: str, sample_rate: int) -> Encoder:
    """The streaming encoder for one of FORMATS at the model's sample rate."""
    if fmt == "pcm":
        return PcmEncoder(sample_rate)
    if fmt == "wav":
        return WavEncoder(sample_rate)
    if fmt in _FFMPEG:
        return FFmpegEncoder(fmt, sample_rate)
    raise ValueError(f"unknown audio format {fmt!r}; one of {', '.join(FORMATS)}")
