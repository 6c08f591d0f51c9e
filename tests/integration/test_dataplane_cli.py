"""`stagevisor synthesize` against a live Synthesis service: WAV output, summary line, exit codes."""

import asyncio
import os
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.integration.dataplane_stages import SAMPLE_RATE, split_chain

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served():
    with split_chain() as started:
        yield started


async def start_cli(
    *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
):
    """`stagevisor synthesize ARGS` started in a subprocess (this process's event loop keeps serving the cluster)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "stagevisor", "synthesize", *args),
        cwd=ROOT,
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
    )


def synthesize_cli(loop, *args, stdin: bytes | None = None, binary: bool = False):
    """Run the CLI to its end: (exit status, standard output (`binary`: as bytes), standard error)."""

    async def run():
        process = await start_cli(
            *args, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL
        )
        out, err = await asyncio.wait_for(process.communicate(stdin), 60)
        return process.returncode, out if binary else out.decode(), err.decode()

    return loop.run_until_complete(run())


async def cli_into(stdout, *args) -> int:
    """The CLI's exit status, its standard output `stdout` (a file)."""
    process = await start_cli(*args, stdout=stdout, stderr=asyncio.subprocess.DEVNULL)
    return await asyncio.wait_for(process.wait(), 60)


def test_synthesize_writes_a_16_bit_mono_wav_and_prints_a_summary(served, tmp_path):
    loop, cluster = served
    output = tmp_path / "out.wav"
    code, out, err = synthesize_cli(
        loop, "one two three", "-o", str(output), "--address", cluster.public, "--option", "noise_scale=0"
    )
    assert code == 0, err
    with wave.open(str(output)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, SAMPLE_RATE)
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    assert len(samples) == 3 * 160 and np.abs(samples).max() > 0
    assert out.startswith(f"wrote {output}: 0.03 s of audio at {SAMPLE_RATE} Hz, first audio after")


def wav_samples(path: Path) -> np.ndarray:
    with wave.open(str(path)) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


def decoded(path: Path) -> tuple[str, int, np.ndarray]:
    """(codec, rate, mono samples as int16 where the codec's are) of an audio file, by FFmpeg (PyAV)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        return stream.codec_context.name, stream.rate, np.concatenate(frames) if frames else np.zeros(0)


def test_synthesize_writes_the_format_its_output_is_named_for(served, tmp_path):
    """FLAC and raw PCM hold the WAV's very samples; MP3, Opus and AAC decode as those codecs, with audio."""
    loop, cluster = served
    noiseless = ("--address", cluster.public, "--option", "noise_scale=0")
    assert synthesize_cli(loop, "one two three", "-o", str(tmp_path / "a.wav"), *noiseless)[0] == 0
    reference = wav_samples(tmp_path / "a.wav")
    for name, codec in (("a.flac", "flac"), ("a.mp3", "mp3float"), ("a.opus", "opus"), ("a.aac", "aac")):
        code, out, err = synthesize_cli(loop, "one two three", "-o", str(tmp_path / name), *noiseless)
        assert code == 0, err
        assert out.startswith(f"wrote {tmp_path / name} ({Path(name).suffix[1:]}): 0.03 s of audio at")
        found, rate, samples = decoded(tmp_path / name)
        assert found == codec and samples.size and np.abs(samples).max() > 0
        if codec == "flac":
            assert rate == SAMPLE_RATE and np.array_equal(samples, reference)
    code, _, err = synthesize_cli(loop, "one two three", "-o", str(tmp_path / "a.raw"), *noiseless)
    assert code == 0, err
    assert np.array_equal(np.frombuffer((tmp_path / "a.raw").read_bytes(), "<i2"), reference)


def test_synthesize_reads_the_text_from_standard_input_given_dash(served, tmp_path):
    loop, cluster = served
    args = ("-o", str(tmp_path / "piped.wav"), "--address", cluster.public, "--option", "noise_scale=0")
    code, _, err = synthesize_cli(loop, "-", *args, stdin=b"one two three\n")
    assert code == 0, err
    assert synthesize_cli(loop, "one two three", "-o", str(tmp_path / "argv.wav"), *args[2:])[0] == 0
    assert np.array_equal(wav_samples(tmp_path / "piped.wav"), wav_samples(tmp_path / "argv.wav"))


def test_synthesize_writes_the_audio_to_standard_output_given_dash(served, tmp_path):
    """`-o -`: the WAV on standard output (for a pipe to a player), the summary on standard error. Into a pipe it
    streams, so its header says "length unknown" (as the HTTP API's streamed WAV); into a file its sizes are exact."""
    from stagevisor.supervisor.http.audio import wav_header

    loop, cluster = served
    args = ("--address", cluster.public, "--option", "noise_scale=0")
    code, out, err = synthesize_cli(loop, "one two three", "-o", "-", *args, binary=True)
    assert code == 0, err
    assert err.startswith("wrote standard output: 0.03 s of audio at")
    assert synthesize_cli(loop, "one two three", "-o", str(tmp_path / "a.wav"), *args)[0] == 0
    whole = (tmp_path / "a.wav").read_bytes()
    assert out[:44] == wav_header(SAMPLE_RATE) and out[44:] == whole[44:]
    with open(tmp_path / "redirected.wav", "wb") as redirected:  # `> redirected.wav`: a file, written whole
        code = loop.run_until_complete(cli_into(redirected, "one two three", "-o", "-", *args))
    assert code == 0 and (tmp_path / "redirected.wav").read_bytes() == whole


def test_synthesize_into_a_pipe_writes_the_first_audio_before_the_synthesis_ends(served, tmp_path):
    """`-o - | player` kept every chunk until the stream ended (a long text played nothing for seconds). Here the
    engine holds the stream after the first word until the test has read that word's audio from the pipe."""
    loop, cluster = served
    go = tmp_path / "go"

    async def run() -> tuple[bytes, bytes, int]:
        process = await start_cli(f"one waitfor={go} three", "-o", "-", "--format", "pcm", "--address", cluster.public)
        try:
            first = await asyncio.wait_for(process.stdout.readexactly(320), 20)  # "one": 160 samples
            still_running = process.returncode is None
            go.touch()
            rest, err = await asyncio.wait_for(process.communicate(), 60)
        finally:
            go.touch()
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert still_running, "the synthesis had ended before its first audio was read"
        return first + rest, err, process.returncode

    audio, err, code = loop.run_until_complete(run())
    assert code == 0, err.decode()
    assert len(audio) == 3 * 320 and err.decode().startswith("wrote standard output (pcm): 0.03 s of audio")


def test_synthesize_exits_2_when_the_request_is_invalid(served):
    loop, cluster = served
    code, _, err = synthesize_cli(loop, "words", "--address", cluster.public, "--option", "bad=1", "-o", os.devnull)
    assert code == 2 and err.startswith(
        "error: synthesis failed (INVALID_ARGUMENT): stage 'tokenize' rejected the request: option 'bad'"
    )


def test_synthesize_exits_1_naming_the_address_when_no_daemon_listens(served, tmp_path):
    loop, _ = served
    address = f"unix:{tmp_path}/none.sock"
    code, _, err = synthesize_cli(loop, "words", "--address", address, "-o", os.devnull)
    assert code == 1 and f"cannot reach the daemon at {address}" in err


def test_synthesize_exits_1_when_a_stage_fails(served):
    loop, cluster = served
    code, _, err = synthesize_cli(loop, "boom", "--address", cluster.public, "-o", os.devnull)
    assert code == 1 and "stage 'engine' failed" in err


def test_synthesize_into_a_pipe_whose_reader_left_says_so_and_cancels(served, tmp_path):
    """A player closed mid-stream: one error line, exit 1, no traceback of Python's own flush at exit."""
    loop, cluster = served
    go = tmp_path / "go"

    async def run() -> tuple[int, bytes]:
        read, write = os.pipe()
        args = (f"one waitfor={go} three", "-o", "-", "--format", "pcm", "--address", cluster.public)
        process = await start_cli(*args, stdout=write)
        os.close(write)
        try:
            first = await asyncio.wait_for(asyncio.to_thread(os.read, read, 320), 20)
            assert len(first) > 0
        finally:
            os.close(read)  # the player leaves
            go.touch()
        _, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode, err

    code, err = loop.run_until_complete(run())
    assert (code, err.decode()) == (1, "error: cannot write -o -: Broken pipe\n")


def test_synthesize_dialling_an_http1_server_names_it_as_the_admin_commands_do(served):
    """`synthesize --address <the HTTP API's port>` printed gRPC's own `Failed parsing HTTP/2 ...` inside "cannot
    reach the daemon"; `status` dialled at it explains it is an HTTP/1.x server."""
    import http.server
    import threading

    loop, _ = served
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        address = f"127.0.0.1:{web.server_address[1]}"
        try:
            code, _, err = synthesize_cli(loop, "words", "--address", address, "-o", os.devnull, "--timeout", "10")
        finally:
            web.shutdown()
    assert code == 1 and err.startswith(
        f"error: {address} answers, but not with gRPC (it does not speak HTTP/2): an HTTP/1.x server, such as a "
        "daemon's HTTP API (--http); give --address the address the daemon's log shows as `public endpoint "
        "listening on ...`"
    ), err
