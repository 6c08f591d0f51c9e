"""`stagevisor synthesize`: send text to a running daemon and write the streamed speech to an audio file."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from stagevisor.supervisor.addresses import DEFAULT_LISTEN, dial_address
from stagevisor.supervisor.numbers import seconds_problem
from stagevisor.supervisor.security.client import add_client_options, client_security

EXIT_FAILED = 1
EXIT_USAGE = 2
OUTPUT_FORMATS = {
    ".wav": "wav",
    ".mp3": "mp3",
    ".opus": "opus",
    ".ogg": "opus",
    ".aac": "aac",
    ".flac": "flac",
    ".pcm": "pcm",
    ".raw": "pcm",
}
"""-o's extension -> the audio format written (the HTTP API's `response_format` names); none at all: WAV."""

_EXAMPLES = """\
examples:
  stagevisor synthesize "Hello from stagevisor." -o hello.wav
  stagevisor synthesize "Hello from stagevisor." -o hello.mp3     # the format follows the extension
  echo "Text from another program." | stagevisor synthesize - -o piped.opus
  stagevisor synthesize "Straight to a player." -o - | ffplay -nodisp -autoexit -   # the audio on stdout
  stagevisor synthesize "Same words, same bytes." -o a.wav --option seed=7
  stagevisor synthesize "Slower, please." --option length_scale=1.3 --address 127.0.0.1:50551
  stagevisor synthesize "Where does the time go?" --timings   # per-stage waterfall
  STAGEVISOR_API_KEY=$(cat api.key) stagevisor synthesize "Hello." --address tts.example:50551 --tls-ca ca.pem
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "synthesize",
        help="synthesize speech with a running daemon and write an audio file",
        description=(
            "Send TEXT to the daemon's Synthesis service and write the audio it streams back: a 16-bit mono "
            "WAV file, or MP3, Opus, AAC, FLAC or raw 16-bit PCM after -o's extension or --format. "
            "Prints the duration and the time to first audio."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", metavar="TEXT", help="the text to speak; - reads it from standard input (UTF-8)")
    parser.add_argument(
        "-o",
        "--output",
        default="out.wav",
        help="audio file to write, its format from its extension: .wav (and no extension), .mp3, .opus or .ogg, "
        ".aac, .flac, .pcm or .raw (16-bit little-endian samples); - writes WAV (or --format) to standard "
        "output, as the audio arrives when that is a pipe, and the summary to standard error (default: out.wav)",
    )
    parser.add_argument(
        "--format",
        choices=sorted(set(OUTPUT_FORMATS.values())),
        help="write this format whatever -o's extension says",
    )
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
        "(noise_scale, noise_w, length_scale for the piper model; language, instructions='a calm, low voice', "
        "seed and the sampling options for Qwen3-TTS); repeatable",
    )
    from stagevisor.supervisor.commands.request_options import add_voice_options

    add_voice_options(parser)
    parser.add_argument(
        "--timeout", type=float, default=300.0, metavar="SECONDS", help="give up after this many seconds (default: 300)"
    )
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
    problem = seconds_problem("--timeout", args.timeout, zero=False)  # 0 s or less: expired before sending
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        options = parse_options(args.option)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    reference = b""
    if args.reference_audio:
        from stagevisor.supervisor.commands.request_options import read_reference_audio

        try:
            reference = read_reference_audio(args.reference_audio)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_USAGE

    to_stdout = args.output == "-"
    if to_stdout and sys.stdout.isatty():  # as gzip refuses: audio bytes would only garble the terminal
        print("error: -o - writes audio to standard output, which is a terminal; pipe or redirect it", file=sys.stderr)
        return EXIT_USAGE
    unwritable_because = None if to_stdout else unwritable(args.output)
    if unwritable_because:  # before the request: its audio would have nowhere to go
        print(f"error: cannot write -o {args.output}: {unwritable_because}", file=sys.stderr)
        return EXIT_USAGE
    try:
        fmt = output_format(args.output, args.format)
        text = read_stdin_text() if args.text == "-" else args.text
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE

    security = client_security(args)  # a bad --api-key-file or --tls-ca exits 2 with its code

    import grpc  # kept here: `stagevisor plan` must not load grpc

    from stagevisor.supervisor._proto import synthesis_pb2 as spb
    from stagevisor.supervisor._proto import synthesis_pb2_grpc as sgrpc

    request = spb.SynthesizeRequest(
        text=text,
        voice=args.voice,
        reference_audio=reference,
        reference_transcript=args.reference_transcript,
        options=options,
        timings=args.timings,
    )
    from stagevisor.supervisor.commands.audio_output import audio_output

    output = audio_output(fmt, args.output, sys.stdout.buffer)
    started = time.perf_counter()
    first_audio: float | None = None
    sample_rate = 0
    timings = None
    unwritten: OSError | None = None
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
                    output.abandon()
                    print(
                        f"error: the sample rate changed mid-stream ({sample_rate} -> {chunk.sample_rate})",
                        file=sys.stderr,
                    )
                    return EXIT_FAILED
                sample_rate = chunk.sample_rate
                try:
                    output.add(chunk.pcm, sample_rate)  # a pipe gets it now; a file once it is all here
                except OSError as error:  # the pipe's reader left (a player closed)
                    unwritten = error
                    break  # leaving the channel cancels the request
    except grpc.RpcError as error:
        output.abandon()
        code = error.code()
        if code == grpc.StatusCode.UNAVAILABLE and "connect" in (error.details() or ""):
            # The channel never reached the daemon (as opposed to a worker dying mid-request). One answering in
            # the other protocol (TLS dialled in plaintext, or the reverse) is the command's error: say which.
            from stagevisor.supervisor.commands.admin import tls_mismatch

            from stagevisor.supervisor.commands.unanswered import NOT_HTTP2, Answer, Unanswered, explain

            details = error.details() or ""
            mismatch = tls_mismatch(args.address, security.tls_from, details)
            if mismatch is not None:
                print(f"error: {mismatch.message}", file=sys.stderr)
                return EXIT_USAGE
            if any(sign in details for sign in NOT_HTTP2):  # the HTTP API's port, say: as the admin commands say it
                seen = Unanswered(args.address, Answer.UNKNOWN, grpc_error=details, endpoint="public endpoint")
                print(f"error: {explain(seen).message}", file=sys.stderr)
            else:
                print(
                    f"error: cannot reach the daemon at {args.address} ({details}); is `stagevisor serve` running "
                    "there?",
                    file=sys.stderr,
                )
        elif code == grpc.StatusCode.UNIMPLEMENTED:  # a gRPC server without the Synthesis service
            # Another endpoint (the admin API, say) answered: as an admin command given the public endpoint
            # says it (DAEMON_UNREACHABLE), exit status 1, not the usage error's 2.
            from stagevisor.supervisor.commands.unanswered import Answer, Unanswered, explain

            seen = Unanswered(
                args.address,
                Answer.UNKNOWN,
                grpc_error=f"UNIMPLEMENTED: {error.details()}",
                endpoint="public endpoint",
                unimplemented=True,
            )
            print(f"error: {explain(seen).message}", file=sys.stderr)
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED and error.details() == CLIENT_DEADLINE:
            # This command's --timeout ran out, not the daemon's --request-timeout (whose message says so).
            print(
                f"error: synthesis failed (DEADLINE_EXCEEDED): no complete answer within --timeout {args.timeout:g} s, "
                "so this command gave up (no audio written); give a longer text a larger --timeout",
                file=sys.stderr,
            )
        else:
            print(failure_line(code.name, error.details(), error.trailing_metadata()), file=sys.stderr)
        return EXIT_USAGE if code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED
    if unwritten is not None:
        output.abandon()
        return _unwritten(args.output, unwritten)
    total = time.perf_counter() - started  # the synthesis, not the encoding and writing after it
    if not output.samples or not sample_rate:
        output.abandon()
        print("error: the daemon returned no audio", file=sys.stderr)
        return EXIT_FAILED
    assert first_audio is not None, "set with the first audio chunk"
    try:
        output.finish()
    except OSError as error:
        return _unwritten(args.output, error)
    report = sys.stderr if to_stdout else sys.stdout  # standard output carries the audio
    samples = output.samples
    named = "standard output" if to_stdout else args.output
    named = named if fmt == "wav" else f"{named} ({fmt})"  # the WAV line as it always read
    print(
        f"wrote {named}: {samples / sample_rate:.2f} s of audio at {sample_rate} Hz, "
        f"first audio after {first_audio * 1000:.0f} ms, total {total * 1000:.0f} ms",
        file=report,
    )
    if args.timings:
        if timings is None:
            print("no timings: the daemon did not send any (is it older than this client?)", file=sys.stderr)
        else:
            from stagevisor.supervisor.metrics.timings import format_waterfall

            print(format_waterfall(timings), file=report)
    return 0


def _unwritten(path: str, error: OSError) -> int:
    """Say the audio could not be written to -o; standard output whose reader left is pointed at /dev/null first,
    so that Python's flush of it at exit does not fail again."""
    import os

    if path == "-":
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    print(f"error: cannot write -o {path}: {error.strerror or error}", file=sys.stderr)
    return EXIT_FAILED


CLIENT_DEADLINE = "Deadline Exceeded"
"""What gRPC says when the caller's own deadline (--timeout) expires; the daemon's DEADLINE_EXCEEDED says more."""


def failure_line(status: str, details: str | None, metadata: Any) -> str:
    """The one-line error of a synthesis the daemon failed: its status, the failing stage's code where the trailing
    metadata carries one (`synthesis failed (INVALID_ARGUMENT, QWEN3_UNKNOWN_SPEAKER): ...`), and its message.
    What the metadata holds under the key and is not a code is left out."""
    from stagevisor.stages.base import is_error_code
    from stagevisor.supervisor.dataplane.synthesis import ERROR_CODE_KEY

    code = dict(metadata or ()).get(ERROR_CODE_KEY)
    named = f"{status}, {code}" if is_error_code(code) else status
    return f"error: synthesis failed ({named}): {details}"


def unwritable(path: str) -> str | None:
    """Why a file cannot be written at `path` (a directory, in a directory that does not exist or that this user
    may not write to), or None. Asked before the work whose result it would hold (synthesize -o, bench --plot)."""
    import os

    if os.path.isdir(path):
        return "it is a directory"
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        return f"no directory {directory}"
    if not os.access(directory, os.W_OK | os.X_OK) and not os.path.exists(path):
        return f"you may not create files in {directory}"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "you may not write to it"
    return None


def output_format(path: str, given: str | None) -> str:
    """The format -o is written in: `given` (--format), else its extension's, WAV where it has none.

    ValueError for an extension that names no format this writes (.m4a, .txt, a typo): audio of one format
    in a file named for another plays nowhere, or as noise.
    """
    if given is not None:
        return given
    suffix = Path(path).suffix.lower()
    if not suffix:
        return "wav"
    if suffix not in OUTPUT_FORMATS:
        known = ", ".join(OUTPUT_FORMATS)
        raise ValueError(
            f"cannot tell the audio format of -o {path} from its extension {suffix}; name the file with one of "
            f"{known}, or give --format"
        )
    return OUTPUT_FORMATS[suffix]


def read_stdin_text() -> str:
    """TEXT given as `-`: standard input, UTF-8, read up to what the service could take (ValueError past it)."""
    from stagevisor.supervisor.dataplane.synthesis import MAX_TEXT_CHARS

    limit = 4 * MAX_TEXT_CHARS  # UTF-8: at most 4 bytes a character
    raw = sys.stdin.buffer.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(
            f"the text on standard input is longer than the service takes ({MAX_TEXT_CHARS} characters at most); "
            "send it in parts"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"the text on standard input is not UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start})"
        ) from None
