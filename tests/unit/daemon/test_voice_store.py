"""Uploaded voices on disk: private, atomic, duplicate-safe, never through a symbolic link."""

from __future__ import annotations

import os
import stat

import pytest

from stagevisor.supervisor.daemon.voice_store import MAX_VOICES, DirectoryVoiceStore
from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.http.voices import VoiceExists, VoiceStoreFull


def test_a_voice_is_stored_privately_listed_read_back_and_deleted(tmp_path):
    store = DirectoryVoiceStore(tmp_path / "voices")
    assert store.list() == [] and not (tmp_path / "voices").exists()  # created on the first upload
    store.add("narrator", b"RIFFdata", "hello", 1.5)
    assert stat.S_IMODE(os.stat(tmp_path / "voices").st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "voices" / "narrator").iterdir()} == {0o600}
    again = DirectoryVoiceStore(tmp_path / "voices")  # what a restarted daemon sees
    voice = again.get("narrator")
    assert (voice.audio, voice.transcript, voice.seconds) == (b"RIFFdata", "hello", 1.5)
    assert [v.name for v in again.list()] == ["narrator"]
    assert again.delete("narrator") and again.get("narrator") is None and not again.delete("narrator")
    assert os.listdir(tmp_path / "voices") == []


def test_a_duplicate_name_is_refused_and_the_first_voice_is_unchanged(tmp_path):
    store = DirectoryVoiceStore(tmp_path)
    store.add("a", b"one", "", 1.0)
    with pytest.raises(VoiceExists):
        store.add("a", b"two", "", 1.0)
    assert store.get("a").audio == b"one"
    assert [e for e in os.listdir(tmp_path) if e.startswith(".")] == []  # no staging left behind


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    store = DirectoryVoiceStore(tmp_path)

    def fail(path, data):
        raise OSError("disk full")

    monkeypatch.setattr("stagevisor.supervisor.daemon.voice_store._write", fail)
    with pytest.raises(OSError):
        store.add("a", b"x", "", 1.0)
    assert os.listdir(tmp_path) == []


def test_links_and_odd_names_are_never_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "voice.json").write_text('{"transcript": "planted"}')
    (outside / "audio.wav").write_bytes(b"x")
    root = tmp_path / "voices"
    root.mkdir(mode=0o700)
    (root / "linked").symlink_to(outside)
    store = DirectoryVoiceStore(root)
    assert store.get("linked") is None and store.list() == [] and not store.delete("linked")
    assert store.get("../outside") is None and store.get(".hidden") is None
    link_root = tmp_path / "link-root"
    link_root.symlink_to(outside)
    with pytest.raises(DaemonError):
        DirectoryVoiceStore(link_root).add("a", b"x", "", 1.0)


def test_the_store_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("stagevisor.supervisor.daemon.voice_store.MAX_VOICES", 2)
    store = DirectoryVoiceStore(tmp_path)
    store.add("a", b"x", "", 1.0)
    store.add("b", b"x", "", 1.0)
    with pytest.raises(VoiceStoreFull):
        store.add("c", b"x", "", 1.0)
    assert MAX_VOICES > 2
