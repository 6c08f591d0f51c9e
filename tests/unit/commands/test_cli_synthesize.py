"""`stagevisor synthesize`: what is refused before any daemon is dialled (an oversized reference, an unwritable
-o, an -o whose format is unknown, standard input that is not text), and how -o picks its format."""

import io
import sys

import pytest

from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands.synthesize import failure_line, output_format, read_stdin_text
from stagevisor.supervisor.dataplane.synthesis import MAX_REFERENCE_AUDIO_BYTES, MAX_TEXT_CHARS


def test_a_reference_past_the_limit_exits_2_without_reading_it_whole(capsys, tmp_path):
    """A 1 GiB file (sparse), or /dev/zero, was read whole into memory (or forever) and then sent to be refused."""
    huge = tmp_path / "huge.wav"
    with open(huge, "wb") as handle:
        handle.truncate(1 << 30)
    for path in (huge, "/dev/zero"):
        code = main(["synthesize", "Hi", "--reference-audio", str(path), "--address", f"unix:{tmp_path}/none.sock"])
        assert code == 2
        assert capsys.readouterr().err == (
            f"error: --reference-audio {path} is larger than {MAX_REFERENCE_AUDIO_BYTES} bytes, the service's limit "
            "(60 s of 16-bit mono audio at 48000 Hz); send a shorter clip\n"
        )


def test_an_output_in_a_missing_directory_exits_2_before_any_daemon_is_dialled(capsys, tmp_path):
    """-o into a directory that does not exist ended, after the synthesis, in a FileNotFoundError traceback."""
    output = tmp_path / "missing" / "out.wav"
    code = main(["synthesize", "Hi", "-o", str(output), "--address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == f"error: cannot write -o {output}: no directory {tmp_path / 'missing'}\n"


def test_an_output_that_is_a_directory_exits_2(capsys, tmp_path):
    code = main(["synthesize", "Hi", "-o", str(tmp_path), "--address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == f"error: cannot write -o {tmp_path}: it is a directory\n"


@pytest.mark.parametrize(
    "output, given, fmt",
    [
        ("hello.wav", None, "wav"),
        ("HELLO.MP3", None, "mp3"),
        ("a.ogg", None, "opus"),
        ("a.opus", None, "opus"),
        ("a.aac", None, "aac"),
        ("a.flac", None, "flac"),
        ("a.raw", None, "pcm"),
        ("/dev/null", None, "wav"),  # no extension: WAV, as before formats followed it
        ("dir.d/speech", None, "wav"),
        ("a.wav", "mp3", "mp3"),  # --format wins
        ("a.m4a", "flac", "flac"),
    ],
)
def test_the_output_format_follows_the_extension_unless_given(output, given, fmt):
    assert output_format(output, given) == fmt


def test_an_extension_that_names_no_format_exits_2_before_any_daemon_is_dialled(capsys, tmp_path):
    """It used to get WAV bytes under its name: an .mp3 file no player opens as MP3."""
    output = tmp_path / "speech.m4a"
    code = main(["synthesize", "Hi", "-o", str(output), "--address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: cannot tell the audio format of -o {output} from its extension .m4a; name the file with one of "
        ".wav, .mp3, .opus, .ogg, .aac, .flac, .pcm, .raw, or give --format\n"
    )
    assert not output.exists()


def stdin_of(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_text_dash_reads_standard_input(monkeypatch):
    stdin_of(monkeypatch, "Grüße from a pipe.\n".encode())
    assert read_stdin_text() == "Grüße from a pipe.\n"


@pytest.mark.parametrize(
    "data, complaint",
    [
        (b"\xff\xfe text", "the text on standard input is not UTF-8 (byte 0xff at offset 0)"),
        (
            b"a" * (4 * MAX_TEXT_CHARS + 1),
            f"the text on standard input is longer than the service takes ({MAX_TEXT_CHARS}",
        ),
    ],
)
def test_standard_input_that_is_not_text_or_too_long_exits_2(monkeypatch, capsys, tmp_path, data, complaint):
    stdin_of(monkeypatch, data)
    code = main(["synthesize", "-", "-o", str(tmp_path / "a.wav"), "--address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err.startswith(f"error: {complaint}")


def test_audio_to_standard_output_that_is_a_terminal_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "stdout", FakeTerminal())
    code = main(["synthesize", "Hi", "-o", "-", "--address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == (
        "error: -o - writes audio to standard output, which is a terminal; pipe or redirect it\n"
    )


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_failed_synthesis_names_the_stages_code_beside_its_status():
    metadata = (("stagevisor-request-id", "ab12"), ("stagevisor-error-code", "QWEN3_UNKNOWN_SPEAKER"))
    assert failure_line("INVALID_ARGUMENT", "stage 'x' rejected the request: no", metadata) == (
        "error: synthesis failed (INVALID_ARGUMENT, QWEN3_UNKNOWN_SPEAKER): stage 'x' rejected the request: no"
    )


@pytest.mark.parametrize("metadata", [None, (), (("stagevisor-error-code", "x; rm -rf"),), (("other", "X_Y"),)])
def test_a_failed_synthesis_without_a_code_reads_as_before(metadata):
    assert failure_line("INTERNAL", "boom", metadata) == "error: synthesis failed (INTERNAL): boom"


class _Expired(Exception):
    """The RpcError gRPC raises when the caller's own deadline expires."""

    def code(self):
        import grpc

        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"

    def trailing_metadata(self):
        return None


def test_a_synthesis_past_its_own_timeout_says_the_command_gave_up_and_what_to_raise(monkeypatch, capsys, tmp_path):
    """It said only `synthesis failed (DEADLINE_EXCEEDED): Deadline Exceeded`, which reads as the daemon's failure;
    it was this command's --timeout that ran out."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2_grpc

    timeouts: list[float] = []

    class Stub:
        def __init__(self, channel) -> None:
            pass

        def Synthesize(self, request, timeout):
            timeouts.append(timeout)
            raise type("Expired", (_Expired, grpc.RpcError), {})()

    monkeypatch.setattr(synthesis_pb2_grpc, "SynthesisStub", Stub)
    argv = ["synthesize", "hello", "--timeout", "0.5", "--address", f"unix:{tmp_path}/p.sock"]
    assert main([*argv, "-o", str(tmp_path / "out.wav")]) == 1
    assert timeouts == [0.5]
    err = capsys.readouterr().err
    assert err.startswith("error: synthesis failed (DEADLINE_EXCEEDED): no complete answer within --timeout 0.5 s")
    assert "larger --timeout" in err and not (tmp_path / "out.wav").exists()
