"""Every built-in model with stand-in executors serves speech through `stagevisor serve`, declared and overridden.

Scenario, per model:
1. `stagevisor serve --model-path MODEL` (its declared topology) answers a short
   and a long sentence (the default noise seed: repeatable audio);
2. the same daemon command with a valid placement override from the spec
   (usually `--isolate-stage vocoder`), started alongside the first, answers
   the same requests (the demo model's declared daemon is the module's
   reference, started once);
3. both give PCM bit-identical to the demo model's (every stand-in runs on the
   default voice), which is non-silent and longer for the longer text;
4. each daemon runs exactly one worker per process group, its topology is the
   plan's JSON plus runtime fields, and every edge reports the transport the
   requests really crossed it with; it starts a fork server only when a group
   has no GPU stage (only CPU groups fork from it).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass

import numpy as np
import pytest

from stagevisor.supervisor import cli
from tests.integration.daemon_helpers import ROOT, ServeProcess, descendants, plan_part, synthesize, worker_pids

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

SHORT = "Hello there."
LONG = "Hello there. The vocoder turns latent frames into speech, one chunk at a time."

# (model, a valid override from the spec). MOSS-TTS Local (split) rejects every
# split, so its only valid requests are no-ops; Audar-TTS and Zonos2 ship no
# recommended fractions, so their split comes with a YAML that declares them.
CASES = [
    ("demo", ["--isolate-stage", "vocoder"]),
    ("higgs-tts", ["--isolate-stage", "audio_encoder"]),
    ("fishaudio-s2-pro", ["--isolate-stage", "vocoder"]),
    ("voxtral-tts", ["--isolate-stage", "vocoder"]),
    ("ming-omni-tts", ["--isolate-stage", "vocoder"]),
    ("moss-tts-local", ["--isolate-stage", "vocoder"]),
    ("moss-tts-local-split", ["--stage-process", "vocoder=pipeline"]),
    ("moss-tts-delay", ["--isolate-stage", "vocoder"]),
    ("audar-tts", ["--config", "deploy/examples/audar-tts.yaml"]),
    ("zonos2", ["--config", "deploy/examples/zonos2.yaml"]),
]


@dataclass(frozen=True)
class Speech:
    short: bytes
    long: bytes
    sample_rate: int


@dataclass(frozen=True)
class Served:
    """What one daemon said and ran: its speech, its topology afterwards, its worker pids."""

    speech: Speech
    topology: dict
    workers: list[int]
    fork_server: bool
    """Whether one of the daemon's other descendants is multiprocessing's fork server."""


def plan_json(*placement: str) -> dict:
    """What `stagevisor plan PLACEMENT --format json` prints, run in this process from the repository root.

    The CLI's own `main`, without an interpreter start per call (the CLI process itself is
    tested in tests/integration/test_cli_process.py); the daemons of this file also run from ROOT.
    """
    out, err = io.StringIO(), io.StringIO()
    cwd, grpc_verbosity = os.getcwd(), os.environ.get("GRPC_VERBOSITY")
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["plan", *placement, "--format", "json"])
    finally:
        os.chdir(cwd)
        if grpc_verbosity is None:  # main() sets it for the processes it starts
            os.environ.pop("GRPC_VERBOSITY", None)
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


VOICES = ("demo", "piper")
"""The models with real executors; every other built-in runs stand-ins, served only with --stand-ins."""


def serve_args(placement: list[str]) -> list[str]:
    """`serve`'s arguments for a placement: a seed model's stand-ins must be asked for."""
    model = placement[placement.index("--model-path") + 1]
    return placement if model in VOICES else [*placement, "--stand-ins"]


def serve_and_speak(*placements: list[str]) -> list[Served]:
    """Start `serve PLACEMENT` for each placement at once, synthesize both sentences on each, stop them.

    The daemons start side by side (each one's start is mostly one process at a time, so two
    keep both cores busy); the requests go to one daemon at a time.
    """
    with contextlib.ExitStack() as stack:
        daemons = [stack.enter_context(ServeProcess(*serve_args(placement))) for placement in placements]
        for daemon in daemons:
            daemon.wait_serving()
        served = []
        for daemon in daemons:
            short, rate = synthesize(daemon.listen, SHORT)
            long, long_rate = synthesize(daemon.listen, LONG)
            assert rate == long_rate
            workers = worker_pids(daemon.pid)
            helpers = [cmdline(pid) for pid in descendants(daemon.pid) if pid not in workers]
            served.append(
                Served(
                    Speech(short, long, rate),
                    daemon.topology(),
                    sorted(workers),
                    any("forkserver" in line for line in helpers),
                )
            )
        return served


def check_topology(served: Served, placement: list[str]) -> None:
    topology = served.topology
    assert plan_part(topology) == plan_json(*placement)
    model = placement[placement.index("--model-path") + 1]
    assert {s["stand_in"] for s in topology["stages"]} == {model not in VOICES}
    assert served.workers == sorted(g["pid"] for g in topology["groups"])
    assert all(g["state"] == "READY" for g in topology["groups"])
    # CPU groups fork from the fork server; where every group has a GPU stage (spawned) none is started.
    assert served.fork_server == any(g["gpu"] is None for g in topology["groups"]), topology["groups"]
    for edge in topology["edges"]:
        used = "grpc" if edge["cross_process"] else "in_process"
        assert edge["transport"] == used, edge
        assert set(edge["requests"]) == {used} and edge["requests"][used] == 2, edge


DEMO = ["--model-path", "demo"]


@pytest.fixture(scope="module")
def demo_served() -> Served:
    """The demo model as declared: the reference speech, and the `demo` case's declared daemon."""
    return serve_and_speak(DEMO)[0]


def test_demo_speech_is_speech_shaped(demo_served):
    demo_speech = demo_served.speech
    for pcm in (demo_speech.short, demo_speech.long):
        samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
        assert np.sqrt(np.mean(samples**2)) > 300, "audio is (nearly) silent"
        assert np.abs(samples).max() > 3000
        silent_windows = np.mean(np.abs(samples[: len(samples) // 256 * 256].reshape(-1, 256)).max(axis=1) < 100)
        assert silent_windows < 0.5, "mostly silence"
    assert demo_speech.sample_rate == 24000
    short_s = len(demo_speech.short) / 2 / demo_speech.sample_rate
    long_s = len(demo_speech.long) / 2 / demo_speech.sample_rate
    assert 0.3 < short_s < long_s / 2, (short_s, long_s)


@pytest.mark.parametrize("model,override", CASES, ids=[case[0] for case in CASES])
def test_model_speaks_identically_declared_and_overridden(model, override, demo_served):
    placements = [["--model-path", model], ["--model-path", model, *override]]
    # The demo model as declared is the module's reference daemon: not started a second time.
    started = serve_and_speak(*(p for p in placements if p != DEMO))
    for placement in placements:
        served = demo_served if placement == DEMO else started.pop(0)
        assert served.speech == demo_served.speech, f"{' '.join(placement)} changed the audio"
        check_topology(served, placement)
