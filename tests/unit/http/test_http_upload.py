"""POST /v1/audio/voices before any file is written: what read_upload trusts of the request's headers, and which
names an upload may take."""

from __future__ import annotations

import asyncio
import errno
import logging
import os

import numpy as np
import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from stagevisor.supervisor.config import SpeechConfig
from stagevisor.supervisor.http.voice_store import DirectoryVoiceStore
from stagevisor.supervisor.http.app import create_app
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.reference import wav_bytes
from stagevisor.supervisor.http.names import SpeechSettings, voice_map
from stagevisor.supervisor.http.voices import MAX_UPLOAD_BYTES, StoredVoice, TakenNames, read_upload, voice_listing
from tests.fakes import FakeSpeechDaemon


def upload(body: bytes, content_length: str) -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    headers = [
        (b"content-type", b"multipart/form-data; boundary=b"),
        (b"content-length", content_length.encode("latin-1")),
    ]
    return Request({"type": "http", "method": "POST", "path": "/v1/audio/voices", "headers": headers}, receive)


def test_a_declared_length_that_is_not_ascii_digits_is_not_trusted_and_the_form_still_read():
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_upload(upload(b"--b--\r\n", "\u00b2"), TakenNames()))
    assert (caught.value.status, caught.value.param) == (400, "name")


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read():
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_upload(upload(b"", str(MAX_UPLOAD_BYTES + 1)), TakenNames()))
    assert (caught.value.status, caught.value.code) == (413, "audio_too_large")


def test_an_upload_with_no_content_type_is_told_it_has_none():
    """It was told "got 'none'", as if it had sent the media type `none`."""

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/v1/audio/voices", "headers": []}, receive)
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_upload(request, TakenNames()))
    assert (caught.value.status, caught.value.message) == (
        415,
        "Content-Type must be multipart/form-data (fields name, audio, transcript), the request has none",
    )


def test_the_models_voice_names_are_taken_in_any_case_and_a_mapped_name_as_written():
    """As a speech request matches them: `HEART` asks for the model's `heart`, `ALLOY` for no voice at all."""
    taken = TakenNames({"heart": "heart", "af": "heart"}, {"alloy": "heart", "narrator": ""})
    assert taken.clash("HEART") == "the model's voice 'heart' answers to it (in any case)"
    assert taken.clash("Af") == "the model's voice 'heart' answers to it (as its alias 'af', in any case)"
    assert taken.clash("alloy") == "it is mapped onto the model's voice 'heart'"
    assert taken.clash("narrator") == "it is mapped onto the model's default voice"
    assert [taken.clash(name) for name in ("ALLOY", "hearts", "mine")] == [None, None, None]


def voice_upload(client: TestClient, name: str, transcript: str = "a test voice"):
    tone = np.sin(np.arange(16000) * 2 * np.pi * 330 / 16000).astype(np.float32) * 0.5
    audio = {"audio": ("voice.wav", wav_bytes(tone, 16000), "audio/wav")}
    return client.post("/v1/audio/voices", data={"name": name, "transcript": transcript}, files=audio)


@pytest.mark.parametrize(
    "transcript, shown", [("hello\x01there", "'\\x01' at position 5"), (" a\x00b", "'\\x00' at position 1")]
)
def test_a_transcript_with_a_control_character_is_refused_naming_it_and_stores_nothing(tmp_path, transcript, shown):
    """It was stored (201, usable), and every request naming the voice got 400 `reference_transcript contains the
    control character`, param `ref_text`, which the client never sent: requests hold it to that rule, so uploads do."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    response = voice_upload(client, "narrator", transcript)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "invalid_value", "transcript")
    assert error["message"] == f"transcript contains the control character {shown}; remove it"
    assert not (tmp_path / "voices").exists()
    response = voice_upload(client, "narrator", "line one\nline two\ttabbed")  # tabs and line breaks are fine
    assert response.status_code == 201 and response.json()["transcript"] == "line one\nline two\ttabbed"


def test_an_upload_named_like_a_models_voice_in_another_case_is_refused_and_stores_nothing(tmp_path):
    """`HEART` was stored (201) though `heart` is refused, and from then on took the requests for `HEART` that had
    spoken with the model's voice `heart`."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    for name in ("HEART", "Heart", "heart"):
        response = voice_upload(client, name)
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["param"]) == (409, "voice_exists", "name"), name
        assert f"voice name {name!r} is taken: the model's voice 'heart' answers to it" in error["message"]
    assert [v["id"] for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"] == []


def test_the_openai_sdks_upload_form_with_audio_sample_and_consent_stores_the_voice(tmp_path):
    """Before: `client.audio.voices.create(audio_sample=..., consent=..., name=...)` sends its file as
    `audio_sample`, and got 400 "'audio' must be a file part"; the voice it stores answers to `{"id": name}`."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    tone = np.sin(np.arange(16000) * 2 * np.pi * 330 / 16000).astype(np.float32) * 0.5
    sample = ("voice.wav", wav_bytes(tone, 16000), "audio/wav")
    response = client.post(
        "/v1/audio/voices", data={"name": "narrator", "consent": "cons_1234"}, files={"audio_sample": sample}
    )
    assert response.status_code == 201 and response.json()["id"] == "narrator"
    listed = client.get("/v1/audio/voices").json()["voices"]
    assert [v["id"] for v in listed if v["type"] == "uploaded"] == ["narrator"]
    both = client.post("/v1/audio/voices", data={"name": "other"}, files={"audio_sample": sample, "audio": sample})
    assert both.status_code == 400  # two files: which one was meant is not ours to guess


@pytest.mark.parametrize("kind", ["prompt", "bogus"])
def test_an_upload_of_a_type_other_than_audio_sample_is_refused_naming_type_and_stores_nothing(tmp_path, kind):
    """OpenAI's SDK's `voices.create(name=..., prompt=..., type="prompt")` (a voice described in words) was told
    "'audio' must be a file part", and with a file as well it was stored from the file, its prompt ignored."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    tone = np.sin(np.arange(16000) * 2 * np.pi * 330 / 16000).astype(np.float32) * 0.5
    sample = ("voice.wav", wav_bytes(tone, 16000), "audio/wav")
    prompt = (None, "a warm, low voice")  # a text part: the form is multipart with no file too
    for files in ({"prompt": prompt}, {"prompt": prompt, "audio_sample": sample}):
        response = client.post("/v1/audio/voices", data={"name": "warm", "type": kind}, files=files)
        error = response.json()["error"]
        assert (response.status_code, error["code"], error["param"]) == (400, "unsupported", "type"), error
        assert f"voice type {kind!r} is not supported" in error["message"]
    assert not (tmp_path / "voices").exists()
    response = client.post("/v1/audio/voices", data={"name": "warm", "type": "audio_sample"}, files={"audio": sample})
    assert response.status_code == 201


def test_an_uploaded_and_a_deleted_voice_answer_with_openais_object_and_name(tmp_path):
    """Before: the openai SDK's Voice read `name` and `object` as None (absent), and its VoiceDeleted an `object`
    of "voice"; they are OpenAI's now: the voice's name, `audio.voice`, `audio.voice.deleted`."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    created = voice_upload(client, "narrator").json()
    assert (created["id"], created["name"], created["object"]) == ("narrator", "narrator", "audio.voice")
    deleted = client.delete("/v1/audio/voices/narrator").json()
    assert deleted == {"id": "narrator", "object": "audio.voice.deleted", "deleted": True}


def test_uploaded_voice_names_are_case_sensitive(tmp_path):
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    assert [voice_upload(client, name).status_code for name in ("Narrator", "narrator", "narrator")] == [201, 201, 409]
    listed = client.get("/v1/audio/voices").json()["voices"]
    assert sorted(v["id"] for v in listed if v["type"] == "uploaded") == ["Narrator", "narrator"]


@pytest.mark.parametrize("field", ["name", "transcript"])
def test_a_form_field_given_twice_is_refused_naming_it_and_stores_nothing(tmp_path, field):
    """Before: the last one won, silently (a GET's query parameter given twice was already refused)."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    tone = np.sin(np.arange(16000) * 2 * np.pi * 330 / 16000).astype(np.float32) * 0.5
    parts = {"name": "narrator", "transcript": "a test voice"}
    fields = [(key, value) for key, value in parts.items()] + [(field, "again")]
    files = [(key, (None, value)) for key, value in fields] + [("audio", ("voice.wav", wav_bytes(tone, 16000)))]
    response = client.post("/v1/audio/voices", files=files)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "invalid_value", field)
    assert error["message"] == f"form field {field!r} is given more than once"
    assert [v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"] == []


@pytest.mark.parametrize("name", ["narrator\n", "heart\n"])
def test_a_name_with_a_final_newline_is_refused_and_stores_nothing(tmp_path, name):
    """`$` matched before a final newline: `narrator\n` was stored (201), could never be asked for (a request's
    voice name is stripped), and `heart\n` got past the clash with the model's voice."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    response = voice_upload(client, name)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "invalid_value", "name")
    assert [v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"] == []
    assert not (tmp_path / "voices").exists() or list((tmp_path / "voices").iterdir()) == []


def test_an_upload_past_the_stores_cap_is_507_voice_store_full_and_stores_nothing(tmp_path, monkeypatch):
    """docs/api/http.md lists the upload errors; the one for a full store (MAX_VOICES, 256) was missing there."""
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.MAX_VOICES", 2)
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    assert [voice_upload(client, name).status_code for name in ("one", "two")] == [201, 201]
    response = voice_upload(client, "three")
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (507, "voice_store_full")
    assert error["message"] == "the daemon keeps at most 2 uploaded voices; DELETE one first"
    listed = client.get("/v1/audio/voices").json()["voices"]
    assert sorted(v["id"] for v in listed if v["type"] == "uploaded") == ["one", "two"]


def test_an_upload_to_a_full_disk_is_507_and_the_log_names_the_voices_directory_and_the_reason(
    tmp_path, monkeypatch, caplog
):
    """Before: the log said only `voice 'v1': upload failed: No space left on device` (a write to a descriptor
    names no file), where docs/api/http.md says it names the directory and the reason."""

    def full(path, data):  # as os.write fails: no file name in the error
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("stagevisor.supervisor.http.voice_store._write", full)
    voices = tmp_path / "voices"
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(voices)))
    with caplog.at_level(logging.ERROR, logger="stagevisor.http"):
        response = voice_upload(client, "v1")
    assert (response.status_code, response.json()["error"]["code"]) == (507, "insufficient_storage")
    assert str(voices) not in response.text  # the path is the operator's, for the log only
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR] == [
        f"voice 'v1': upload failed: voices directory {voices}: No space left on device"
    ]


def test_an_uploaded_voice_whose_name_the_model_or_map_came_to_use_is_listed_as_hidden():
    """An upload `marin` stored before OpenAI's `marin` joined the map (or before the config's `voices` named it)
    answers to no request; GET /v1/audio/voices listed it as usable all the same."""
    stored = [StoredVoice(name, "", 1.0, 0) for name in ("marin", "HEART", "narrator", "bad")]
    declared = [{"id": "heart"}]
    listing = voice_listing(declared, voice_map(declared, {"bad": "nobody"}), stored, clones=True)
    uploaded = {entry["id"]: entry for entry in listing if entry["type"] == "uploaded"}
    assert uploaded["marin"]["usable"] is False
    assert uploaded["marin"]["hidden_by"] == "it is mapped onto the model's voice 'heart'"
    assert uploaded["HEART"]["hidden_by"] == "the model's voice 'heart' answers to it (in any case)"
    assert uploaded["marin"]["unusable_reason"] == (
        "another voice takes its requests (it is mapped onto the model's voice 'heart'); "
        "upload it again under another name"
    )
    for name in ("narrator", "bad"):  # `bad` maps onto no voice of the model: requests for it get the upload
        assert uploaded[name]["usable"] is True and "hidden_by" not in uploaded[name]
        assert "unusable_reason" not in uploaded[name]
    assert "bad" not in {entry["id"] for entry in listing if entry["type"] == "alias"}


def test_a_voice_uploaded_to_a_model_that_cannot_clone_says_why_it_is_not_usable(tmp_path):
    """Before: 201 and GET /v1/audio/voices said `usable: false` with no word of why (its requests get 400
    cloning_not_supported)."""
    settings = SpeechSettings(speech=SpeechConfig(clones=False))
    client = TestClient(create_app(FakeSpeechDaemon(), settings=settings, voice_store=DirectoryVoiceStore(tmp_path)))
    created = voice_upload(client, "narrator")
    listed = [v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"]
    assert created.status_code == 201 and [v["id"] for v in listed] == ["narrator"]
    for entry in (created.json(), listed[0]):
        assert entry["usable"] is False
        assert entry["unusable_reason"] == (
            "the served model cannot clone a voice from reference audio; serve a model that clones to use it"
        )


def test_a_name_conflict_tells_openai_sdks_not_to_retry(tmp_path):
    """Before: the 409s came without `X-Should-Retry: false`, and the openai SDK's voices.create retried them twice
    (it retries a 409) before raising, though a retry meets the same name."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    assert voice_upload(client, "narrator").status_code == 201
    for name in ("narrator", "heart"):  # stored already; the model's own voice
        conflict = voice_upload(client, name)
        assert conflict.status_code == 409 and conflict.headers["x-should-retry"] == "false", name


def test_a_voice_folder_the_store_cannot_read_is_listed_deletable_and_named_by_the_409(tmp_path):
    """Before: GET did not list `broken`, DELETE answered 404 voice_not_found, and an upload of `broken` 409 "already
    uploaded; DELETE it first"; a link was answered the same and could not be freed by anyone but the operator."""
    voices = tmp_path / "voices"
    voices.mkdir(mode=0o700)
    (voices / "broken").mkdir(mode=0o700)
    (voices / "linked").symlink_to(tmp_path)
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(voices)))
    listed = {v["id"]: v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"}
    assert sorted(listed) == ["broken", "linked"]
    assert listed["broken"]["usable"] is False and listed["broken"]["unreadable"] is True
    assert listed["broken"]["unusable_reason"].endswith("DELETE it, then upload it again")
    assert listed["linked"]["unusable_reason"].endswith("the daemon's operator must remove it")
    assert str(voices) not in client.get("/v1/audio/voices").text  # the path is the operator's

    taken = voice_upload(client, "broken").json()["error"]
    assert taken["code"] == "voice_exists" and "held by an uploaded voice the daemon cannot read" in taken["message"]
    held = voice_upload(client, "linked").json()["error"]
    assert held["code"] == "voice_exists" and "have the daemon's operator remove it" in held["message"]

    refused = client.delete("/v1/audio/voices/linked")
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "voice_not_removable")
    assert refused.headers["x-should-retry"] == "false" and (voices / "linked").is_symlink()
    assert client.delete("/v1/audio/voices/broken").status_code == 200
    assert voice_upload(client, "broken").status_code == 201


def test_a_name_mapped_onto_a_model_voice_that_is_not_usable_is_listed_as_not_usable_either():
    """A Qwen3-TTS Base checkpoint's `default` cannot be spoken in without reference audio: OpenAI's names mapped
    onto it (alloy, marin, ...) were listed as any alias, and every request naming one got 400."""
    declared = [{"id": "default", "usable": False, "unusable_reason": "it needs reference audio"}]
    listing = voice_listing(declared, voice_map(declared, {}), [], clones=True)
    aliases = [entry for entry in listing if entry["type"] == "alias"]
    assert aliases and all(entry["usable"] is False for entry in aliases)
    assert aliases[0]["unusable_reason"] == (
        "it is mapped onto the model's voice 'default', which is not usable: it needs reference audio"
    )
    usable = voice_listing([{"id": "heart"}], voice_map([{"id": "heart"}], {}), [], clones=True)
    assert all("usable" not in entry for entry in usable if entry["type"] == "alias")


def stored_before_the_checks(voices, name: str, transcript: str, rate: int) -> None:
    """A voice folder as a daemon from before the upload's newest checks left it (what it wrote, byte for byte)."""
    import json

    folder = voices / name
    folder.mkdir(mode=0o700, parents=True)
    (folder / "audio.wav").write_bytes(wav_bytes(np.zeros(rate, dtype=np.float32), rate))
    meta = {"name": name, "transcript": transcript, "seconds": 1.0, "created": 1}
    (folder / "voice.json").write_text(json.dumps(meta))


def test_a_voice_stored_before_the_uploads_checks_is_listed_as_not_usable_and_a_request_naming_it_says_why(tmp_path):
    """Before: both were listed as usable; a request naming the 192 kHz one (30 s of it is twice the request's
    size limit) or the one with a control character got 400 about a `ref_audio` or `ref_text` it never sent."""
    voices = tmp_path / "voices"
    stored_before_the_checks(voices, "shrill", "said", 192000)
    stored_before_the_checks(voices, "beeped", "said\x07 here", 16000)
    stored_before_the_checks(voices, "fine", "said", 16000)
    settings = SpeechSettings(speech=SpeechConfig(clones=True))
    client = TestClient(create_app(FakeSpeechDaemon(), settings=settings, voice_store=DirectoryVoiceStore(voices)))
    listed = {v["id"]: v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"}
    assert [listed[name]["usable"] for name in ("shrill", "beeped", "fine")] == [False, False, True]
    reasons = {
        "shrill": "its audio is kept at 192000 Hz, above the 48000 Hz a request carries (an upload is resampled to "
        "it now)",
        "beeped": "its transcript contains the control character '\\x07' at position 4; remove it",
    }
    for name, problem in reasons.items():
        reason = (
            f"it was stored before uploads were checked for this: {problem}; DELETE it, then upload it again (the "
            "upload is checked and converted as every upload is now)"
        )
        assert listed[name]["unusable_reason"] == reason
        speech = {"model": "fake", "input": "Hello.", "voice": name}
        error = client.post("/v1/audio/speech", json=speech).json()["error"]
        assert (error["code"], error["param"]) == ("voice_not_usable", "voice")
        assert error["message"] == f"uploaded voice {name!r} cannot be used: {reason}"
    # The upload is held to the same rule, in the same words.
    refused = voice_upload(client, "again", "said\x07 here").json()["error"]
    assert refused["message"] == f"transcript {reasons['beeped'].removeprefix('its transcript ')}"


def test_a_voice_stored_at_a_rate_no_upload_takes_is_not_usable(tmp_path):
    voices = tmp_path / "voices"
    stored_before_the_checks(voices, "low", "", 4000)
    (voice,) = DirectoryVoiceStore(voices).list()
    assert voice.problem.startswith("its audio has a sample rate of 4000 Hz; 8000 to 192000 are accepted: resample")


def test_a_request_naming_an_uploaded_voice_the_daemon_cannot_read_says_what_is_wrong_and_what_to_do(tmp_path):
    """Before: 400 voice_not_found, `voice 'broken' is not available`, while GET /v1/audio/voices listed it."""
    voices = tmp_path / "voices"
    (voices / "broken").mkdir(mode=0o700, parents=True)
    settings = SpeechSettings(speech=SpeechConfig(clones=True))
    client = TestClient(create_app(FakeSpeechDaemon(), settings=settings, voice_store=DirectoryVoiceStore(voices)))
    (listed,) = [v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"]
    error = client.post("/v1/audio/speech", json={"model": "fake", "input": "Hi.", "voice": "broken"}).json()["error"]
    assert (error["code"], error["param"]) == ("voice_not_usable", "voice")
    assert error["message"] == f"uploaded voice 'broken' cannot be used: {listed['unusable_reason']}"
    assert listed["unusable_reason"].endswith("DELETE it, then upload it again") and str(voices) not in str(error)


def test_a_transcript_that_is_not_utf8_is_refused_naming_the_field_and_stores_nothing(tmp_path):
    """Before: starlette decoded any text that is not UTF-8 as Latin-1, which is right for Latin-1 alone (a cp1252
    quote became a C1 control character, Shift-JIS mojibake), and stored it as the transcript, listed as usable.
    The encoding is the client's to name: named in the Content-Type, it is decoded as named."""
    client = TestClient(create_app(FakeSpeechDaemon(), voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    tone = np.zeros(16000, dtype=np.float32)
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nnarrator\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="transcript"\r\n\r\n'
    ).encode() + b"caf\xe9 au lait"
    audio = wav_bytes(tone, 16000)
    body += (
        (
            f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="v.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + audio
        + f"\r\n--{boundary}--\r\n".encode()
    )
    content_type = f"multipart/form-data; boundary={boundary}"
    response = client.post("/v1/audio/voices", content=body, headers={"Content-Type": content_type})
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "invalid_value", "transcript")
    assert error["message"] == (
        "form field 'transcript' is not valid UTF-8 text (byte 0xe9 at offset 3); send it as UTF-8, or name its "
        "encoding in the Content-Type (multipart/form-data; charset=...)"
    )
    assert not (tmp_path / "voices").exists()
    # Named, the encoding is decoded as the client says.
    declared = {"Content-Type": f"{content_type}; charset=iso-8859-1"}
    response = client.post("/v1/audio/voices", content=body, headers=declared)
    assert response.status_code == 201 and response.json()["transcript"] == "café au lait"


def test_a_name_the_configs_voices_maps_onto_no_voice_of_the_model_may_be_uploaded_and_is_then_used(tmp_path):
    """Such an entry takes no request (a request for the name gets the uploaded voice of that name), and the
    listing neither lists it nor lets it hide an uploaded voice. Before: an upload of the name was refused 409
    voice_exists, "it is mapped onto the model's voice 'hert'", a voice the model does not have; and an entry onto
    one of the model's aliases, which requests take, was left out of the listing though an upload of it was 409."""
    daemon = FakeSpeechDaemon(voices=[{"id": "heart", "aliases": ["af"]}])
    daemon.voice_names = {"narrator": "hert", "teller": "af"}
    settings = SpeechSettings(speech=SpeechConfig(clones=True))
    client = TestClient(create_app(daemon, settings=settings, voice_store=DirectoryVoiceStore(tmp_path / "voices")))
    assert voice_upload(client, "narrator").status_code == 201
    taken = voice_upload(client, "teller").json()["error"]
    assert (taken["code"], taken["message"]) == (
        "voice_exists",
        "voice name 'teller' is taken: it is mapped onto the model's voice 'af'; choose another name",
    )
    listing = client.get("/v1/audio/voices").json()["voices"]
    aliases = {v["id"]: v["voice"] for v in listing if v["type"] == "alias"}
    assert aliases["teller"] == "af" and "narrator" not in aliases
    (uploaded,) = [v for v in listing if v["type"] == "uploaded"]
    assert uploaded["id"] == "narrator" and uploaded["usable"] is True


def test_an_uploaded_voice_whose_folder_the_daemon_may_not_read_says_so_to_a_listing_a_request_and_a_delete(tmp_path):
    voices = tmp_path / "voices"
    stored_before_the_checks(voices, "locked", "said", 16000)
    os.chmod(voices / "locked", 0)
    try:
        settings = SpeechSettings(speech=SpeechConfig(clones=True))
        client = TestClient(create_app(FakeSpeechDaemon(), settings=settings, voice_store=DirectoryVoiceStore(voices)))
        (listed,) = [v for v in client.get("/v1/audio/voices").json()["voices"] if v["type"] == "uploaded"]
        reason = listed["unusable_reason"]
        assert listed["usable"] is False and reason == (
            "the daemon may not read this uploaded voice's folder (its permissions were changed from the owner-only "
            "ones the daemon gave it; the daemon log says which); the daemon's operator must restore them, which "
            "makes the voice usable again, or remove it"
        )
        speech = {"model": "fake", "input": "Hi.", "voice": "locked"}
        error = client.post("/v1/audio/speech", json=speech).json()["error"]
        assert (error["code"], error["message"]) == (
            "voice_not_usable",
            f"uploaded voice 'locked' cannot be used: {reason}",
        )
        refused = client.delete("/v1/audio/voices/locked")
        assert (refused.status_code, refused.json()["error"]["code"]) == (409, "voice_not_removable")
        assert refused.json()["error"]["message"] == f"voice 'locked' cannot be deleted: {reason}"
    finally:
        os.chmod(voices / "locked", 0o700)
