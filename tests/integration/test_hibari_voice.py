"""The default voice through `stagevisor serve`: hibari's own samples in every valid topology.

Scenario:
1. `stagevisor serve` with no model (the default voice), the vocoder isolated,
   every stage in a process of its own, and replicas of the isolated engine and
   vocoder start side by side;
2. each answers the same three-sentence text (the default noise seed, then
   seed 7 at speed 1.25), several requests at once where there are replicas;
3. every answer is 24 kHz PCM equal, byte for byte, to the package's own
   `Hibari()(text, speed, seed)` converted to 16-bit PCM as the Synthesis
   service converts (no bound needed: the stages call the package's G2P, ONNX
   session with its default single thread, and DSP with one Generator per
   request advanced in sentence order);
4. the engine ~> vocoder stream carried the acoustic frames (about 1 MB per
   audio second) over gRPC where the vocoder is isolated.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hibari import Hibari

from tests.integration.daemon_helpers import ServeProcess, synthesize

TEXT = (
    "Good evening. The weather today is bright and clear, with a gentle breeze from the west! "
    "On the 3rd of March 2024, 1,250 people paid $9.99 each."
)
TOPOLOGIES = {
    "default": [],
    "vocoder isolated": ["--isolate-stage", "vocoder"],
    "each stage alone": [
        "--isolate-stage",
        "preprocessing",
        "--isolate-stage",
        "tts_engine",
        "--isolate-stage",
        "vocoder",
    ],
    "replicas": [
        "--isolate-stage",
        "tts_engine",
        "--isolate-stage",
        "vocoder",
        "--process-replicas",
        "tts_engine=2",
        "--process-replicas",
        "vocoder=2",
    ],
}
OPTIONS = ({}, {"seed": "7", "speed": "1.25"})


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def expected() -> list[bytes]:
    """The package's own synthesis of TEXT for each entry of OPTIONS."""
    package = Hibari()
    return [pcm16(package(TEXT, speed=float(o.get("speed", 1.0)), seed=int(o.get("seed", 0)))) for o in OPTIONS]


@pytest.fixture(scope="module")
def daemons():
    """Every topology but `replicas`, started side by side."""
    with contextlib.ExitStack() as stack:
        started = {
            name: stack.enter_context(ServeProcess(*args)) for name, args in TOPOLOGIES.items() if name != "replicas"
        }
        for daemon in started.values():
            daemon.wait_serving()
        yield started


@pytest.fixture(scope="module")
def replicas_daemon():
    with ServeProcess(*TOPOLOGIES["replicas"]) as daemon:
        daemon.wait_serving()
        yield daemon


@pytest.mark.parametrize(
    "topology",
    [
        *(name for name in TOPOLOGIES if name != "replicas"),
        # Five workers: the quick subset (-m 'not slow') leaves it out; "each stage alone" already crosses every
        # edge, and test_replicas_daemon.py (slow) serves replicas under load.
        pytest.param("replicas", marks=pytest.mark.slow),
    ],
)
def test_every_topology_speaks_the_package_own_samples(request, daemons, expected, topology):
    daemon = request.getfixturevalue("replicas_daemon") if topology == "replicas" else daemons[topology]
    copies = 4 if topology == "replicas" else 1  # several at once, so both replicas of a group serve
    for options, wanted in zip(OPTIONS, expected, strict=True):
        with ThreadPoolExecutor(copies) as pool:
            answers = list(pool.map(synthesize, [daemon.listen] * copies, [TEXT] * copies, [options] * copies))
        for pcm, rate in answers:
            assert rate == 24000
            assert len(pcm) == len(wanted) and pcm == wanted, f"{topology} {options}: not the package's samples"


def test_the_default_model_is_hibari_and_its_frames_cross_the_isolated_edge(daemons):
    default = daemons["default"].topology()
    assert default["model"] == "demo"
    assert [(s["name"], s["process"]) for s in default["stages"]] == [
        ("preprocessing", "pipeline"),
        ("tts_engine", "pipeline"),
        ("vocoder", "pipeline"),
    ]
    isolated = daemons["vocoder isolated"]

    def frames_edge() -> dict:
        [edge] = [
            e
            for e in isolated.topology()["edges"]
            if (e["src"], e["dst"], e["kind"]) == ("tts_engine", "vocoder", "stream_to")
        ]
        return edge

    before = frames_edge()["requests"].get("grpc", 0)  # whatever other tests sent through it, in any order
    synthesize(isolated.listen, TEXT, OPTIONS[0])  # a stream of three sentences' frames
    edge = frames_edge()
    assert edge["cross_process"] and edge["requests"] == {"grpc": before + 1}, edge
