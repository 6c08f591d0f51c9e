"""What `stagevisor serve` prints while it starts: one format, a line per step, no library noise."""

from __future__ import annotations

import re
import socket
import subprocess

from tests.integration.daemon_helpers import ROOT, ServeProcess, poll_until

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \[[\w/]+ pid \d+\] [\w.]+: ")


def test_serve_says_what_it_is_doing_at_each_step_in_one_format():
    """Steps: start serve on the demo with the vocoder isolated and HTTP on;
    the log is lines of one format: starting first, then the endpoints, loading, each stage being built,
    each group READY with its time, and READY for the daemon last; nothing from uvicorn or gRPC core."""
    with ServeProcess("--model-path", "demo", "--isolate-stage", "vocoder", "--http", "127.0.0.1:0") as daemon:
        daemon.wait_serving()
        lines = daemon.log().splitlines()
    assert lines and all(LINE.match(line) for line in lines), "\n".join(lines)
    messages = [line.split(": ", 1)[1] for line in lines]
    assert messages[0] == "starting: model demo, 2 process groups (pipeline, vocoder)"
    assert messages[-1].startswith("READY: 2 process groups, ") and messages[-1].endswith("s after serve started")

    def first(prefix: str) -> int:
        return next(i for i, message in enumerate(messages) if message.startswith(prefix))

    assert first("admin API listening on") < first("loading:") < first("loaded in") < first("group 'pipeline': ")
    for group, stage in (("pipeline", "tts_engine"), ("vocoder", "vocoder")):
        assert first(f"building stage '{stage}'") < first(f"group '{group}': STARTING -> READY")
        assert re.search(rf"group '{group}': STARTING -> READY pid \d+ \(started in [\d.]+s", "\n".join(messages))
    assert not [line for line in lines if "uvicorn" in line or "Started server process" in line]


def test_a_port_in_use_is_one_clean_error_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = ServeProcess("--model-path", "demo")
        result = subprocess.run(
            [*daemon.argv[:-2], "--listen", f"127.0.0.1:{port}"],
            cwd=ROOT,
            # As an operator runs it: no GRPC_VERBOSITY of their own (a test that ran the CLI's main in this
            # process may have left the one main() sets for its children).
            env={k: v for k, v in daemon.env.items() if k != "GRPC_VERBOSITY"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        daemon.__exit__(None, None, None)
    errors = [line for line in result.stderr.splitlines() if not LINE.match(line)]
    assert result.returncode == 1
    assert errors == [
        f"error: ADDRESS_IN_USE: cannot listen on 127.0.0.1:{port} (--listen): port {port} on 127.0.0.1 is already in "
        "use (another stagevisor daemon or another program); choose another --listen"
    ]
    assert "add_port" not in result.stderr


def test_a_config_voice_mapped_onto_no_voice_of_the_model_is_a_warning_once_the_workers_are_ready(tmp_path):
    """Before: a typo in the config's `voices` (`reader: hearts`) was found only by a client's 400."""
    config = tmp_path / "voices.yaml"
    config.write_text("model_path: demo\nvoices:\n  narrator: heart\n  reader: hearts\n")
    with ServeProcess("--config", str(config), "--http", "127.0.0.1:0") as daemon:
        daemon.wait_serving()
        warning = poll_until(
            lambda: [line for line in daemon.log().splitlines() if " WARNING " in line],
            timeout=30,
            message="a WARNING in the log",
        )
    assert len(warning) == 1, warning
    assert warning[0].endswith(
        "the config's `voices` maps 'reader' onto 'hearts', which is not a voice of the model (its voices: 'heart'); "
        "requests for 'reader' get 400 voice_not_found until that entry names one of them"
    )


def test_status_says_where_the_daemon_serves_as_bound():
    """`--listen 127.0.0.1:0`: the port the daemon got was only in its log; `status` now says it, with the HTTP
    API's URL, and a client reaches the daemon there."""
    from tests.integration.daemon_helpers import synthesize

    daemon = ServeProcess("--model-path", "demo", "--http", "127.0.0.1:0")
    daemon.argv[daemon.argv.index(daemon.listen)] = "127.0.0.1:0"  # the fixture's own unix socket, replaced
    with daemon:
        status = daemon.wait_serving()
        http_url = daemon.http_url()
        shown = daemon.cli("status")
        pcm, rate = synthesize(status["listen"], "Hello.")
    host, port = status["listen"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0 and status["http_url"] == http_url
    assert f"listen: {status['listen']}" in shown.stdout and f"http: {http_url}" in shown.stdout
    assert rate == 24000 and len(pcm) > 0
