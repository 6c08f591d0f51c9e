"""Where `stagevisor synthesize` puts the audio: a file written whole, or a pipe fed as the audio arrives."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Protocol

if TYPE_CHECKING:
    from stagevisor.supervisor.http.audio import Encoder


class AudioOutput(Protocol):
    """Takes the daemon's 16-bit mono PCM pieces in order and writes them in one format."""

    samples: int
    """How many samples it was given."""

    def add(self, pcm: bytes, sample_rate: int) -> None:
        """One more piece, at the stream's one sample rate (OSError when it cannot be written)."""

    def finish(self) -> None:
        """The synthesis ended with audio: write what is left (OSError when it cannot be written)."""

    def abandon(self) -> None:
        """The synthesis failed or was stopped: free the encoder; what was written stays written."""


class WholeFile:
    """-o FILE, or standard output redirected to a file: encoded once the audio is all there (a WAV's sizes
    exact), and nothing written when the synthesis fails."""

    def __init__(self, fmt: str, write: Callable[[bytes], object]) -> None:
        self.fmt, self.write = fmt, write
        self.samples = 0
        self._pieces: list[bytes] = []
        self._rate = 0

    def add(self, pcm: bytes, sample_rate: int) -> None:
        self._pieces.append(pcm)
        self._rate = sample_rate
        self.samples += len(pcm) // 2

    def finish(self) -> None:
        self.write(encode(self.fmt, b"".join(self._pieces), self._rate))

    def abandon(self) -> None:
        self._pieces.clear()


class LiveStream:
    """-o - into a pipe (a player, another program): each piece encoded and written as it arrives, as the HTTP API
    streams it (a WAV's header says "length unknown, read to the end"), so the audio plays before the synthesis
    ends. A synthesis that fails mid-way leaves the audio written so far, cut short."""

    def __init__(self, fmt: str, out: BinaryIO) -> None:
        self.fmt, self.out = fmt, out
        self.samples = 0
        self._encoder: Encoder | None = None

    def add(self, pcm: bytes, sample_rate: int) -> None:
        if self._encoder is None:
            from stagevisor.supervisor.http.audio import make_encoder

            self._encoder = make_encoder(self.fmt, sample_rate)
        self.samples += len(pcm) // 2
        self._write(self._encoder.encode(pcm))

    def finish(self) -> None:
        assert self._encoder is not None, "finish follows audio"
        try:
            self._write(self._encoder.finish())
        finally:
            self._encoder.close()

    def abandon(self) -> None:
        if self._encoder is not None:
            self._encoder.close()

    def _write(self, data: bytes) -> None:
        if data:
            self.out.write(data)
            self.out.flush()


def audio_output(fmt: str, path: str, stdout: BinaryIO) -> AudioOutput:
    """WholeFile for a file, or for standard output redirected to one; LiveStream for standard output that is a
    pipe, a socket or a character device, where a reader waits for the audio as it comes."""
    if path != "-":
        return WholeFile(fmt, Path(path).write_bytes)
    try:
        regular = stat.S_ISREG(os.fstat(stdout.fileno()).st_mode)
    except (OSError, ValueError):  # no descriptor behind it (io.UnsupportedOperation is both): no file either
        regular = False
    if not regular:
        return LiveStream(fmt, stdout)

    def write(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    return WholeFile(fmt, write)


def encode(fmt: str, pcm: bytes, sample_rate: int) -> bytes:
    """Whole 16-bit mono PCM as a file of `fmt`: the HTTP API's encoders, a WAV header with its exact sizes."""
    from stagevisor.supervisor.http.audio import make_encoder, wav_file

    if fmt == "wav":
        return wav_file(pcm, sample_rate)
    encoder = make_encoder(fmt, sample_rate)
    try:
        return encoder.encode(pcm) + encoder.finish()
    finally:
        encoder.close()
