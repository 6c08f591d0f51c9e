"""`stagevisor synthesize`: an oversized reference or an unwritable -o is refused before any daemon is dialled."""

from stagevisor.supervisor.cli import main
from stagevisor.supervisor.dataplane.synthesis import MAX_REFERENCE_AUDIO_BYTES


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
