"""`stagevisor synthesize`: send text to a running daemon and write the streamed speech to a WAV file."""

from __future__ import annotations

import argparse
import math
import sys
import time

from stagevisor.supervisor.addresses import DEFAULT_LISTEN, dial_address
from stagevisor.supervisor.security import add_client_options, client_security

EXIT_FAILED = 1
EXIT_USAGE = 2

_EXAMPLES = """\
examples:
  stagevisor synthesize "Hello from stagevisor." -o hello.wav
  stagevisor synthesize "Same words, same bytes." -o a.wav --option seed=7
  stagevisor synthesize "Slower, please." --option length_scale=1.3 --address 127.0.0.1:50551
  stagevisor synthesize "Where does the time go?" --timings   # per-stage waterfall
  STAGEVISOR_API_KEY=$(cat api.key) stagevisor synthesize "Hello." --address tts.example:50551 --tls-ca ca.pem
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "synthesize",
        help="synthesize speech with a running daemon and write a WAV file",
        description=(
            "Send TEXT to the daemon's Synthesis service and write the audio it streams back as a "
            "16-bit PCM mono WAV file. Prints the duration and the time to first audio."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", metavar="TEXT", help="the text to speak")
    parser.add_argument("-o", "--output", default="out.wav", help="WAV file to write (default: out.wav)")
    parser.add_argument(
        "--address",
        type=dial_address,
        default=DEFAULT_LISTEN,
        help=f"the daemon's public endpoint, HOST:PORT or unix:PATH (default: {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an executor option: seed=7, speed=1.2 or length_scale=0.8 for the default voice "
        "(noise_scale, noise_w, length_scale for the piper model); repeatable",
    )
    parser.add_argument("--voice", default="", help="voice or speaker name (default: the model's own)")
    parser.add_argument("--reference-audio", metavar="F.wav", help="reference audio for voice cloning")
    parser.add_argument("--reference-transcript", default="", metavar="T", help="transcript of the reference audio")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (default: 300)")
    parser.add_argument(
        "--timings", action="store_true", help="print how long each stage took and each handoff cost, as a waterfall"
    )
    add_client_options(parser)
    parser.set_defaults(handler=run)


def parse_options(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE strings -> dict; raises ValueError naming the malformed one."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {pair!r} is malformed; expected KEY=VALUE, e.g. seed=7")
        options[key.strip()] = value.strip()
    return options


def run(args: argparse.Namespace) -> int:
    if not (0 < args.timeout < math.inf):  # nan compares false; any of these expired before the request was sent
        print(f"error: --timeout must be a finite number of seconds > 0, got {args.timeout}", file=sys.stderr)
        return EXIT_USAGE
    try:
        options = parse_options(args.option)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    reference = b""
    if args.reference_audio:
        from stagevisor.supervisor.dataplane import synthesis

        try:
            with open(args.reference_audio, "rb") as handle:
                # Bounded: a huge file (or /dev/zero) is refused here, not read whole and sent to be refused.
                reference = handle.read(synthesis.MAX_REFERENCE_AUDIO_BYTES + 1)
        except OSError as error:
            print(f"error: cannot read --reference-audio {args.reference_audio}: {error.strerror}", file=sys.stderr)
            return EXIT_USAGE
        if len(reference) > synthesis.MAX_REFERENCE_AUDIO_BYTES:
            print(
                f"error: --reference-audio {args.reference_audio} is larger than {synthesis.MAX_REFERENCE_AUDIO_BYTES} "
                f"bytes, the service's limit ({synthesis.MAX_REFERENCE_AUDIO_SECONDS} s of 16-bit mono audio at "
                f"{synthesis.MAX_REFERENCE_SAMPLE_RATE} Hz); send a shorter clip",
                file=sys.stderr,
            )
            return EXIT_USAGE

    unwritable = _unwritable(args.output)
    if unwritable:  # before the request: its audio would have nowhere to go
        print(f"error: cannot write -o {args.output}: {unwritable}", file=sys.stderr)
        return EXIT_USAGE

    security = client_security(args)  # a bad --api-key-file or --tls-ca exits 2 with its code

    import grpc  # kept here: `stagevisor plan` must not load grpc

    from stagevisor.supervisor._proto import synthesis_pb2 as spb
    from stagevisor.supervisor._proto import synthesis_pb2_grpc as sgrpc

    request = spb.SynthesizeRequest(
        text=args.text,
        voice=args.voice,
        reference_audio=reference,
        reference_transcript=args.reference_transcript,
        options=options,
        timings=args.timings,
    )
    started = time.perf_counter()
    first_audio: float | None = None
    pcm: list[bytes] = []
    sample_rate = 0
    timings = None
    try:
        with security.channel(args.address) as channel:
            stream = sgrpc.SynthesisStub(channel).Synthesize(request, timeout=args.timeout)
            for chunk in stream:
                if chunk.HasField("timings"):
                    timings = chunk.timings
                    continue
                if first_audio is None:
                    first_audio = time.perf_counter() - started
                if sample_rate and chunk.sample_rate != sample_rate:
                    print(
                        f"error: the sample rate changed mid-stream ({sample_rate} -> {chunk.sample_rate})",
                        file=sys.stderr,
                    )
                    return EXIT_FAILED
                sample_rate = chunk.sample_rate
                pcm.append(chunk.pcm)
    except grpc.RpcError as error:
        code = error.code()
        if code == grpc.StatusCode.UNAVAILABLE and "connect" in (error.details() or ""):
            # The channel never reached the daemon (as opposed to a worker dying mid-request).
            print(
                f"error: cannot reach the daemon at {args.address} ({error.details()}); "
                "is `stagevisor serve` running there?",
                file=sys.stderr,
            )
        else:
            print(f"error: synthesis failed ({code.name}): {error.details()}", file=sys.stderr)
        return EXIT_USAGE if code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED
    if not pcm or not sample_rate:
        print("error: the daemon returned no audio", file=sys.stderr)
        return EXIT_FAILED
    assert first_audio is not None, "set with the first audio chunk"
    try:
        write_wav(args.output, b"".join(pcm), sample_rate)
    except OSError as error:
        print(f"error: cannot write -o {args.output}: {error.strerror}", file=sys.stderr)
        return EXIT_FAILED
    samples = sum(len(p) for p in pcm) // 2
    print(
        f"wrote {args.output}: {samples / sample_rate:.2f} s of audio at {sample_rate} Hz, "
        f"first audio after {first_audio * 1000:.0f} ms, total {(time.perf_counter() - started) * 1000:.0f} ms"
    )
    if args.timings:
        if timings is None:
            print("no timings: the daemon did not send any (is it older than this client?)", file=sys.stderr)
        else:
            from stagevisor.supervisor.metrics.timings import format_waterfall

            print(format_waterfall(timings))
    return 0


def _unwritable(path: str) -> str | None:
    """Why the WAV file cannot be written at `path` (a directory, or in a directory that does not exist), or None."""
    import os

    if os.path.isdir(path):
        return "it is a directory"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"no directory {directory}"
    return None


def write_wav(path: str, pcm: bytes, sample_rate: int) -> None:
    """Write 16-bit little-endian mono PCM as a WAV file."""
    import wave

    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm)
