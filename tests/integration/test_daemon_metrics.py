"""Metrics, budgets and `stagevisor top` against real daemons: /metrics parsed with the client's own
parser, exact counters across a worker restart, a group over its RSS budget flagged everywhere, and
`top` in a pseudo-terminal."""

from __future__ import annotations

import pytest
import dataclasses
import fcntl
import json
import queue
import os
import pty
import re
import select
import struct
import subprocess
import threading
import sys
import termios
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from stagevisor.supervisor.plan import Edge
from tests.integration.daemon_helpers import ROOT, DaemonProcess, make_plan, poll_until, synthesize

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

HOG = "tests.integration.daemon_stages:make_hog"


def scrape(url: str) -> dict:
    """{(sample name, frozenset(labels)): value}, parsed by prometheus_client's text parser."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def three_stage_plan():
    """a -> b in-process (group front), b -> c over a cross-process edge (group back)."""
    return make_plan(
        "metrics-test", [("a", "front", None, None), ("b", "front", None, None), ("c", "back", None, None)]
    )


def counts(samples: dict, expected: int) -> bool:
    return (
        value(samples, "stagevisor_requests_total", model="metrics-test", outcome="success", code="OK") == expected
        and value(samples, "stagevisor_edge_handoffs_total", src="a", dst="b", transport="in_process") == expected
        and value(samples, "stagevisor_edge_handoffs_total", src="b", dst="c", transport="grpc") == expected
        and all(
            value(samples, "stagevisor_stage_processing_seconds_count", stage=s, group=g) == expected
            and value(samples, "stagevisor_stage_calls_total", stage=s, group=g) == expected
            for s, g in (("a", "front"), ("b", "front"), ("c", "back"))
        )
    )


def synthesize_with_timings(daemon: DaemonProcess, text: str) -> subprocess.CompletedProcess:
    """`stagevisor synthesize TEXT --timings` against `daemon`, its audio discarded: the waterfall on stdout."""
    return subprocess.run(
        [sys.executable, "-m", "stagevisor", "synthesize", text, "--timings", "-o", os.devnull]
        + ["--address", daemon.listen],
        cwd=ROOT,
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_metrics_count_every_request_and_handoff_exactly_and_survive_a_worker_restart():
    """1. Send 5 requests; /metrics shows exactly 5 per counter, stage histograms observed.
    2. Restart the `back` worker (new pid), send 3 more: every counter reads 8, not 3 and not 13.
    """
    with DaemonProcess(three_stage_plan(), "--metrics", "127.0.0.1:0") as daemon:
        url = daemon.wait_serving()["metrics_url"]
        assert url.startswith("http://127.0.0.1:")
        for _ in range(5):
            synthesize(daemon.listen, "hello")
        # Resource gauges come from the daemon's periodic sample: wait for the first one after READY too.
        first = poll_until(
            lambda: (
                (s := scrape(url))
                and counts(s, 5)
                and value(s, "stagevisor_group_resident_memory_bytes", group="back") > 0
                and s
            ),
            timeout=20,
            message="5 requests in every counter and a resource sample of `back`",
        )
        assert value(first, "stagevisor_request_duration_seconds_count", model="metrics-test") == 5
        assert value(first, "stagevisor_edge_bytes_total", src="b", dst="c", transport="grpc") > 0
        assert value(first, "stagevisor_group_resident_memory_bytes", group="back") > 0
        cpu_before = value(first, "stagevisor_group_cpu_seconds_total", group="back")

        restarted = daemon.cli("restart", "back")
        assert restarted.returncode == 0, restarted.stderr
        for _ in range(3):
            synthesize(daemon.listen, "again")
        after = poll_until(
            lambda: (s := scrape(url)) and counts(s, 8) and s,
            timeout=20,
            message="8 requests in every counter after the restart",
        )
        assert value(after, "stagevisor_group_restarts_total", group="back") == 1
        assert value(after, "stagevisor_group_cpu_seconds_total", group="back") >= cpu_before
        assert counts(scrape(url), 8)  # exact: a later scrape has not moved them


def read_until(proc: subprocess.Popen, predicate, timeout: float) -> list[str]:
    """Lines of `proc`'s stdout until one satisfies `predicate`. A thread reads them: select() on a buffered
    pipe misses lines that arrived together (the events replay sends its history at once)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        if predicate(line):
            return seen
    raise AssertionError(f"no matching line within {timeout}s; got {seen}")


def test_group_over_its_rss_budget_is_flagged_in_topology_status_events_and_metrics():
    """A test executor holds 128 MiB once asked to; its group's --rss-budget is 100 MiB.

    Before: within budget. After the request: an events WARNING line, OVER BUDGET in topology
    and status (table and JSON), a status warning line and stagevisor_group_over_budget 1.
    """
    plan = make_plan(
        "budget-test", [("front", "front", None, None), ("hog", "hog", None, None)], factories={"hog": HOG}
    )
    with DaemonProcess(
        plan, "--metrics", "127.0.0.1:0", "--rss-budget", "hog=100M", "--resource-interval", "0.2"
    ) as daemon:
        url = daemon.wait_serving()["metrics_url"]
        status = poll_until(
            lambda: (s := daemon.admin_status()) and s["groups"][1]["resources"] and s,
            timeout=10,
            message="resources sampled",
        )
        hog = status["groups"][1]["resources"]
        assert not hog["over_budget"] and hog["memory_budget_bytes"] == 100 << 20 and hog["budget_kind"] == "rss"
        assert hog["gpu_memory_bytes"] is None  # a CPU group: n/a, not zero

        events = subprocess.Popen(
            [sys.executable, "-m", "stagevisor", "events", "--format", "json", "--admin-address", daemon.admin_address],
            cwd=ROOT,
            env=daemon.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            poll_until(lambda: select.select([events.stderr], [], [], 0)[0], timeout=20, message="events subscribed")
            synthesize(daemon.listen, "grow", options={"hog_mib": "128"})
            lines = read_until(events, lambda line: json.loads(line)["kind"] == "WARNING", timeout=15)
            warning = json.loads(lines[-1])
            assert warning["group"] == "hog" and "--rss-budget" in warning["reason"]
        finally:
            events.kill()
            events.wait(timeout=10)

        status = daemon.status()
        assert status["groups"][1]["resources"]["over_budget"]
        assert any("'hog'" in w and "--rss-budget" in w for w in status["warnings"])
        table = daemon.cli("status").stdout
        assert "OVER BUDGET" in table and "warning: group 'hog'" in table
        topology = daemon.topology()
        assert topology["groups"][1]["resources"]["over_budget"]
        assert "OVER BUDGET" in daemon.cli("topology").stdout
        samples = scrape(url)
        assert value(samples, "stagevisor_group_over_budget", group="hog") == 1
        assert value(samples, "stagevisor_group_over_budget", group="front") == 0
        assert value(samples, "stagevisor_group_budget_warnings_total", group="hog") == 1
        assert value(samples, "stagevisor_group_memory_budget_bytes", group="hog", kind="rss") == 100 << 20


def test_top_shows_every_group_in_a_terminal_and_quits_on_q():
    plan = make_plan("top-test", [("a", "alpha", None, None), ("b", "beta", None, None)])
    with DaemonProcess(plan) as daemon:
        daemon.wait_serving()
        synthesize(daemon.listen, "hello")
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        top = subprocess.Popen(
            [sys.executable, "-m", "stagevisor", "top", "--interval", "0.2", "--admin-address", daemon.admin_address],
            cwd=ROOT,
            env={**daemon.env, "TERM": "xterm"},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        screen = b""
        try:

            def drawn() -> bool:
                nonlocal screen
                while select.select([master], [], [], 0.05)[0]:
                    screen += os.read(master, 65536)
                return b"q or Ctrl-C: quit" in screen and screen.count(b"\x1b[H") >= 2

            poll_until(drawn, timeout=20, message="two frames of top")
            text = screen.decode(errors="replace")
            for name in ("alpha", "beta", "READY", "STAGE", "P99"):
                assert name in text, name
            os.write(master, b"q")
            assert top.wait(timeout=10) == 0
            while select.select([master], [], [], 0.05)[0]:
                try:
                    screen += os.read(master, 65536)
                except OSError:
                    break
            assert screen.rstrip().endswith(b"\x1b[?1049l")  # left the alternate screen: terminal restored
        finally:
            if top.poll() is None:
                top.kill()
                top.wait(timeout=10)
            os.close(master)


def test_synthesize_timings_show_each_stage_and_handoff_and_audio_metrics_count_chunks():
    """tokenize -> engine in-process, engine streams 3 latent chunks to vocoder in another process.

    `synthesize --timings` prints a bar per stage and each handoff with its transport; /metrics has
    3 chunks on the cross-process edge, one time to first audio, and 2 gaps between 3 audio chunks.
    """
    plan = make_plan(
        "timings-test",
        [("tokenize", "front", None, None), ("engine", "front", None, None), ("vocoder", "vocoder", None, None)],
        factories={name: f"tests.integration.daemon_stages:make_{name}" for name in ("tokenize", "engine", "vocoder")},
    )
    with DaemonProcess(plan, "--metrics", "127.0.0.1:0") as daemon:
        url = daemon.wait_serving()["metrics_url"]
        result = synthesize_with_timings(daemon, "one two three")
        assert result.returncode == 0, result.stderr
        out = result.stdout
        for line in (
            "tokenize (front)",
            "engine (front)",
            "vocoder (vocoder)",
            "first audio",
            "handoff tokenize -> engine via in_process",
            "handoff engine -> vocoder via grpc",
        ):
            assert line in out, f"{line!r} not in:\n{out}"
        assert out.count("#") >= 3
        samples = poll_until(
            lambda: (
                (s := scrape(url))
                and value(s, "stagevisor_edge_chunks_total", src="engine", dst="vocoder", transport="grpc") == 3
                and s
            ),
            timeout=20,
            message="3 chunks on engine -> vocoder",
        )
        model = {"model": "timings-test"}
        assert value(samples, "stagevisor_time_to_first_audio_seconds_count", **model) == 1
        assert value(samples, "stagevisor_audio_chunk_gap_seconds_count", **model) == 2
        assert value(samples, "stagevisor_real_time_factor_count", **model) == 1
        assert value(samples, "stagevisor_playback_stall_seconds_count", **model) == 1
        assert value(samples, "stagevisor_audio_seconds_total", **model) == 3 * 160 / 16000


def test_timings_of_an_entry_stage_that_ran_while_its_trace_crossed_to_another_process_end_when_it_returned():
    """opener streams to relay in its process; relay streams to speaker in another one, while opener still runs.

    1. relay's stream opens in speaker's worker with opener's span still open (it had not returned).
    2. opener returns, relay returns, speaker works 0.3 s more after its stream ends.
    3. `synthesize --timings` says when opener really ended: before speaker did, not at the request's end.
    """
    stages = {name: f"tests.integration.daemon_stages:make_{name}" for name in ("opener", "relay")}
    plan = make_plan(
        "crossing-timings",
        [("opener", "front", None, None), ("relay", "front", None, None), ("speaker", "back", None, None)],
        factories={**stages, "speaker": "tests.integration.daemon_stages:make_late_speaker"},
    )
    opener = dataclasses.replace(plan.stages[0], stream_to=("relay",))
    plan = dataclasses.replace(
        plan,
        stages=(opener, *plan.stages[1:]),
        edges=(*plan.edges, Edge("opener", "relay", "stream_to", False, True)),
    )
    with DaemonProcess(plan) as daemon:
        daemon.wait_serving()
        result = synthesize_with_timings(daemon, "one")
    assert result.returncode == 0, result.stderr
    bars = {
        line.split()[0]: [float(ms) for ms in re.findall(r"(?:start|took) ([0-9.]+) ms", line)]
        for line in result.stdout.splitlines()
        if " ms, took " in line
    }
    assert set(bars) == {"opener", "relay", "speaker"}, result.stdout
    opener_end, speaker_end = sum(bars["opener"]), sum(bars["speaker"])
    assert opener_end < speaker_end - 200, result.stdout  # speaker's last 0.3 s came after opener returned


def test_metrics_address_in_use_stops_the_daemon_naming_the_option():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with DaemonProcess(
            make_plan("bind-test", [("a", "g", None, None)]), "--metrics", f"127.0.0.1:{port}"
        ) as daemon:
            assert daemon.wait_exit(timeout=60) == 1
            assert (
                f"ADDRESS_IN_USE: cannot listen on 127.0.0.1:{port} (--metrics): port {port} on 127.0.0.1 is already "
                "in use (another stagevisor daemon or another program); choose another --metrics HOST:PORT"
            ) in daemon.log()


def test_serve_refuses_an_rss_budget_for_an_unknown_group_before_starting():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "serve",
            "--rss-budget",
            "nosuch=1G",
            "--admin-address",
            "unix:/nonexistent/admin.sock",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--rss-budget names no process group 'nosuch'" in result.stderr
