"""Uploaded voices on a real daemon: a cloning request uses one, it survives `stop` + `serve`, DELETE removes it,
and bad uploads get a 4xx and change nothing.

The pipeline is one test stage that speaks its reference audio back
(tests/integration/http_stages.py: Parrot), declared in a YAML config as a
model that clones, so the audio a request gets proves which voice reached the
worker.
"""

from __future__ import annotations

import http.client
import json
import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from stagevisor.supervisor.http.reference import wav_bytes
from tests.integration.browser import CHROMEDRIVER, CHROMIUM, MISSING_REASON, chromium
from tests.integration.daemon_helpers import ServeProcess, poll_until

CONFIG = """\
pipeline:
  name: parrot
  stages:
    - name: parrot
      factory: tests.integration.http_stages:make_parrot
      process: pipeline
  speech:
    clones: true
"""
RATE = 16000


def tone(seconds: float, frequency: float = 330.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (np.sin(2 * np.pi * frequency * t) * 0.5).astype(np.float32)


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes, str]]) -> tuple[bytes, dict[str, str]]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, data, media) in files.items():
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {media}\r\n\r\n"
        )
        parts.append(head.encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def upload(url: str, name: str, audio: bytes, transcript: str = "a test voice", media: str = "audio/wav"):
    body, headers = multipart({"name": name, "transcript": transcript}, {"audio": ("voice.wav", audio, media)})
    status, payload = request(url, "POST", "/v1/audio/voices", body, headers)
    return status, json.loads(payload)


def speak(url: str, voice: str) -> tuple[int, bytes]:
    body = json.dumps(
        {"model": "parrot", "input": "Say it.", "voice": voice, "response_format": "pcm", "sample_rate": RATE}
    )
    return request(url, "POST", "/v1/audio/speech", body.encode(), {"Content-Type": "application/json"})


def voices(url: str) -> dict[str, dict]:
    status, body = request(url, "GET", "/v1/audio/voices")
    assert status == 200
    return {v["id"]: v for v in json.loads(body)["voices"] if v["type"] == "uploaded"}


def serve(tmp_path: Path) -> ServeProcess:
    config = tmp_path / "parrot.yaml"
    config.write_text(CONFIG)
    daemon = ServeProcess("--config", str(config), "--http", "127.0.0.1:0", "--voices-dir", str(tmp_path / "voices"))
    daemon.__enter__()
    try:
        daemon.wait_serving()
        daemon.url = daemon.http_url()
    except BaseException:
        daemon.__exit__(None, None, None)
        raise
    return daemon


def listing(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` and its bytes (what a bad upload must not change)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.slow  # two daemons in turn; upload, use and delete are also in the playground test on the module's daemon
def test_an_uploaded_voice_is_used_survives_a_restart_and_is_gone_after_delete(tmp_path):
    """
    1. upload 1.5 s of a 330 Hz tone as "narrator"; a request with that voice gets that audio back;
    2. `stagevisor stop`, then `serve` again on the same --voices-dir: still listed, still used;
    3. DELETE: no longer listed, a second DELETE is a 404, and the directory holds nothing.
    """
    reference = tone(1.5)
    daemon = serve(tmp_path)
    try:
        status, stored = upload(daemon.url, "narrator", wav_bytes(reference, RATE), "one two three")
        assert status == 201 and stored["id"] == "narrator" and stored["duration_seconds"] == 1.5
        status, pcm = speak(daemon.url, "narrator")
        assert status == 200
        heard = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32767
        assert heard.size == reference.size and np.abs(heard - reference).max() < 1e-3
        assert os.stat(tmp_path / "voices").st_mode & 0o777 == 0o700
        stop = daemon.cli("stop")
        assert stop.returncode == 0, stop.stderr
        poll_until(lambda: daemon.proc.poll() is not None, timeout=60, message="the daemon to exit")
    finally:
        daemon.__exit__(None, None, None)
    daemon = serve(tmp_path)
    try:
        assert voices(daemon.url)["narrator"]["transcript"] == "one two three"
        status, pcm = speak(daemon.url, "narrator")
        assert status == 200 and len(pcm) == 2 * reference.size
        status, body = request(daemon.url, "DELETE", "/v1/audio/voices/narrator")
        assert status == 200 and json.loads(body)["deleted"] is True
        assert "narrator" not in voices(daemon.url)
        status, body = request(daemon.url, "DELETE", "/v1/audio/voices/narrator")
        assert status == 404 and json.loads(body)["error"]["code"] == "voice_not_found"
        assert listing(tmp_path / "voices") == {}
    finally:
        daemon.__exit__(None, None, None)


@pytest.fixture(scope="module")
def parrot(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("parrot")
    daemon = serve(tmp_path)
    daemon.voices_dir = tmp_path / "voices"
    status, _ = upload(daemon.url, "kept", wav_bytes(tone(1.0), RATE))
    assert status == 201
    yield daemon
    daemon.__exit__(None, None, None)


BAD_UPLOADS = [
    # (what, name, audio bytes, media type, status, code)
    ("wrong type", "textfile", b"just some text, not audio\n" * 40, "text/plain", 415, "unsupported_audio_format"),
    ("too long", "long", wav_bytes(tone(31.0), RATE), "audio/wav", 400, "audio_too_long"),
    ("too short", "short", wav_bytes(tone(0.1), RATE), "audio/wav", 400, "audio_too_short"),
    ("too big", "big", b"RIFF" + os.urandom(4 * 1024 * 1024), "audio/wav", 413, "audio_too_large"),
    ("traversal", "../escape", wav_bytes(tone(1.0), RATE), "audio/wav", 400, "invalid_value"),
    ("slash", "a/b", wav_bytes(tone(1.0), RATE), "audio/wav", 400, "invalid_value"),
    ("hidden", ".hidden", wav_bytes(tone(1.0), RATE), "audio/wav", 400, "invalid_value"),
    ("duplicate", "kept", wav_bytes(tone(2.0), RATE), "audio/wav", 409, "voice_exists"),
    ("an OpenAI name", "alloy", wav_bytes(tone(1.0), RATE), "audio/wav", 409, "voice_exists"),
]


@pytest.mark.parametrize("what,name,audio,media,status,code", BAD_UPLOADS, ids=[b[0] for b in BAD_UPLOADS])
def test_a_bad_upload_gets_a_4xx_and_changes_nothing(parrot, what, name, audio, media, status, code):
    before = listing(parrot.voices_dir)
    got, body = upload(parrot.url, name, audio, media=media)
    assert (got, body["error"]["code"]) == (status, code), body
    assert body["error"]["param"] in ("name", "audio")
    assert listing(parrot.voices_dir) == before
    assert set(voices(parrot.url)) == {"kept"}


def test_a_multipart_form_without_audio_or_not_multipart_is_refused(parrot):
    body, headers = multipart({"name": "x"}, {})
    status, payload = request(parrot.url, "POST", "/v1/audio/voices", body, headers)
    assert status == 400 and json.loads(payload)["error"]["param"] == "audio"
    status, payload = request(parrot.url, "POST", "/v1/audio/voices", b"{}", {"Content-Type": "application/json"})
    assert status == 415


def test_a_voices_directory_the_daemon_cannot_write_is_a_coded_500_and_the_log_says_why(parrot):
    """The directory turned into a file while serving: the upload gets voice_store_unavailable (no path in it: the
    client is not the operator), the daemon log names the path and the fix, and the daemon serves on."""
    moved = parrot.voices_dir.with_name("voices.moved")
    parrot.voices_dir.rename(moved)
    parrot.voices_dir.write_text("not a directory")
    try:
        status, body = upload(parrot.url, "later", wav_bytes(tone(1.0), RATE))
        assert (status, body["error"]["code"], body["error"]["type"]) == (
            500,
            "voice_store_unavailable",
            "server_error",
        )
        assert str(parrot.voices_dir) not in body["error"]["message"]
        assert f"voices directory {parrot.voices_dir} is not a directory" in parrot.log()
        assert "or --voices-dir none" in parrot.log()  # the word serve --help gives (it said `off`)
    finally:
        parrot.voices_dir.unlink()
        moved.rename(parrot.voices_dir)
    assert set(voices(parrot.url)) == {"kept"}


def test_ref_audio_in_the_request_is_spoken_back(parrot):
    import base64

    reference = tone(0.8, 500.0)
    data_url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(reference, RATE)).decode()
    body = json.dumps(
        {"model": "tts-1", "input": "x", "ref_audio": data_url, "response_format": "pcm", "sample_rate": RATE}
    )
    status, pcm = request(parrot.url, "POST", "/v1/audio/speech", body.encode(), {"Content-Type": "application/json"})
    assert status == 200 and len(pcm) == 2 * reference.size


@pytest.mark.slow  # a headless browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"), reason=MISSING_REASON)
def test_the_playground_uploads_a_voice_picks_it_speaks_with_it_and_deletes_it(parrot, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wav = tmp_path / "page-voice.wav"
    wav.write_bytes(wav_bytes(tone(1.2, 440.0), RATE))
    with chromium() as driver:
        driver.get(parrot.url + "/")
        WebDriverWait(driver, 30).until(
            lambda d: d.execute_script("return Array.from(document.getElementById('voice').options, o => o.value)")
        )
        assert "clones" in driver.find_element(By.ID, "clones").text
        driver.find_element(By.ID, "upload-name").send_keys("pagevoice")
        driver.find_element(By.ID, "upload-audio").send_keys(str(wav))
        driver.find_element(By.ID, "upload-transcript").send_keys("a tone")
        driver.find_element(By.ID, "upload-button").click()
        WebDriverWait(driver, 30).until(lambda d: "uploaded pagevoice" in d.find_element(By.ID, "voice-status").text)
        assert driver.find_element(By.ID, "voice").get_attribute("value") == "pagevoice"
        assert voices(parrot.url)["pagevoice"]["transcript"] == "a tone"
        driver.execute_script("document.getElementById('format').value = 'wav'")
        driver.find_element(By.ID, "speak").click()
        WebDriverWait(driver, 60).until(
            lambda d: d.execute_script("const r = window.lastPlayback; return r && (r.error || r.done)")
        )
        record = driver.execute_script("return window.lastPlayback")
        assert record["error"] is None and record["bytes"] == 44 + 2 * int(1.2 * RATE)
        driver.find_element(By.ID, "delete-voice").click()
        WebDriverWait(driver, 30).until(lambda d: "deleted pagevoice" in d.find_element(By.ID, "voice-status").text)
    assert "pagevoice" not in voices(parrot.url)


@pytest.mark.slow  # a daemon of its own; the quick subset's upload tests above run on the module's daemon
def test_a_stand_in_model_takes_an_uploaded_voice_as_its_reference(tmp_path):
    """Higgs-TTS's stand-ins encode the reference in their audio_encoder stage (the embedded voice still speaks)."""
    daemon = ServeProcess(
        "--model-path", "higgs-tts", "--stand-ins", "--http", "127.0.0.1:0", "--voices-dir", str(tmp_path / "voices")
    )
    with daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        status, _ = upload(url, "narrator", wav_bytes(tone(1.5), RATE))
        assert status == 201
        status, body = request(url, "GET", "/v1/models")
        assert json.loads(body)["data"][0]["accepts"]["clones"] is True
        body = json.dumps({"model": "tts-1", "input": "Hello there.", "voice": "narrator", "response_format": "wav"})
        status, wav = request(url, "POST", "/v1/audio/speech", body.encode(), {"Content-Type": "application/json"})
        assert status == 200 and wav[:4] == b"RIFF" and len(wav) > 10_000


@pytest.mark.slow  # a daemon of its own and a headless browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"), reason=MISSING_REASON)
def test_the_playground_of_a_daemon_that_requires_an_api_key_asks_for_it_then_speaks(tmp_path):
    """The page was itself refused (401) without the token, which a browser does not send."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    config, key = tmp_path / "parrot.yaml", tmp_path / "api-key"
    config.write_text(CONFIG)
    key.write_text("playground-api-key-7\n")
    key.chmod(0o600)
    with ServeProcess("--config", str(config), "--http", "127.0.0.1:0", "--api-key-file", str(key)) as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        assert request(url, "GET", "/v1/models")[0] == 401
        with chromium() as driver:
            driver.get(url + "/")
            WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "key-row").is_displayed())
            assert "this daemon requires an API key" in driver.find_element(By.ID, "status").text
            driver.find_element(By.ID, "api-key").send_keys("wrong")
            driver.find_element(By.ID, "use-key").click()
            WebDriverWait(driver, 30).until(lambda d: "was refused" in d.find_element(By.ID, "status").text)
            driver.find_element(By.ID, "api-key").clear()
            driver.find_element(By.ID, "api-key").send_keys("playground-api-key-7")
            driver.find_element(By.ID, "use-key").click()
            WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "model").text == "model parrot")
            driver.execute_script("document.getElementById('format').value = 'wav'")
            driver.find_element(By.ID, "speak").click()
            WebDriverWait(driver, 60).until(
                lambda d: d.execute_script("const r = window.lastPlayback; return r && (r.error || r.done)")
            )
            record = driver.execute_script("return window.lastPlayback")
            assert record["error"] is None and record["bytes"] > 44, record


def sentence_audio(ws) -> tuple[dict, bytes]:
    """One sentence the session speaks: its `audio.start` message and its PCM, read to its `audio.done`."""
    start, audio = json.loads(ws.recv(timeout=60)), b""
    assert start["type"] == "audio.start", start
    while isinstance(message := ws.recv(timeout=60), bytes):
        audio += message
    assert json.loads(message)["type"] == "audio.done", message
    return start, audio


def test_a_voice_deleted_during_a_websocket_session_stays_the_sessions_voice_to_its_end(parrot):
    """The session reads its uploaded voice once, when its start message names it. Before: each sentence read it
    again, so a sentence after a DELETE was spoken without it (on this model, which declares no voices, the name
    went to the stage as a voice of its own, which the parrot does not know: its own tone, not the voice), and on a
    model that declares voices the session ended on voice_not_found."""
    from websockets.sync.client import connect

    reference = tone(0.75, frequency=440.0)
    status, _ = upload(parrot.url, "sessioned", wav_bytes(reference, RATE))
    assert status == 201
    url = parrot.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "model": "parrot", "voice": "sessioned", "sample_rate": RATE}))
        ws.send(json.dumps({"type": "text", "text": "The first one! The"}))
        _, first = sentence_audio(ws)
        status, _ = request(parrot.url, "DELETE", "/v1/audio/voices/sessioned")
        assert status == 200 and "sessioned" not in voices(parrot.url)
        ws.send(json.dumps({"type": "text", "text": " second one."}))
        ws.send(json.dumps({"type": "end"}))
        start, second = sentence_audio(ws)
        assert json.loads(ws.recv(timeout=60)) == {"type": "done", "sentences": 2}
    assert start["text"] == "The second one."
    for heard in (first, second):
        samples = np.frombuffer(heard, dtype="<i2").astype(np.float32) / 32767
        assert samples.size == reference.size and np.abs(samples - reference).max() < 1e-3
