"""The OpenAI-compatible HTTP API of a real daemon on the demo voice, with the official `openai` SDK as client.

One daemon per topology for the whole module (`--http 127.0.0.1:0`, the
bound URL read from its log). Audio is decoded back with FFmpeg's decoders
(PyAV), independently of how the daemon encoded it.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import importlib.metadata
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import wave
from urllib.parse import urlencode, urlsplit

import av
import pytest
from openai import OpenAI

from tests.integration.browser import CHROMEDRIVER, CHROMIUM, MISSING_REASON, chromium
from tests.integration.daemon_helpers import NOISELESS, ServeProcess, poll_until, synthesize

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

TEXT = "The quick brown fox jumps over the lazy dog."
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
DETERMINISTIC = {"seed": 0}
VOICE = "heart"
# Codec framing: encoder delay and the last frame's padding (mp3 ~1700 samples at 24 kHz,
# AAC up to 2048, Opus 20 ms frames) lengthen what a decoder returns by up to about 0.1 s.
DURATION_TOLERANCE = 0.12


def start(*placement: str) -> ServeProcess:
    daemon = ServeProcess("--http", "127.0.0.1:0", *placement)
    daemon.__enter__()
    try:
        daemon.wait_serving()
        daemon.url = daemon.http_url()
    except BaseException:
        daemon.__exit__(None, None, None)
        raise
    return daemon


@pytest.fixture(scope="module")
def demo():
    daemon = start("--served-model-name", "my-voice", "--voices-dir", "none")
    yield daemon
    daemon.__exit__(None, None, None)


@pytest.fixture(scope="module")
def client(demo) -> OpenAI:
    return OpenAI(base_url=demo.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(demo) -> tuple[bytes, int]:
    """The gRPC Synthesize output for TEXT (deterministic): PCM and its rate."""
    return synthesize(demo.listen, TEXT, NOISELESS)


def decode(data: bytes, fmt: str, pcm_rate: int) -> tuple[int, float]:
    """(sample rate, seconds) of `data` as FFmpeg decodes it."""
    if fmt == "pcm":
        return pcm_rate, len(data) / 2 / pcm_rate
    with av.open(io.BytesIO(data), format={"opus": "ogg", "aac": "aac"}.get(fmt)) as container:
        samples, rate = 0, 0
        for frame in container.decode(audio=0):
            samples += frame.samples
            rate = frame.sample_rate
    return rate, samples / rate


def post(
    url: str,
    body: bytes | str | None,
    headers: dict[str, str] | None = None,
    *,
    path: str = "/v1/audio/speech",
    method: str = "POST",
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def speech_json(**fields) -> bytes:
    return json.dumps({"model": "demo", "input": TEXT, "voice": VOICE, **fields}).encode()


JSON = {"Content-Type": "application/json"}


# -- audio in every format ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_whole_and_streamed_decodes_to_the_synthesized_duration(client, reference, fmt):
    pcm, rate = reference
    expected = len(pcm) / 2 / rate
    whole = client.audio.speech.create(
        model="demo", voice=VOICE, input=TEXT, response_format=fmt, extra_body=DETERMINISTIC
    )
    with client.audio.speech.with_streaming_response.create(
        model="demo", voice=VOICE, input=TEXT, response_format=fmt, extra_body=DETERMINISTIC
    ) as response:
        assert response.headers["content-type"].startswith("audio/")
        header_rate = int(response.headers["x-sample-rate"])
        pieces = list(response.iter_bytes())
    streamed = b"".join(pieces)
    assert streamed == whole.content, "deterministic audio differs between two identical requests"
    decoded_rate, seconds = decode(whole.content, fmt, header_rate)
    # pcm is 24 kHz like OpenAI's; the other formats keep the model's rate (24 kHz for the default voice;
    # decoders always return Opus at 48 kHz)
    assert header_rate == {"pcm": 24000, "opus": 24000}.get(fmt, rate)
    assert decoded_rate == (48000 if fmt == "opus" else header_rate)
    assert expected - 0.01 <= seconds <= expected + DURATION_TOLERANCE, (fmt, seconds, expected)


def test_sse_stream_carries_the_audio_as_base64_deltas_then_done_with_usage(client, reference):
    pcm, rate = reference
    with client.audio.speech.with_streaming_response.create(
        model="demo",
        voice=VOICE,
        input=TEXT,
        response_format="pcm",
        stream_format="sse",
        extra_body={**DETERMINISTIC, "sample_rate": rate},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2, "the audio should arrive in several deltas as it is made"
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == pcm
    assert events[-1]["type"] == "speech.audio.done"
    usage = events[-1]["usage"]
    assert usage["input_characters"] == len(TEXT)
    assert usage["output_audio_seconds"] == round(len(pcm) / 2 / rate, 3)  # to the millisecond


def test_speed_reaches_the_voice(client, reference):
    pcm, rate = reference
    fast = client.audio.speech.create(
        model="demo",
        voice=VOICE,
        input=TEXT,
        response_format="pcm",
        speed=2.0,
        extra_body={**DETERMINISTIC, "sample_rate": rate},
    )
    ratio = len(fast.content) / len(pcm)
    assert 0.4 < ratio < 0.65, f"speed 2.0 gave {ratio:.2f} of the normal duration"


@pytest.fixture(scope="module")
def split():
    daemon = start("--isolate-stage", "vocoder")
    yield daemon
    daemon.__exit__(None, None, None)


@pytest.mark.parametrize("topology", ["demo", "split"])
def test_pcm_and_wav_are_bit_identical_to_grpc(topology, request):
    daemon = request.getfixturevalue(topology)
    pcm, rate = synthesize(daemon.listen, TEXT, NOISELESS)
    status, headers, body = post(
        daemon.url, speech_json(response_format="pcm", sample_rate=rate, **DETERMINISTIC), JSON
    )
    assert status == 200 and headers["content-type"] == "audio/pcm"
    assert body == pcm
    status, headers, wav = post(daemon.url, speech_json(response_format="wav", **DETERMINISTIC), JSON)
    assert status == 200 and headers["content-type"] == "audio/wav"
    assert wav[:4] == b"RIFF" and wav[8:16] == b"WAVEfmt "
    channels, header_rate, _, _, bits = struct.unpack("<HIIHH", wav[22:36])
    assert (channels, header_rate, bits) == (1, rate, 16)
    assert wav[36:40] == b"data" and wav[44:] == pcm


# -- what clients send at their defaults -----------------------------------------------------------


def test_the_openai_sdk_at_its_defaults_gets_24_khz_pcm_of_the_right_duration(client, reference):
    pcm, rate = reference
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm", extra_body=DETERMINISTIC
    ) as response:
        assert response.headers["x-sample-rate"] == "24000"
        audio = response.read()
    assert abs(len(audio) / 2 / 24000 - len(pcm) / 2 / rate) < 0.01


def test_gpt_4o_mini_tts_with_instructions_speaks(client, reference):
    _, rate = reference
    audio = client.audio.speech.create(
        model="gpt-4o-mini-tts",
        voice="coral",
        input=TEXT,
        instructions="Speak in a cheerful tone.",
        response_format="wav",
    )
    with wave.open(io.BytesIO(audio.content)) as wav:
        assert wav.getframerate() == rate and len(wav.readframes(10**7)) > rate  # over half a second


@pytest.mark.parametrize("voice", ["marin", "cedar"])
def test_the_sdks_dated_model_and_newer_voices_speak_as_the_default_voice(client, voice):
    """What the openai SDK's types offer today: `gpt-4o-mini-tts-2025-12-15` and the voices `marin` and `cedar`
    (both were refused: 404 model_not_found and 400 voice_not_found)."""
    audio = client.audio.speech.create(
        model="gpt-4o-mini-tts-2025-12-15", voice=voice, input=TEXT, response_format="pcm", extra_body=DETERMINISTIC
    )
    same = client.audio.speech.create(
        model="demo", voice=VOICE, input=TEXT, response_format="pcm", extra_body=DETERMINISTIC
    )
    assert audio.content == same.content and len(audio.content) > 24000


def test_a_plain_get_speaks_and_version_answers(demo):
    query = urlencode({"input": "Hello there.", "voice": "alloy", "response_format": "wav", "seed": 0})
    status, headers, body = post(demo.url, None, path=f"/v1/audio/speech?{query}", method="GET")
    assert status == 200 and headers["content-type"] == "audio/wav" and body[:4] == b"RIFF"
    status, _, body = post(demo.url, None, path="/v1/audio/speech?voice=alloy", method="GET")
    assert status == 400 and json.loads(body)["error"]["param"] == "input"
    status, _, body = post(demo.url, None, path="/version", method="GET")
    assert status == 200 and json.loads(body)["version"] == importlib.metadata.version("stagevisor")


SOXI = shutil.which("soxi")
FFPROBE = shutil.which("ffprobe")


@pytest.mark.skipif(
    not (SOXI and FFPROBE) and not os.environ.get("CI"),
    reason="sox and ffmpeg are not installed (apt-get install sox ffmpeg; CI installs them in .ci/run)",
)
def test_a_streamed_wav_opens_with_an_unknown_or_right_length_in_soxi_ffprobe_and_wave(demo, reference, tmp_path):
    assert SOXI and FFPROBE, "CI must install sox and ffmpeg (.ci/run)"
    _, rate = reference
    status, _, body = post(demo.url, speech_json(response_format="wav", **DETERMINISTIC), JSON)
    assert status == 200
    seconds = (len(body) - 44) / 2 / rate
    path = tmp_path / "streamed.wav"
    path.write_bytes(body)
    soxi = subprocess.run([SOXI, str(path)], capture_output=True, text=True, check=True, timeout=60).stdout
    assert "Duration" not in soxi and f"Sample Rate    : {rate}" in soxi  # SoX's "length unknown"
    probed = subprocess.run(
        [FFPROBE, "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert abs(float(probed) - seconds) < 0.01
    with wave.open(str(path)) as wav:
        assert wav.getframerate() == rate and len(wav.readframes(wav.getnframes())) == len(body) - 44


# -- streaming input over a WebSocket -------------------------------------------------------------


PIECES = [
    "The quick brown ",
    "fox jumps. ",
    "It lands ",
    "on the ",
    "lazy dog, ",
    "who does ",
    "not wake ",
    "up at ",
    "all. Then ",
    "it runs away.",
]


def test_a_websocket_client_hears_the_first_sentence_before_it_sends_the_last_piece(demo):
    """
    1. the real `websockets` client opens /v1/audio/speech/stream and sends text in 10 pieces;
    2. before the 10th piece it waits for the first sentence's audio, which must come;
    3. after `end`: every sentence's audio.start, PCM frames and audio.done, then `done` and a normal close.
    """
    from websockets.sync.client import connect

    url = demo.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "model": "tts-1", "voice": "alloy", **DETERMINISTIC}))
        for piece in PIECES[:-1]:
            ws.send(json.dumps({"type": "text", "text": piece}))
        events, audio = [], b""
        while not audio:
            message = ws.recv(timeout=60)
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
        assert events[0]["type"] == "audio.start" and events[0]["text"] == "The quick brown fox jumps."
        assert events[0]["sample_rate"] == 24000
        ws.send(json.dumps({"type": "text", "text": PIECES[-1]}))
        ws.send(json.dumps({"type": "end"}))
        for message in ws:
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
    starts = [e["text"] for e in events if e["type"] == "audio.start"]
    assert starts == [
        "The quick brown fox jumps.",
        "It lands on the lazy dog, who does not wake up at all.",
        "Then it runs away.",
    ]
    seconds = sum(e["audio_seconds"] for e in events if e["type"] == "audio.done")
    assert events[-1] == {"type": "done", "sentences": 3}
    assert abs(len(audio) / 2 / 24000 - seconds) < 0.01 and seconds > 2


def test_a_bad_websocket_message_gets_a_coded_error_and_a_policy_close(demo):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = demo.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "voice": "nobody"}))
        ws.send(json.dumps({"type": "text", "text": "Hello there. And"}))
        error = json.loads(ws.recv(timeout=60))
        assert error["type"] == "error" and error["error"]["code"] == "voice_not_found"
        assert error["error"]["param"] == "voice"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1008


def test_a_websocket_piece_with_nothing_to_speak_is_skipped_and_a_second_start_refused(demo):
    """An emoji alone between sentences (as an LLM writes) is not a sentence: the session goes on to the next one
    (as its own request it would fail as nothing speakable), and so does a sentence in a script the voice has no
    sounds for (it was spoken as 0.4 s of near-silence; refused as nothing speakable now, it would have ended the
    session). A `start` after the first message is a policy close."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = demo.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "text", "text": "Well done! \U0001f642. مرحبا بالعالم. See you."}))
        ws.send(json.dumps({"type": "end"}))
        events = [json.loads(m) for m in ws if isinstance(m, str)]
    assert [e["text"] for e in events if e["type"] == "audio.start"] == ["Well done!", "See you."]
    assert events[-1] == {"type": "done", "sentences": 2}
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "model": "tts-1"}))
        ws.send(json.dumps({"type": "start", "model": "tts-1"}))
        error = json.loads(ws.recv(timeout=60))
        assert error["error"]["message"] == "'start' comes only as the first message"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1008


def test_an_oversized_websocket_message_closes_the_session_with_1009(demo):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = demo.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(json.dumps({"type": "text", "text": "a" * 300_000}))
            ws.recv(timeout=30)
    assert closed.value.rcvd.code == 1009  # message too big


# -- the other endpoints ------------------------------------------------------------------------


def test_models_voices_health_and_ready(client, demo):
    models = client.models.list().data
    assert [m.id for m in models] == [
        "my-voice",
        "demo",
        "tts-1",
        "tts-1-hd",
        "gpt-4o-mini-tts",
        "gpt-4o-mini-tts-2025-12-15",
        "gpt-4o-mini-tts-2025-03-20",
    ]
    accepts = models[0].model_extra["accepts"]
    assert accepts["clones"] is False and accepts["seed"] is True and "speed" in accepts["options"]
    assert {m.model_extra["stand_in"] for m in models} == {False}  # the default voice is real
    status, _, body = post(demo.url, None, path="/v1/audio/voices", method="GET")
    voices = json.loads(body)["voices"]
    assert status == 200 and [v["id"] for v in voices if v["type"] == "model"] == [VOICE]
    assert voices[0]["sample_rate"] == 24000 and "af_heart" in voices[0]["aliases"]
    assert {v["id"]: v["voice"] for v in voices if v["type"] == "alias"}["alloy"] == VOICE
    status, _, body = post(demo.url, None, path="/health", method="GET")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, _, body = post(demo.url, None, path="/ready", method="GET")
    assert status == 200 and json.loads(body)["ready"] is True


def test_topology_endpoint_shows_groups_pids_and_edge_transports(demo):
    status, _, body = post(demo.url, None, path="/v1/topology", method="GET")
    data = json.loads(body)
    assert status == 200
    [group] = data["groups"]
    assert group["state"] == "READY" and group["pid"] == demo.status()["groups"][0]["pid"]
    assert {(e["src"], e["dst"], e["transport"]) for e in data["edges"]} >= {("tts_engine", "vocoder", "in_process")}
    assert data["admission"]["max_concurrent"] > 0


# -- bad input: 4xx in OpenAI's envelope, never a 500 ---------------------------------------------


BAD_REQUESTS = [
    # (what, headers, body, status, param)
    ("not JSON", JSON, b"{this is not json", 400, None),
    ("not an object", JSON, b'["model", "demo"]', 400, None),
    ("not UTF-8", JSON, b'{"model": "\xff"}', 400, None),
    ("NaN", JSON, b'{"model": "demo", "input": "hi", "speed": NaN}', 400, None),
    ("wrong content type", {"Content-Type": "text/plain"}, speech_json(), 415, None),
    ("no content type", {}, speech_json(), 415, None),
    ("gzip body", {**JSON, "Content-Encoding": "gzip"}, gzip.compress(speech_json()), 415, None),
    ("huge body", JSON, json.dumps({"model": "demo", "input": "a" * 7_000_000}).encode(), 413, None),
    ("missing input", JSON, json.dumps({"model": "demo"}).encode(), 400, "input"),
    ("missing model", JSON, json.dumps({"input": "hi"}).encode(), 400, "model"),
    ("input not a string", JSON, json.dumps({"model": "demo", "input": 42}).encode(), 400, "input"),
    ("empty input", JSON, speech_json(input="   "), 400, "input"),
    ("input too long", JSON, speech_json(input="word " * 1001), 400, "input"),
    ("control character", JSON, speech_json(input="bell \x07 here"), 400, "input"),
    ("punctuation alone", JSON, speech_json(input="?!... ;"), 400, "input"),
    ("emoji alone", JSON, speech_json(input="\U0001f600\U0001f389"), 400, "input"),
    ("a script the voice has no sounds for", JSON, speech_json(input="\u4f60\u597d\u3002"), 400, "input"),
    ("unknown model", JSON, speech_json(model="gpt-5"), 404, "model"),
    ("unknown voice", JSON, speech_json(voice="nobody"), 400, "voice"),
    ("sample rate out of range", JSON, speech_json(sample_rate=96000), 400, "sample_rate"),
    ("seed out of range", JSON, speech_json(seed=2**32), 400, "seed"),
    ("reference to a model that cannot clone", JSON, speech_json(ref_audio="UklGRg=="), 400, "ref_audio"),
    ("voice of a wrong type", JSON, speech_json(voice=["joe"]), 400, "voice"),
    ("speed too high", JSON, speech_json(speed=4.5), 400, "speed"),
    ("speed too low", JSON, speech_json(speed=0.1), 400, "speed"),
    ("speed not a number", JSON, speech_json(speed="fast"), 400, "speed"),
    ("speed a boolean", JSON, speech_json(speed=True), 400, "speed"),
    ("unknown format", JSON, speech_json(response_format="ogg"), 400, "response_format"),
    ("unknown stream format", JSON, speech_json(stream_format="ws"), 400, "stream_format"),
    ("unknown field", JSON, speech_json(temperature=0.7), 400, "temperature"),
    ("option out of range", JSON, speech_json(seed=-1), 400, "seed"),
    ("option of a wrong type", JSON, speech_json(seed=[0]), 400, "seed"),
    ("option the voice does not know", JSON, speech_json(noise_scale=0), 400, "noise_scale"),
    ("malformed field name", JSON, speech_json(**{"bad key!": 1}), 400, "bad key!"),
]


@pytest.mark.parametrize("what,headers,body,status,param", BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS])
def test_bad_input_gets_a_4xx_in_the_openai_envelope(demo, what, headers, body, status, param):
    got, response_headers, payload = post(demo.url, body, headers)
    assert got == status, payload
    assert response_headers["content-type"] == "application/json"
    error = json.loads(payload)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    assert error["param"] == param


def test_text_with_nothing_to_speak_names_input_and_says_what_to_send(demo):
    """A stage's NOTHING_SPEAKABLE is about `input`: the envelope points `param` at it, and the message says what
    text would do (it said only that the text phonemizes to no sounds)."""
    status, _, body = post(demo.url, speech_json(input="\u4f60\u597d\u3002"), JSON)
    error = json.loads(body)["error"]
    assert (status, error["code"], error["param"]) == (400, "NOTHING_SPEAKABLE", "input"), error
    assert (
        "a script the voice has no sounds for" in error["message"] and "give words the voice reads" in error["message"]
    )


TEXT_REFUSALS = [
    # (what, input, the stage's code, what the message says)
    ("a word joined from too many pieces", "well-" * 500, "TEXT_TOO_COMPLEX", "put spaces in long runs"),
    ("too many such words", " ".join(["a/" * 20] * 100), "TEXT_TOO_COMPLEX", "split it into several requests"),
    ("a number of 40 digits", "Call " + "1" * 40 + " now.", "TEXT_UNREADABLE", "a number of 40 digits"),
    ("a script the voice has no sounds for", "\u4f60\u597d\u3002", "NOTHING_SPEAKABLE", "give words the voice"),
]


@pytest.mark.parametrize("what,text,code,says", TEXT_REFUSALS, ids=[r[0] for r in TEXT_REFUSALS])
def test_every_refusal_of_the_text_names_input_with_the_stage_code(demo, what, text, code, says):
    """Only NOTHING_SPEAKABLE came back with a code and `param: "input"`: the G2P's refusals (a word it would take
    minutes over, a number it cannot read) were a bare `invalid_argument` with `param: null`."""
    status, _, body = post(demo.url, speech_json(input=text), JSON)
    error = json.loads(body)["error"]
    assert (status, error["code"], error["param"]) == (400, code, "input"), error
    assert says in error["message"] and error["message"].startswith("stage 'preprocessing' rejected the request")


def test_unknown_route_and_method_get_the_envelope(demo):
    status, _, body = post(demo.url, None, path="/v1/audio/transcriptions", method="POST")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    status, _, body = post(demo.url, None, path="/v1/audio/speech", method="PUT")
    assert status == 405 and "PUT" in json.loads(body)["error"]["message"]


def test_the_sdk_sees_a_404_for_an_unknown_model(client):
    import openai

    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.speech.create(model="gpt-5", voice=VOICE, input=TEXT)
    assert "'demo'" in caught.value.message


# -- cancellation --------------------------------------------------------------------------------


def test_a_client_that_disconnects_mid_stream_leaves_nothing_in_flight(demo):
    """
    1. a long request streams pcm; the client reads its first bytes and hangs up;
    2. the daemon reports 0 in flight soon after;
    3. the request never completed: no edge counts one more finished request.
    """

    def completed() -> int:
        edges = demo.topology()["edges"]
        return sum(sum(e["requests"].values()) for e in edges)

    before = completed()
    long_text = " ".join([TEXT] * 40)
    parts = urlsplit(demo.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    body = speech_json(input=long_text, response_format="pcm")
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    received = b""
    while b"\r\n\r\n" not in received or len(received) < 4096:
        piece = sock.recv(65536)
        assert piece, "the daemon closed the stream"
        received += piece
    assert received.startswith(b"HTTP/1.1 200")
    sock.close()
    assert poll_until(
        lambda: (demo.admin_status() or {}).get("in_flight") == 0, timeout=30, message="0 requests in flight"
    )
    assert completed() == before, "the request ran to completion instead of being cancelled"


# -- the playground in a real browser --------------------------------------------------------------


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"), reason=MISSING_REASON)
def test_playground_plays_streamed_speech_and_shows_the_topology(demo):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        driver.get(demo.url + "/")
        pid = str(demo.status()["groups"][0]["pid"])
        # Read the rows in one script: the page redraws them every second.
        WebDriverWait(driver, 30).until(
            lambda d: (
                d.execute_script("return Array.from(document.querySelectorAll('#groups tr'), r => r.dataset.pid)")
                == [pid]
            )
        )
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "voice").get_attribute("value") == VOICE)
        driver.find_element(By.ID, "speak").click()
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script(
                "const r = window.lastPlayback; return r && (r.error || (r.done && r.playingMs !== null))"
            )
        )
        record = driver.execute_script("return window.lastPlayback")
        assert record["error"] is None, record
        assert record["format"] == "mp3" and record["bytes"] > 1000
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script(
                "const p = document.getElementById('player'); return p.currentTime > 0.2 && !p.error"
            )
        )
        print(
            f"playground: {record['mode']} mp3, first byte {record['firstByteMs']:.0f} ms, "
            f"playing {record['playingMs']:.0f} ms"
        )
        assert "pipeline" in driver.find_element(By.ID, "groups").text
        assert "tts_engine \u2192 vocoder" in driver.find_element(By.ID, "edges").text
