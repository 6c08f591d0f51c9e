"""`stagevisor serve --model-path DIR` on tiny random Qwen3-TTS checkpoints: real workers, real gRPC.

Scenario:
1. a CustomVoice checkpoint built at test time (tests/qwen3_tiny.py) is served
   declared (one `pipeline` process) and with the vocoder in a process of its own;
2. a seeded request for a preset speaker gets, from both, the same PCM, within
   one 16-bit step of qwen-tts's own generate() + whole decode of the same text,
   speaker and seed (rounded as the service rounds);
3. its first audio reaches the client before the engine stage has finished;
4. a Base checkpoint clones a voice from reference audio and its transcript.
Needs the qwen3 extra; skipped without it (tests/markers.py).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tests.integration.daemon_helpers import ServeProcess
from tests.integration.qwen3_client import FRAMES, PCM_BOUND, SEED, TEXT, call, package_pcm

pytestmark = [pytest.mark.qwen3, pytest.mark.worker_torch, pytest.mark.timeout(900)]

TRANSCRIPT = "A reference transcript for voice cloning."


@pytest.fixture(scope="module")
def custom_voice(tmp_path_factory) -> str:
    from tests.qwen3_tiny import build

    return str(build(tmp_path_factory.mktemp("qwen3") / "custom_voice", "custom_voice"))


@pytest.fixture(scope="module")
def declared_and_isolated(custom_voice):
    with ServeProcess("--model-path", custom_voice, "--http", "127.0.0.1:0") as declared:
        with ServeProcess("--model-path", custom_voice, "--isolate-stage", "vocoder") as isolated:
            declared.wait_serving(timeout=600)
            isolated.wait_serving(timeout=600)
            yield declared, isolated


def test_a_preset_speaker_speaks_the_packages_audio_in_both_topologies(custom_voice, declared_and_isolated):
    declared, isolated = declared_and_isolated
    groups = [[g["name"] for g in daemon.topology()["groups"]] for daemon in (declared, isolated)]
    assert groups == [["pipeline"], ["pipeline", "vocoder"]]
    first, _, _ = call(declared.listen, voice="vivian")
    second, _, _ = call(isolated.listen, voice="vivian")
    assert np.array_equal(first, second), "declared and vocoder-isolated topologies must give identical audio"
    expected = package_pcm(custom_voice, speaker="vivian")
    assert first.shape == expected.shape == ((FRAMES - 1) * 1920,)
    assert np.abs(first.astype(np.int32) - expected).max() <= PCM_BOUND
    assert np.abs(expected).max() > 1000, "the tiny checkpoint must speak audibly for the comparison to mean much"


def test_the_first_audio_reaches_the_client_before_the_engine_has_finished(declared_and_isolated):
    for daemon in declared_and_isolated:
        _, timings, sizes = call(daemon.listen)
        engine = next(stage for stage in timings.stages if stage.stage == "tts_engine")
        # One frame's audio first (the engine streams its first frame at once), then the rest in chunks.
        assert sizes[0] == 1920 and len(sizes) >= 3
        assert 0 < timings.first_audio_seconds < engine.start_seconds + engine.duration_seconds


def test_concurrent_requests_with_one_seed_each_speak_what_one_alone_speaks(declared_and_isolated):
    """Three requests with the same seed at once through the daemon take turns on the talker: each one's draws
    come from its own generator state, so each gets the audio a request alone gets (one shared generator would give
    each a different part of one sequence)."""
    from concurrent.futures import ThreadPoolExecutor

    declared, _ = declared_and_isolated
    alone, _, _ = call(declared.listen, voice="ryan")
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda _: call(declared.listen, voice="ryan")[0], range(3)))
    assert all(np.array_equal(pcm, alone) for pcm in together)


def test_an_unknown_speaker_is_refused_with_its_code(declared_and_isolated):
    import grpc

    with pytest.raises(grpc.RpcError) as caught:
        call(declared_and_isolated[0].listen, voice="alloy")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The code travels beside the message, which says what to do without repeating it.
    assert dict(caught.value.trailing_metadata() or ())["stagevisor-error-code"] == "QWEN3_UNKNOWN_SPEAKER"
    assert "unknown voice 'alloy'" in caught.value.details() and "QWEN3_" not in caught.value.details()


ALARMS = ("flash-attn", "SoX could not be found", "sox: not found", "with default values")
"""What importing qwen-tts and loading a checkpoint would print about parts never served (stages/qwen3/package.py)."""


def test_the_operators_log_names_the_checkpoint_and_holds_no_alarms_from_qwen_tts(declared_and_isolated):
    for daemon in declared_and_isolated:
        log = daemon.log()
        assert "READY: 1 process group" in log or "READY: 2 process groups" in log
        assert not [alarm for alarm in ALARMS if alarm in log], log
        # --model-path may be a hub id: the log names the checkpoint served, what it does, and where it runs.
        assert "serving Qwen3-TTS CustomVoice 1b7 checkpoint " in log
        assert re.search(
            r"preset speakers ryan, vivian; follows instructions; languages auto.*\(on (cpu|cuda:0), ", log
        )


def test_building_a_stage_on_a_host_without_sox_writes_no_alarm(custom_voice):
    """A vocoder stage built in a fresh process whose PATH holds no `sox`, logging at INFO as a worker does."""
    import os
    import subprocess
    import sys

    from tests.integration.daemon_helpers import ROOT

    build = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from stagevisor.stages import qwen3\n"
        f"qwen3.vocoder({custom_voice!r}, dtype='float32')\n"
        "print('built')\n"
    )
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    done = subprocess.run([sys.executable, "-c", build], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "built"
    assert not [alarm for alarm in ALARMS if alarm in done.stderr], done.stderr


def http_json(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any, bytes]:
    """GET (no body) or POST JSON: (status, JSON body or None, raw body)."""
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get("Content-Type", "")
    return status, json.loads(raw) if kind.startswith("application/json") else None, raw


def test_the_http_api_lists_and_checks_the_sampling_options_and_decodes_greedily(declared_and_isolated):
    url = declared_and_isolated[0].http_url()
    status, models, _ = http_json(f"{url}/v1/models")
    options = models["data"][0]["accepts"]["options"]
    assert status == 200 and set(options) >= {"do_sample", "temperature", "subtalker_top_k", "max_new_tokens"}
    assert options["max_new_tokens"]["maximum"] == 4096  # the tiny checkpoint's default, 48, is below it
    speech = {"model": "qwen3-tts", "input": TEXT, "response_format": "pcm", "seed": int(SEED), "max_new_tokens": 8}
    status, error, _ = http_json(f"{url}/v1/audio/speech", {**speech, "top_k": "many"})
    assert (status, error["error"]["param"], error["error"]["code"]) == (400, "top_k", "invalid_type")
    status, error, _ = http_json(f"{url}/v1/audio/speech", {**speech, "temperature": 0})
    assert status == 400 and "0 is greedy decoding: set 'do_sample' false" in error["error"]["message"]
    greedy = {"do_sample": False, "temperature": 0, "subtalker_dosample": False, "subtalker_temperature": 0}
    status, _, pcm = http_json(f"{url}/v1/audio/speech", {**speech, **greedy})
    assert status == 200 and len(pcm) == 7 * 1920 * 2  # 8 steps, 7 frames of 1,920 samples, 16-bit


def test_the_http_api_refuses_a_speed_itself_naming_the_field_and_does_not_list_it(declared_and_isolated):
    """Before: /v1/models listed `speed` among the fields taken, a POST's `speed` came back from the stage as
    QWEN3_NO_SPEED with `param` null, and a WebSocket `start` with `speed` and no text ended with `done`."""
    import json

    from websockets.sync.client import connect

    url = declared_and_isolated[0].http_url()
    _, models, _ = http_json(f"{url}/v1/models")
    accepts = models["data"][0]["accepts"]
    assert accepts["speed"] is False and "speed" not in accepts["fields"]
    speech = {"model": "qwen3-tts", "input": TEXT, "response_format": "pcm", "seed": int(SEED), "max_new_tokens": 4}
    status, error, _ = http_json(f"{url}/v1/audio/speech", {**speech, "speed": 1.5})
    assert (status, error["error"]["param"], error["error"]["code"]) == (400, "speed", "invalid_value")
    status, _, pcm = http_json(f"{url}/v1/audio/speech", {**speech, "speed": 1})  # 1 changes nothing
    assert status == 200 and len(pcm) == 3 * 1920 * 2
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "speed": 0.5}))
        ws.send(json.dumps({"type": "end"}))
        event = json.loads(ws.recv(timeout=60))
    assert (event["type"], event["error"]["param"], event["error"]["code"]) == ("error", "speed", "invalid_value")


@pytest.fixture(scope="module")
def base_daemon(tmp_path_factory):
    from tests.qwen3_tiny import build

    directory = str(build(tmp_path_factory.mktemp("qwen3") / "base", "base"))
    with ServeProcess("--model-path", directory, "--http", "127.0.0.1:0") as daemon:
        daemon.wait_serving(timeout=600)
        yield directory, daemon


def test_a_base_checkpoint_clones_the_reference_voice(base_daemon):
    from stagevisor.stages.qwen3.executors import reference_wav
    from stagevisor.stages.reference import decode_reference_wav

    directory, daemon = base_daemon
    rng = np.random.default_rng(9)
    wav = reference_wav((0.2 * rng.standard_normal(16000 * 2)).astype(np.float32), 16000)
    pcm, _, _ = call(daemon.listen, reference_audio=wav, reference_transcript=TRANSCRIPT)
    expected = package_pcm(directory, ref_audio=decode_reference_wav(wav), ref_text=TRANSCRIPT)
    assert pcm.shape == expected.shape
    assert np.abs(pcm.astype(np.int32) - expected).max() <= PCM_BOUND


def test_a_stages_refusal_names_the_field_it_is_about_over_http_websocket_and_grpc(base_daemon):
    """Before: a stage's refusal came back over HTTP with `"param": null` (the field travelled nowhere), where the
    HTTP layer's own refusals name theirs: a Base checkpoint asked to speak without reference audio, or to follow
    `instructions`, said what to send, but not in `param`."""
    import json

    import grpc
    from websockets.sync.client import connect

    _, daemon = base_daemon
    url = daemon.http_url()
    speech = {"model": "qwen3-tts", "input": TEXT, "response_format": "pcm", "max_new_tokens": 4}
    status, error, _ = http_json(f"{url}/v1/audio/speech", speech)
    assert (status, error["error"]["param"], error["error"]["code"]) == (400, "ref_audio", "QWEN3_NEEDS_REFERENCE")
    status, error, _ = http_json(f"{url}/v1/audio/speech", {**speech, "instructions": "Whisper."})
    assert (status, error["error"]["param"], error["error"]["code"]) == (400, "instructions", "QWEN3_NO_INSTRUCTIONS")
    with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "max_new_tokens": 4}))
        ws.send(json.dumps({"type": "text", "text": "Hello there."}))
        ws.send(json.dumps({"type": "end"}))
        event = json.loads(ws.recv(timeout=120))
    assert (event["type"], event["error"]["param"]) == ("error", "ref_audio")
    with pytest.raises(grpc.RpcError) as caught:
        call(daemon.listen)
    trailers = dict(caught.value.trailing_metadata() or ())
    assert (trailers["stagevisor-error-code"], trailers["stagevisor-error-field"]) == (
        "QWEN3_NEEDS_REFERENCE",
        "reference_audio",
    )
