"""Every built-in model serves real speech through `stagevisor serve`, declared and with a spec override.

Scenario, per model:
1. `stagevisor serve --model-path MODEL` (its declared topology) answers a short
   and a long sentence with both noise scales at 0;
2. then the same daemon command with a valid placement override from the spec
   (usually `--isolate-stage vocoder`) answers the same requests;
3. both give PCM bit-identical to the demo model's (every stand-in runs on the
   embedded voice), which is non-silent and longer for the longer text;
4. each daemon runs exactly one worker per process group, its topology is the
   plan's JSON plus runtime fields, and every edge reports the transport the
   requests really crossed it with.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from tests.integration.daemon_helpers import ROOT, ServeProcess, plan_part, synthesize, worker_pids

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
    ("qwen3-tts", ["--isolate-stage", "vocoder"]),
    ("moss-tts-delay", ["--isolate-stage", "vocoder"]),
    ("audar-tts", ["--config", "deploy/examples/audar-tts.yaml"]),
    ("zonos2", ["--config", "deploy/examples/zonos2.yaml"]),
]


@dataclass(frozen=True)
class Speech:
    short: bytes
    long: bytes
    sample_rate: int


def plan_json(*placement: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "stagevisor", "plan", *placement, "--format", "json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def serve_and_speak(*placement: str) -> tuple[Speech, dict, list[int]]:
    """Start `serve PLACEMENT`, synthesize both sentences, return the speech, topology and worker pids."""
    with ServeProcess(*placement) as daemon:
        daemon.wait_serving()
        short, rate = synthesize(daemon.listen, SHORT)
        long, long_rate = synthesize(daemon.listen, LONG)
        assert rate == long_rate
        return Speech(short, long, rate), daemon.topology(), sorted(worker_pids(daemon.pid))


def check_topology(topology: dict, workers: list[int], placement: list[str]) -> None:
    assert plan_part(topology) == plan_json(*placement)
    assert workers == sorted(g["pid"] for g in topology["groups"])
    assert all(g["state"] == "READY" for g in topology["groups"])
    for edge in topology["edges"]:
        used = "grpc" if edge["cross_process"] else "in_process"
        assert edge["transport"] == used, edge
        assert set(edge["requests"]) == {used} and edge["requests"][used] == 2, edge


@pytest.fixture(scope="module")
def demo_speech() -> Speech:
    speech, _, _ = serve_and_speak("--model-path", "demo")
    return speech


def test_demo_speech_is_speech_shaped(demo_speech):
    for pcm in (demo_speech.short, demo_speech.long):
        samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
        assert np.sqrt(np.mean(samples**2)) > 300, "audio is (nearly) silent"
        assert np.abs(samples).max() > 3000
        silent_windows = np.mean(np.abs(samples[: len(samples) // 256 * 256].reshape(-1, 256)).max(axis=1) < 100)
        assert silent_windows < 0.5, "mostly silence"
    assert demo_speech.sample_rate == 22050
    short_s = len(demo_speech.short) / 2 / demo_speech.sample_rate
    long_s = len(demo_speech.long) / 2 / demo_speech.sample_rate
    assert 0.3 < short_s < long_s / 2, (short_s, long_s)


@pytest.mark.parametrize("model,override", CASES, ids=[case[0] for case in CASES])
def test_model_speaks_identically_declared_and_overridden(model, override, demo_speech):
    for placement in (["--model-path", model], ["--model-path", model, *override]):
        speech, topology, workers = serve_and_speak(*placement)
        assert speech == demo_speech, f"{' '.join(placement)} changed the audio"
        check_topology(topology, workers, placement)
