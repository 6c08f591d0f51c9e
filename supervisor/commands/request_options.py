"""Who a request speaks as (--voice, --reference-audio, --reference-transcript): synthesize, check and bench alike."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stagevisor.supervisor.bench.loadgen import VoiceFields


def add_voice_options(parser: argparse.ArgumentParser, every: str = "") -> None:
    """--voice, --reference-audio and --reference-transcript, named and read as `stagevisor synthesize` has them.

    `every`: appended to each help text (e.g. " (every request)")."""
    parser.add_argument("--voice", default="", help=f"voice or speaker name (default: the model's own){every}")
    parser.add_argument(
        "--reference-audio",
        metavar="F.wav",
        help=f"reference audio for voice cloning (a Qwen3-TTS Base checkpoint speaks only in a cloned voice){every}",
    )
    parser.add_argument(
        "--reference-transcript", default="", metavar="T", help=f"transcript of the reference audio{every}"
    )


def read_reference_audio(path: str) -> bytes:
    """The file's bytes; ValueError naming the file when it cannot be read or is over the service's limit."""
    from stagevisor.supervisor.dataplane import synthesis

    try:
        with open(path, "rb") as handle:
            # Bounded: a huge file (or /dev/zero) is refused here, not read whole and sent to be refused.
            reference = handle.read(synthesis.MAX_REFERENCE_AUDIO_BYTES + 1)
    except OSError as error:
        raise ValueError(f"cannot read --reference-audio {path}: {error.strerror}") from None
    if len(reference) > synthesis.MAX_REFERENCE_AUDIO_BYTES:
        raise ValueError(
            f"--reference-audio {path} is larger than {synthesis.MAX_REFERENCE_AUDIO_BYTES} bytes, the service's "
            f"limit ({synthesis.MAX_REFERENCE_AUDIO_SECONDS} s of 16-bit mono audio at "
            f"{synthesis.MAX_REFERENCE_SAMPLE_RATE} Hz); send a shorter clip"
        )
    from stagevisor.stages.base import InvalidRequest
    from stagevisor.stages.reference import decode_reference_wav

    try:  # as the stages will read it: a file they refuse is the command's error, before a model loads
        decode_reference_wav(reference)
    except InvalidRequest as error:
        raise ValueError(f"--reference-audio {path}: {error}") from None
    return reference


def voice_fields(args: argparse.Namespace) -> VoiceFields:
    """The voice fields every request of `check` or `bench` carries, read before anything starts.

    ValueError for an unreadable or oversized --reference-audio, or a --reference-transcript without one (the
    transcript of no audio: every request would be refused).
    """
    from stagevisor.supervisor.bench.loadgen import VoiceFields

    if args.reference_transcript and not args.reference_audio:
        raise ValueError(
            "--reference-transcript is the transcript of --reference-audio, which was not given: add "
            "--reference-audio F.wav (the clip it transcribes) or leave the transcript out"
        )
    reference = read_reference_audio(args.reference_audio) if args.reference_audio else b""
    return VoiceFields(args.voice, reference, args.reference_transcript)
