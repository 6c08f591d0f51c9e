"""Where `stagevisor synthesize` puts the audio (supervisor/commands/audio_output.py)."""

from __future__ import annotations

import io
import os

import pytest

from stagevisor.supervisor.commands.audio_output import LiveStream, WholeFile, audio_output
from stagevisor.supervisor.http.audio import wav_file, wav_header

RATE = 24000
ONE, TWO = b"\x01\x00" * 4, b"\x02\x00" * 2


def test_standard_output_into_a_pipe_streams_and_into_a_file_is_written_whole(tmp_path):
    read, write = os.pipe()
    try:
        with os.fdopen(write, "wb", closefd=False) as pipe:
            assert isinstance(audio_output("wav", "-", pipe), LiveStream)
    finally:
        os.close(read)
        os.close(write)
    with open(tmp_path / "out.wav", "wb") as redirected:
        assert isinstance(audio_output("wav", "-", redirected), WholeFile)
    assert isinstance(audio_output("wav", str(tmp_path / "a.wav"), io.BytesIO()), WholeFile)


@pytest.mark.parametrize(("fmt", "head"), [("wav", wav_header(RATE)), ("pcm", b"")])
def test_a_live_stream_writes_each_piece_as_it_arrives(fmt, head):
    out = io.BytesIO()
    live = LiveStream(fmt, out)
    live.add(ONE, RATE)
    assert out.getvalue() == head + ONE  # before the next piece exists
    live.add(TWO, RATE)
    live.finish()
    assert out.getvalue() == head + ONE + TWO and live.samples == 6


def test_a_live_stream_of_a_compressed_format_ends_with_its_trailer():
    pytest.importorskip("av")
    out = io.BytesIO()
    live = LiveStream("flac", out)
    live.add(ONE * 2000, RATE)
    live.finish()
    assert out.getvalue().startswith(b"fLaC") and live.samples == 8000


def test_a_whole_file_is_written_once_with_exact_sizes_and_not_at_all_when_abandoned(tmp_path):
    path = tmp_path / "a.wav"
    whole = WholeFile("wav", path.write_bytes)
    whole.add(ONE, RATE)
    whole.add(TWO, RATE)
    assert not path.exists()
    whole.finish()
    assert path.read_bytes() == wav_file(ONE + TWO, RATE)
    failed = WholeFile("wav", (tmp_path / "b.wav").write_bytes)
    failed.add(ONE, RATE)
    failed.abandon()
    assert not (tmp_path / "b.wav").exists()
