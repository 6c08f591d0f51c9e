"""Uploaded voices on disk: one private directory per voice under --voices-dir, surviving restarts.

The runtime directory's rules apply: the directory is the user's own (0700,
never a symbolic link, never another user's), files are created 0600 with
O_NOFOLLOW, and a voice appears only complete: its files are written into a
hidden staging directory that is renamed into place in one step, which fails
when the name is taken (so two uploads of one name cannot both win). The last
check of the name and of MAX_VOICES and that rename happen under a lock (this
process's and a flock on the directory, for other daemons), so uploads in
parallel cannot store more than MAX_VOICES. A delete renames the voice away
first, so a reader sees it whole or not at all. A staging or trash folder that
a daemon killed in the middle left behind is removed by a later upload, once it
is an hour old (another daemon's upload may be under way in a newer one).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import secrets
import stat
import threading
import time
import wave
from pathlib import Path
from typing import BinaryIO, Iterator

from stagevisor.supervisor.daemon.runtime_files import make_private_dir, not_private_dir, remove_private_tree
from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.http.voices import (
    VOICE_NAME,
    StoredVoice,
    UnreadableVoice,
    VoiceExists,
    VoiceNotRemovable,
    VoiceStoreFull,
    VoiceStoreUnavailable,
    stored_voice_problem,
)

log = logging.getLogger("stagevisor.daemon")

AUDIO_FILE = "audio.wav"
META_FILE = "voice.json"
MAX_VOICES = 256
"""Voices kept at most: an upload beyond it is refused until one is deleted."""
ROLE = "voices directory"
"""What the safety errors call the store's directory."""
REMEDY = "pass serve --voices-dir a directory this user owns and can write, or --voices-dir none"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
LEFTOVER_PREFIXES = (".upload-", ".delete-")
"""The hidden folders an upload stages a voice in and a delete renames it to, gone once either ends."""
LEFTOVER_SECONDS = 3600.0
"""Age past which such a folder is a daemon's that died in the middle (an upload or a delete takes seconds, and
another daemon may share the directory): the next upload removes it."""


class DirectoryVoiceStore:
    """Voices under `root` (created on the first upload, so a daemon nobody uploads to leaves nothing)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._reported: set[tuple[str, str]] = set()  # (name, why): each unreadable entry is logged once

    def list(self) -> list[StoredVoice | UnreadableVoice]:
        found = (self._inspect(name) for name in self._names())
        return [voice for voice in found if voice is not None]

    def get(self, name: str, *, with_audio: bool = True) -> StoredVoice | None:
        found = self._inspect(name, with_audio=with_audio)
        return found if isinstance(found, StoredVoice) else None

    def find(self, name: str) -> StoredVoice | UnreadableVoice | None:
        """What a request naming `name` finds: a voice (with its audio), an entry that cannot be read as one (so
        the request can say what is wrong, not that there is no such voice), or None."""
        return self._inspect(name, with_audio=True)

    def _inspect(self, name: str, *, with_audio: bool = False) -> StoredVoice | UnreadableVoice | None:
        """What holds `name` in the directory: a voice, an entry that cannot be read as one, or None (nothing)."""
        if not VOICE_NAME.match(name):
            return None
        folder = self.root / name
        try:
            info = os.lstat(folder)
        except OSError:  # absent, or the directory itself is unreadable (listing says so)
            return None
        foreign = not_private_dir(folder, info, "voice")
        if foreign is not None:
            return self._unreadable(name, foreign, removable=False)
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o700 != 0o700:  # a folder of mode 000 was listed as damaged and DELETE "removed" it: it could not
            why = f"voice {folder} has mode {mode:03o}, not the 700 the daemon gave it, so it may not read or remove it"
            return self._unreadable(name, why, removable=False, denied=True)
        try:
            return _read_voice(folder, name, with_audio)
        except PermissionError as error:  # a file in it whose mode was changed (as for the folder, not as root)
            return self._unreadable(name, f"voice {folder} cannot be read: {error}", removable=False, denied=True)
        except (OSError, ValueError, TypeError, OverflowError) as error:
            return self._unreadable(name, f"voice {folder} cannot be read: {error}", removable=True)

    def _unreadable(self, name: str, why: str, *, removable: bool, denied: bool = False) -> UnreadableVoice:
        """`name`'s UnreadableVoice, logged the first time it is seen for this reason."""
        if (name, why) not in self._reported:
            self._reported.add((name, why))
            if denied:
                remedy = f"`chmod -R u=rwX,go= {self.root / name}` makes it usable again; or move it out of {self.root}"
            elif removable:
                remedy = f"DELETE /v1/audio/voices/{name} removes it"
            else:
                remedy = f"the daemon will not remove it: move it out of {self.root}"
            log.warning("%s; it is listed as not usable and no voice can be uploaded under its name: %s", why, remedy)
        return UnreadableVoice(name, removable, denied)

    def add(self, name: str, audio: bytes, transcript: str, seconds: float) -> StoredVoice:
        """Store a voice; VoiceExists when the name is taken, VoiceStoreFull at MAX_VOICES, VoiceStoreUnavailable
        when the directory cannot be written. Nothing half-written."""
        assert VOICE_NAME.match(name), name
        # The common cases in plain words first (a file in the way, an unwritable folder); make_private_dir then
        # checks again on a descriptor, so a link planted meanwhile is refused, never followed.
        unusable = unusable_reason(self.root)
        if unusable:
            raise VoiceStoreUnavailable(f"{unusable}; {REMEDY}")
        try:
            make_private_dir(self.root, ROLE, REMEDY)
        except DaemonError as error:
            raise VoiceStoreUnavailable(str(error)) from None
        except OSError as error:
            raise _unavailable(self.root, error) from None
        self._check_room(name)  # refused before anything is written; checked again, under the lock, below
        self.sweep_leftovers()
        created = int(time.time())
        staging = self.root / f".upload-{secrets.token_hex(8)}"
        try:
            os.mkdir(staging, 0o700)
        except OSError as error:
            raise _unavailable(self.root, error) from None
        try:
            _write(staging / AUDIO_FILE, audio)
            meta = {"name": name, "transcript": transcript, "seconds": round(seconds, 3), "created": created}
            _write(staging / META_FILE, json.dumps(meta).encode())
            with _placing(self.root):
                self._check_room(name)
                try:
                    # rename(2) onto an existing non-empty directory fails: the name is taken, atomically.
                    os.rename(staging, self.root / name)
                except OSError as error:
                    if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        raise VoiceExists(name) from None
                    raise
        except OSError as error:
            remove_private_tree(staging)
            raise _unavailable(self.root, error) from None
        except BaseException:
            remove_private_tree(staging)
            raise
        return StoredVoice(name=name, transcript=transcript, seconds=seconds, created=created, audio=audio)

    def delete(self, name: str) -> bool:
        """Remove a voice, or a folder of ours under a voice's name that cannot be read as one; False when there is
        none of that name; VoiceNotRemovable for a link, a file or another user's folder (never followed)."""
        found = self._inspect(name)
        if found is None:
            return False
        if isinstance(found, UnreadableVoice) and not found.removable:
            raise VoiceNotRemovable(found)
        trash = self.root / f".delete-{secrets.token_hex(8)}"
        try:
            os.rename(self.root / name, trash)
        except FileNotFoundError:
            return False
        except OSError as error:
            raise _unavailable(self.root, error) from None
        remove_private_tree(trash)
        return True

    def sweep_leftovers(self, older_than: float = LEFTOVER_SECONDS) -> builtins.list[str]:
        """Remove the staging and trash folders (this user's, never a link) left for `older_than` seconds by a
        daemon that died in the middle of an upload or a delete: nothing else ever would. Returns their names."""
        now = time.time()
        swept: builtins.list[str] = []
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return swept  # not there yet, or unreadable: the upload's own checks say so
        for entry in entries:
            if not entry.name.startswith(LEFTOVER_PREFIXES) or not _ours(entry):
                continue
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if age > older_than and remove_private_tree(Path(entry.path)):
                log.info(
                    "removed %s from voices directory %s, left %.0f s ago by an upload or delete that did not end",
                    entry.name,
                    self.root,
                    age,
                )
                swept.append(entry.name)
        return swept

    def _check_room(self, name: str) -> None:
        """VoiceExists when `name` is taken (by anything), VoiceStoreFull when the store holds MAX_VOICES."""
        held = self._inspect(name)
        if held is not None:
            raise VoiceExists(name, held if isinstance(held, UnreadableVoice) else None)
        if os.path.lexists(self.root / name):
            raise VoiceExists(name)
        if sum(1 for entry in self._entries() if _ours(entry)) >= MAX_VOICES:
            raise VoiceStoreFull(MAX_VOICES)

    def _names(self) -> builtins.list[str]:  # `list` in this class is the method above
        return [entry.name for entry in self._entries()]

    def _entries(self) -> builtins.list[os.DirEntry[str]]:
        """The directory's entries under a voice's name, whatever they are, by name."""
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except OSError as error:
            log.warning("uploaded voices cannot be listed: %s; %s", _unavailable(self.root, error), REMEDY)
            return []
        return [entry for entry in entries if VOICE_NAME.match(entry.name)]


def _ours(entry: os.DirEntry[str]) -> bool:
    """Whether `entry` counts toward MAX_VOICES: a folder of this user's, which DELETE can remove (a voice, or one
    that cannot be read). A link, a file or another user's folder is the operator's, not the clients'."""
    try:
        return entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()
    except OSError:
        return False


def _read_voice(folder: Path, name: str, with_audio: bool) -> StoredVoice:
    """The voice in `folder` (this user's directory); OSError, ValueError, TypeError or OverflowError (a `created`
    of Infinity) when it cannot be read."""
    meta = json.loads(_read(folder / META_FILE))
    if not isinstance(meta, dict):
        raise ValueError(f"{META_FILE} holds no JSON object")
    # Python's JSON reader takes NaN, Infinity and lone surrogates ("\ud800"), which the listing's JSON cannot
    # carry: GET /v1/audio/voices answered every client 500 while such a file was there.
    seconds = float(meta.get("seconds", 0.0))
    if not math.isfinite(seconds):
        raise ValueError(f"{META_FILE} gives 'seconds' as {seconds}, not a finite number")
    transcript = str(meta.get("transcript", ""))
    transcript.encode()  # UnicodeEncodeError, a ValueError, for a lone surrogate
    audio = _read(folder / AUDIO_FILE) if with_audio else b""
    return StoredVoice(
        name=name,
        transcript=transcript,
        seconds=seconds,
        created=int(meta.get("created", 0)),
        audio=audio,
        # Held to the upload's checks as they are now: a voice stored before one was listed as usable, and every
        # request naming it failed (a 192 kHz reference past the request's size limit, a transcript's control
        # character), in words about a `ref_audio` or `ref_text` the client never sent.
        problem=stored_voice_problem(transcript, _sample_rate(folder / AUDIO_FILE)),
    )


_PLACING = threading.Lock()
"""Held, with _placing's file lock, from an upload's last check of the name and the count to its rename."""


@contextlib.contextmanager
def _placing(root: Path) -> Iterator[None]:
    """Uploads into `root` one at a time from their last check to their rename, so the checks hold when it happens.

    The thread lock orders this daemon's uploads (HTTP runs each in a thread); an exclusive flock(2) on the
    directory orders them with another daemon's uploads into the same directory (the default --voices-dir is
    the user's, shared by their daemons). Both are held only for a listing and a rename.
    """
    with _PLACING:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock


def unusable_reason(root: Path) -> str | None:
    """Why voices could not be stored under `root` (None: they can), checked without creating anything: the
    directory, or the nearest folder above it that exists, must be a directory this user can write."""
    root = Path(root)
    existing = root
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if existing == root:
        refused = not_private_dir(root, os.lstat(root), ROLE)
        if refused:
            return refused
    elif not os.path.isdir(existing):
        return f"{existing} is not a directory, so voices directory {root} cannot be made"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user, so voices cannot be stored in {root}"
    return None


def _unavailable(root: Path, error: OSError) -> VoiceStoreUnavailable:
    """`error` from writing (or reading) voices directory `root`, naming the directory: a write to a descriptor
    (a full disk) carries no file name of its own."""
    inside = f", at {error.filename}" if error.filename and Path(error.filename) != root else ""
    return VoiceStoreUnavailable(
        f"voices directory {root}: {error.strerror or error}{inside}", no_space=error.errno in NO_SPACE
    )


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _sample_rate(path: Path) -> int:
    """The sample rate a WAV file's header gives (its header alone is read); ValueError when it is none."""
    with _regular_file(path) as file:
        try:
            with wave.open(file, "rb") as wav:
                return wav.getframerate()
        except (wave.Error, EOFError) as error:
            raise ValueError(f"{AUDIO_FILE} is not a WAV file: {error or 'it ends inside its header'}") from None


def _read(path: Path) -> bytes:
    with _regular_file(path) as file:
        return file.read()


@contextlib.contextmanager
def _regular_file(path: Path) -> Iterator[BinaryIO]:
    """`path` open for reading, never through a link; OSError when it is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as file:
            yield file
    finally:
        os.close(fd)
