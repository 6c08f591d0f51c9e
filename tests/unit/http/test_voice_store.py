"""Uploaded voices on disk: private, atomic, duplicate-safe, never through a symbolic link."""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading

import numpy as np
import pytest

from stagevisor.supervisor.http import voice_store
from stagevisor.supervisor.http.voice_store import MAX_VOICES, DirectoryVoiceStore, unusable_reason
from stagevisor.supervisor.http.voices import (
    UnreadableVoice,
    VoiceExists,
    VoiceNotRemovable,
    VoiceStoreFull,
    VoiceStoreUnavailable,
)
from stagevisor.supervisor.http.reference import wav_bytes


def wav(seconds: float, rate: int = 16000) -> bytes:
    """A WAV file as uploads store it (16-bit mono): `seconds` of silence at `rate` Hz."""
    return wav_bytes(np.zeros(int(seconds * rate), dtype=np.float32), rate)


AUDIO = wav(0.5)


def test_a_voice_is_stored_privately_listed_read_back_and_deleted(tmp_path):
    store = DirectoryVoiceStore(tmp_path / "voices")
    assert store.list() == [] and not (tmp_path / "voices").exists()  # created on the first upload
    store.add("narrator", AUDIO, "hello", 1.5)
    assert stat.S_IMODE(os.stat(tmp_path / "voices").st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "voices" / "narrator").iterdir()} == {0o600}
    again = DirectoryVoiceStore(tmp_path / "voices")  # what a restarted daemon sees
    voice = again.get("narrator")
    assert (voice.audio, voice.transcript, voice.seconds) == (AUDIO, "hello", 1.5)
    assert [v.name for v in again.list()] == ["narrator"]
    assert again.delete("narrator") and again.get("narrator") is None and not again.delete("narrator")
    assert os.listdir(tmp_path / "voices") == []


def test_a_duplicate_name_is_refused_and_the_first_voice_is_unchanged(tmp_path):
    store = DirectoryVoiceStore(tmp_path)
    store.add("a", wav(1), "", 1.0)
    with pytest.raises(VoiceExists):
        store.add("a", wav(2), "", 1.0)
    assert store.get("a").audio == wav(1)
    assert [e for e in os.listdir(tmp_path) if e.startswith(".")] == []  # no staging left behind


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    store = DirectoryVoiceStore(tmp_path)

    def fail(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("stagevisor.supervisor.http.voice_store._write", fail)
    with pytest.raises(VoiceStoreUnavailable) as failed:
        store.add("a", AUDIO, "", 1.0)
    assert failed.value.no_space and "No space left on device" in failed.value.reason
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
    assert store.get("linked") is None and store.list() == [UnreadableVoice("linked", removable=False)]
    with pytest.raises(VoiceNotRemovable):
        store.delete("linked")
    assert (root / "linked").is_symlink() and sorted(os.listdir(outside)) == ["audio.wav", "voice.json"]
    assert store.get("../outside") is None and store.get(".hidden") is None
    link_root = tmp_path / "link-root"
    link_root.symlink_to(outside)
    with pytest.raises(VoiceStoreUnavailable) as refused:
        DirectoryVoiceStore(link_root).add("a", AUDIO, "", 1.0)
    assert "voices directory" in refused.value.reason and "--voices-dir" in refused.value.reason
    assert "STAGEVISOR_RUNTIME_DIR" not in refused.value.reason
    assert not refused.value.no_space


def test_the_store_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.MAX_VOICES", 2)
    store = DirectoryVoiceStore(tmp_path)
    store.add("a", AUDIO, "", 1.0)
    store.add("b", AUDIO, "", 1.0)
    with pytest.raises(VoiceStoreFull):
        store.add("c", AUDIO, "", 1.0)
    assert MAX_VOICES > 2


def test_a_directory_that_cannot_be_made_is_unavailable_not_a_crash(tmp_path):
    (tmp_path / "file").write_text("")
    store = DirectoryVoiceStore(tmp_path / "file" / "voices")
    with pytest.raises(VoiceStoreUnavailable) as failed:
        store.add("a", AUDIO, "", 1.0)
    assert "file is not a directory" in failed.value.reason and "--voices-dir" in failed.value.reason
    assert store.list() == [] and store.get("a") is None and not store.delete("a")


def test_a_rename_refused_by_the_os_is_unavailable_not_a_taken_name(tmp_path, monkeypatch):
    """Only EEXIST / ENOTEMPTY mean another upload won the name; EACCES, EROFS... are the directory's fault."""
    store = DirectoryVoiceStore(tmp_path)
    store.add("kept", AUDIO, "", 1.0)

    def refuse(source, target):
        raise OSError(errno.EROFS, "Read-only file system", str(source))

    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.os.rename", refuse)
    with pytest.raises(VoiceStoreUnavailable) as upload:
        store.add("a", AUDIO, "", 1.0)
    assert "Read-only file system" in upload.value.reason and not upload.value.no_space
    with pytest.raises(VoiceStoreUnavailable):
        store.delete("kept")
    assert sorted(os.listdir(tmp_path)) == ["kept"]  # the staging directory is removed, the stored voice kept


def test_an_unreadable_store_lists_nothing_and_says_why(tmp_path, monkeypatch, caplog):
    store = DirectoryVoiceStore(tmp_path)
    store.add("a", AUDIO, "", 1.0)

    def deny(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.os.scandir", deny)
    assert store.list() == []
    assert "Permission denied" in caplog.text and "--voices-dir" in caplog.text


def test_unusable_reason_checks_without_creating_anything(tmp_path, monkeypatch):
    assert unusable_reason(tmp_path / "a" / "b" / "voices") is None
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("")
    assert "is not a directory" in unusable_reason(tmp_path / "file" / "voices")
    assert "is not a directory" in unusable_reason(tmp_path / "file")
    (tmp_path / "link").symlink_to(tmp_path)
    assert "symbolic link" in unusable_reason(tmp_path / "link")
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.os.access", lambda path, mode: False)
    assert "not writable" in unusable_reason(tmp_path / "voices")


def test_serve_s_check_and_an_upload_refuse_another_user_s_voices_directory_in_the_same_words(tmp_path, monkeypatch):
    root = tmp_path / "voices"
    root.mkdir()
    owner = root.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: 54321)  # the directory is now another user's
    words = f"voices directory {root} belongs to uid {owner}, not to this user (uid 54321)"
    assert unusable_reason(root) == words
    with pytest.raises(VoiceStoreUnavailable) as refused:
        DirectoryVoiceStore(root).add("a", AUDIO, "", 1.0)
    assert refused.value.reason.startswith(words + ";") and "--voices-dir" in refused.value.reason
    assert DirectoryVoiceStore(root).get("a") is None


def uploads_at_once(monkeypatch, store: DirectoryVoiceStore, uploads: list[tuple[str, bytes]]) -> list[str]:
    """Each (name, audio) uploaded by its own thread, every upload's last file write waiting at a barrier until all
    are there (so each has passed whatever it checked before writing before any renames into place); each one's
    outcome: stored, exists or full."""
    barrier = threading.Barrier(len(uploads), timeout=10)
    write = voice_store._write

    def write_then_wait(path, data):
        write(path, data)
        if path.name == voice_store.META_FILE:
            barrier.wait()

    monkeypatch.setattr("stagevisor.supervisor.http.voice_store._write", write_then_wait)
    outcomes: list[str] = []

    def upload(name: str, audio: bytes) -> None:
        try:
            store.add(name, audio, "", 1.0)
            outcomes.append("stored")
        except VoiceExists:
            outcomes.append("exists")
        except VoiceStoreFull:
            outcomes.append("full")

    threads = [threading.Thread(target=upload, args=item) for item in uploads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return sorted(outcomes)


def test_concurrent_uploads_at_the_edge_of_the_cap_store_no_voice_beyond_it(tmp_path, monkeypatch):
    """Six uploads of new names at once with one place left: one is stored, five are refused as full (six were
    stored: each checked the count before writing, none under a lock), and no staging directory is left behind."""
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.MAX_VOICES", 4)
    store = DirectoryVoiceStore(tmp_path)
    for name in ("a", "b", "c"):
        store.add(name, AUDIO, "", 1.0)
    assert uploads_at_once(monkeypatch, store, [(f"new{i}", AUDIO) for i in range(6)]) == ["full"] * 5 + ["stored"]
    assert len(store.list()) == 4
    assert [e for e in os.listdir(tmp_path) if e.startswith(".")] == []


def test_concurrent_uploads_of_one_name_store_it_once(tmp_path, monkeypatch):
    store = DirectoryVoiceStore(tmp_path)
    assert uploads_at_once(monkeypatch, store, [("same", bytes([i])) for i in range(4)]) == ["exists"] * 3 + ["stored"]
    assert os.listdir(tmp_path) == ["same"]


def unreadable_folders(root):
    """Folders of this user's under voice names that the store cannot read as voices."""
    root.mkdir(mode=0o700, exist_ok=True)
    (root / "empty").mkdir(mode=0o700)
    (root / "no-audio").mkdir(mode=0o700)
    (root / "no-audio" / "voice.json").write_text('{"transcript": "t"}')
    (root / "bad-json").mkdir(mode=0o700)
    (root / "bad-json" / "voice.json").write_text("[1]")
    (root / "bad-json" / "audio.wav").write_bytes(b"x")
    return ["bad-json", "empty", "no-audio"]


def test_a_folder_of_ours_that_cannot_be_read_is_listed_logged_once_deletable_and_holds_its_name(tmp_path, caplog):
    """Before: not listed, DELETE said there was no such voice, an upload of its name was told to DELETE it first,
    and nothing was logged."""
    names = unreadable_folders(tmp_path)
    store = DirectoryVoiceStore(tmp_path)
    assert store.list() == [UnreadableVoice(name, removable=True) for name in names]
    store.list()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("DELETE /v1/audio/voices/" in w for w in warnings)  # once each
    assert f"voice {tmp_path / 'empty'} cannot be read" in warnings[1]
    assert store.get("no-audio") is None and store.get("bad-json") is None
    with pytest.raises(VoiceExists) as taken:
        store.add("empty", AUDIO, "", 1.0)
    assert taken.value.unreadable == UnreadableVoice("empty", removable=True)
    assert all(store.delete(name) for name in names) and os.listdir(tmp_path) == []
    store.add("empty", AUDIO, "", 1.0)
    assert store.get("empty").audio == AUDIO


@pytest.mark.parametrize(
    "field, value",
    [
        ("seconds", "NaN"),
        ("seconds", "Infinity"),
        ("seconds", "-Infinity"),
        ("seconds", "1e999"),
        ("transcript", '"\\ud800"'),
    ],
)
def test_a_voice_json_cannot_carry_is_unreadable_not_a_failed_listing(tmp_path, field, value):
    """json.loads reads NaN, Infinity and a lone surrogate; the voice was listed with them, and GET
    /v1/audio/voices, whose JSON cannot carry them, answered every client 500 while the file was there."""
    import json

    from stagevisor.supervisor.http.voices import voice_listing

    store = DirectoryVoiceStore(tmp_path)
    store.add("damaged", AUDIO, "said", 1.0)
    meta = tmp_path / "damaged" / voice_store.META_FILE
    written = json.loads(meta.read_text())
    meta.write_text(json.dumps(written).replace(json.dumps(written[field]), value))
    assert store.list() == [UnreadableVoice("damaged", removable=True)]
    assert store.get("damaged") is None
    listing = voice_listing([], {}, store.list(), clones=True)
    json.dumps(listing, ensure_ascii=False, allow_nan=False).encode()  # as the listing's JSONResponse does
    assert store.delete("damaged")


def test_a_link_or_a_file_under_a_voice_name_is_listed_and_holds_its_name_but_is_neither_counted_nor_deleted(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.MAX_VOICES", 1)
    root = tmp_path / "voices"
    root.mkdir(mode=0o700)
    (root / "linked").symlink_to(tmp_path)
    (root / "file").write_text("")
    store = DirectoryVoiceStore(root)
    held = [UnreadableVoice("file", removable=False), UnreadableVoice("linked", removable=False)]
    assert store.list() == held
    for entry in held:
        with pytest.raises(VoiceExists) as taken:
            store.add(entry.name, AUDIO, "", 1.0)
        assert taken.value.unreadable == entry
        with pytest.raises(VoiceNotRemovable):
            store.delete(entry.name)
    store.add("mine", AUDIO, "", 1.0)  # the operator's entries take no place of the clients'
    assert sorted(os.listdir(root)) == ["file", "linked", "mine"] and os.listdir(tmp_path) == ["voices"]


def test_a_folder_of_ours_that_cannot_be_read_counts_toward_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.MAX_VOICES", 3)
    unreadable_folders(tmp_path)
    with pytest.raises(VoiceStoreFull):
        DirectoryVoiceStore(tmp_path).add("new", b"x", "", 1.0)


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a directory to another user")
def test_another_users_folder_is_listed_but_neither_counted_nor_deleted(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.MAX_VOICES", 1)
    root = tmp_path / "voices"
    root.mkdir(mode=0o700)
    (root / "broken").mkdir(mode=0o700)
    (root / "broken" / "voice.json").write_text("{}")
    os.chown(root / "broken", 54321, 54321)
    store = DirectoryVoiceStore(root)
    assert store.list() == [UnreadableVoice("broken", removable=False)]
    assert "belongs to uid 54321" in caplog.text and f"move it out of {root}" in caplog.text
    with pytest.raises(VoiceNotRemovable):
        store.delete("broken")
    with pytest.raises(VoiceExists):
        store.add("broken", AUDIO, "", 1.0)
    store.add("mine", AUDIO, "", 1.0)
    assert sorted(os.listdir(root)) == ["broken", "mine"] and os.listdir(root / "broken") == ["voice.json"]


def test_an_upload_removes_staging_and_trash_folders_a_daemon_that_died_left_an_hour_ago(tmp_path):
    """A daemon killed in the middle of an upload or a delete left `.upload-*` / `.delete-*` folders in the
    voices directory for good (listed by nothing, removed by nothing)."""
    root = tmp_path / "voices"
    store = DirectoryVoiceStore(root)
    store.add("first", b"RIFF", "", 1.0)
    old, recent = root / ".upload-0123456789abcdef", root / ".delete-fedcba9876543210"
    for folder in (old, recent):
        folder.mkdir(mode=0o700)
        (folder / "audio.wav").write_bytes(b"RIFF")
    stale = os.stat(old).st_mtime - 2 * voice_store.LEFTOVER_SECONDS
    os.utime(old, (stale, stale))
    link = root / ".upload-link"
    link.symlink_to(tmp_path)  # never followed, never removed
    os.utime(link, (stale, stale), follow_symlinks=False)
    store.add("second", b"RIFF", "", 1.0)
    assert not old.exists() and recent.exists()  # one of another daemon's uploads may be under way: kept
    assert link.is_symlink() and tmp_path.exists()
    assert [v.name for v in store.list()] == ["first", "second"]


def test_a_voice_folder_whose_permissions_were_changed_says_so_and_is_not_removed_but_restored(tmp_path, caplog):
    """Before: a folder of mode 000 was listed as damaged ("DELETE it, then upload it again"), and DELETE renamed it
    to a hidden .delete- folder it could not empty (not as root), answering that it was deleted while the files
    stayed; as root it was listed as usable. Its mode is what is wrong on disk, and restoring it is the remedy."""
    store = DirectoryVoiceStore(tmp_path)
    store.add("locked", AUDIO, "said", 0.5)
    os.chmod(tmp_path / "locked", 0)
    try:
        assert store.list() == [UnreadableVoice("locked", removable=False, denied=True)]
        with pytest.raises(VoiceNotRemovable):
            store.delete("locked")
        with pytest.raises(VoiceExists) as taken:
            store.add("locked", AUDIO, "", 0.5)
        assert "may not read" in taken.value.message()
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warning.startswith(f"voice {tmp_path / 'locked'} has mode 000, not the 700 the daemon gave it")
        assert f"`chmod -R u=rwX,go= {tmp_path / 'locked'}` makes it usable again" in warning
        assert sorted(os.listdir(tmp_path)) == ["locked"]
    finally:
        os.chmod(tmp_path / "locked", 0o700)
    assert store.get("locked").transcript == "said"


def test_a_full_quota_is_no_space_as_a_full_disk_is(tmp_path, monkeypatch):
    """A quota exceeded (EDQUOT) is as much out of room as a full disk (ENOSPC): the client is told the same."""
    store = DirectoryVoiceStore(tmp_path)

    def fail(path, data):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(path))

    monkeypatch.setattr("stagevisor.supervisor.http.voice_store._write", fail)
    with pytest.raises(VoiceStoreUnavailable) as failed:
        store.add("a", AUDIO, "", 1.0)
    assert failed.value.no_space and "Disk quota exceeded" in failed.value.reason


def test_a_voice_file_replaced_by_a_link_is_never_read_through(tmp_path):
    root, outside = tmp_path / "voices", tmp_path / "elsewhere.wav"
    store = DirectoryVoiceStore(root)
    store.add("narrator", AUDIO, "hello", 0.5)
    outside.write_bytes(wav(1.0))
    (root / "narrator" / "audio.wav").unlink()
    (root / "narrator" / "audio.wav").symlink_to(outside)
    found = store.find("narrator")
    assert isinstance(found, UnreadableVoice) and found.removable
    assert store.get("narrator") is None


def test_a_voice_folder_the_daemon_may_read_but_not_write_is_not_listed_as_usable(tmp_path):
    """Mode 500: readable, but the daemon could not remove it; listed as the folder of mode 000 is."""
    store = DirectoryVoiceStore(tmp_path)
    store.add("readonly", AUDIO, "said", 0.5)
    os.chmod(tmp_path / "readonly", 0o500)
    try:
        assert store.list() == [UnreadableVoice("readonly", removable=False, denied=True)]
        assert store.get("readonly") is None
    finally:
        os.chmod(tmp_path / "readonly", 0o700)


def test_a_trash_folder_a_daemon_that_died_left_an_hour_ago_is_swept_as_a_staging_one_is(tmp_path):
    root = tmp_path / "voices"
    store = DirectoryVoiceStore(root)
    store.add("first", b"RIFF", "", 1.0)
    trash = root / ".delete-0123456789abcdef"
    trash.mkdir(mode=0o700)
    (trash / "audio.wav").write_bytes(b"RIFF")
    stale = os.stat(trash).st_mtime - 2 * voice_store.LEFTOVER_SECONDS
    os.utime(trash, (stale, stale))
    assert store.sweep_leftovers() == [trash.name]
    assert not trash.exists() and [v.name for v in store.list()] == ["first"]


def test_a_parent_folder_this_user_may_write_but_not_enter_is_unusable(tmp_path, monkeypatch):
    """Creating the voices directory needs both write and search (x) permission on the folder above it."""
    monkeypatch.setattr("stagevisor.supervisor.http.voice_store.os.access", lambda path, mode: not mode & os.X_OK)
    assert "not writable" in unusable_reason(tmp_path / "voices")
