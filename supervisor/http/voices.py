"""`/v1/audio/voices`: the model's voices, the names mapped onto them, and voices clients upload (POST, DELETE).

An upload is multipart: `name`, `audio` (a file: WAV, FLAC, MP3 or Ogg, at
most MAX_REFERENCE_BYTES and MAX_REFERENCE_SECONDS) and an optional
`transcript` of what the audio says. It is checked whole before anything is
stored, so a bad upload changes nothing; the store (http/voice_store.py)
keeps it across restarts. A request names an uploaded voice like any other;
it then carries the voice's audio and transcript as its reference, which only
a model that clones accepts. An uploaded voice's name is matched exactly; it
may not be a name requests already use (TakenNames).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartParser
from starlette.requests import Request

from stagevisor.supervisor.dataplane.limits import CONTROL_CHARACTER
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.config.voices import declared_names
from stagevisor.supervisor.http.reference import (
    MAX_REFERENCE_BYTES,
    BadReference,
    normalize_reference,
    stored_rate_problem,
)
from stagevisor.supervisor.numbers import whole_number

VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # \Z: `$` would also match before a final newline
"""An uploaded voice's name: also its directory's name, so no '/', no leading '.', no '..'."""
MAX_TRANSCRIPT_CHARS = 1000
MAX_UPLOAD_BYTES = MAX_REFERENCE_BYTES + 64 * 1024
"""The whole multipart body: the audio file plus the form's other fields and boundaries."""


@dataclass(frozen=True)
class StoredVoice:
    """An uploaded voice: its reference audio (16-bit mono WAV) and what the audio says."""

    name: str
    transcript: str
    seconds: float
    created: int
    audio: bytes = b""
    problem: str = ""
    """What an upload's checks refuse in it now, though it was stored before they did (stored_voice_problem); ""
    when nothing. Such a voice is listed as not usable, and a request naming it is refused, both saying so."""

    @property
    def stale_reason(self) -> str:
        """Why a voice with a `problem` is not usable and what to do, for the client."""
        return (
            f"it was stored before uploads were checked for this: {self.problem}; DELETE it, then upload it again "
            "(the upload is checked and converted as every upload is now)"
        )

    def to_json(self, clones: bool) -> dict[str, Any]:
        """Its listing entry; a `problem`, or a model that cannot clone, makes it unusable, `unusable_reason` saying
        so."""
        entry: dict[str, Any] = {
            "id": self.name,
            "type": "uploaded",
            "transcript": self.transcript,
            "duration_seconds": round(self.seconds, 3),
            "created_at": self.created,
            "usable": clones and not self.problem,
        }
        if self.problem:
            entry["unusable_reason"] = self.stale_reason
        elif not clones:
            entry["unusable_reason"] = CANNOT_CLONE
        return entry


def transcript_problem(transcript: str) -> str | None:
    """What is wrong with an uploaded voice's transcript (None: nothing), to follow "transcript": the one rule for
    an upload and for a voice stored before the rule was (stored_voice_problem)."""
    if len(transcript) > MAX_TRANSCRIPT_CHARS:
        return f"has {len(transcript)} characters; the limit is {MAX_TRANSCRIPT_CHARS}"
    control = CONTROL_CHARACTER.search(transcript)
    if control:
        return f"contains the control character {control.group()!r} at position {control.start()}; remove it"
    return None


def stored_voice_problem(transcript: str, sample_rate: int) -> str:
    """What an upload's checks refuse in a stored voice (its transcript, and its audio's rate as the WAV file
    stored says), "" when nothing: a voice stored before a check was made is held to it when read back, by the
    same rules an upload is (transcript_problem, reference.stored_rate_problem)."""
    problems = [f"its transcript {problem}" for problem in [transcript_problem(transcript)] if problem]
    problems += [f"its audio {problem}" for problem in [stored_rate_problem(sample_rate)] if problem]
    return "; ".join(problems)


@dataclass(frozen=True)
class UnreadableVoice:
    """An entry of the voices directory under a voice's name that the store cannot read as a voice. It holds its
    name all the same (an upload of it gets 409 voice_exists saying why), and is listed as not usable.

    `removable`: a folder of the daemon's own user, its files missing or damaged, which DELETE removes (and which
    counts toward the store's cap). Otherwise something the store did not make and never touches: a symbolic
    link, a file, another user's folder; only the operator can remove it. The daemon log names the path and
    what is wrong; the client's words do not (the path is the operator's).
    """

    name: str
    removable: bool
    denied: bool = False
    """A folder of the daemon's own user whose permissions were changed from the owner-only ones the daemon gave
    it, so that the daemon may not read it (nor remove it, a folder of mode 000): not `removable`; its operator
    restores them, which makes the voice usable again, or removes it."""

    @property
    def reason(self) -> str:
        """Why it is not usable and what frees its name, for the client."""
        if self.denied:
            return (
                "the daemon may not read this uploaded voice's folder (its permissions were changed from the "
                "owner-only ones the daemon gave it; the daemon log says which); the daemon's operator must restore "
                "them, which makes the voice usable again, or remove it"
            )
        if self.removable:
            return (
                "the daemon cannot read this uploaded voice (its files are missing or damaged; the daemon log says "
                "which); DELETE it, then upload it again"
            )
        return (
            "the daemon's voices directory holds something of this name that the daemon did not store and will not "
            "remove (a symbolic link, a file or another user's folder; the daemon log says which); the daemon's "
            "operator must remove it"
        )

    def to_json(self, clones: bool) -> dict[str, Any]:
        """Its listing entry: not usable, `unreadable`, `unusable_reason` saying what to do."""
        return {
            "id": self.name,
            "type": "uploaded",
            "usable": False,
            "unreadable": True,
            "unusable_reason": self.reason,
        }


CANNOT_CLONE = "the served model cannot clone a voice from reference audio; serve a model that clones to use it"
"""Why an uploaded voice is not usable on a model without cloning (its requests get 400 cloning_not_supported)."""


@dataclass(frozen=True)
class TakenNames:
    """The names requests already use, which an upload may not take (409 voice_exists): it would hide them.

    A request matches the model's own names (ids and aliases) in any case, so
    an upload may not take one in any case either (`HEART` beside `heart`); a
    mapped name (OpenAI's, the config's `voices`) is matched as written, by
    requests and here alike.
    """

    model: Mapping[str, str] = field(default_factory=dict)
    """Every id and alias of the model's voices -> the voice's id (config.voices.declared_names)."""
    mapped: Mapping[str, str] = field(default_factory=dict)
    """The names mapped onto the model's voices -> the voice ("": the model's default; names.voice_map)."""

    def clash(self, name: str) -> str | None:
        """Why an upload may not take `name`, in words for the 409; None when it may."""
        folded = name.casefold()
        for known, voice_id in self.model.items():
            if known.casefold() == folded:
                alias = "" if known == voice_id else f"as its alias {known!r}, "
                return f"the model's voice {voice_id!r} answers to it ({alias}in any case)"
        if name in self.mapped:
            target = self.mapped[name]
            return f"it is mapped onto the model's {f'voice {target!r}' if target else 'default voice'}"
        return None


def taken_names(declared: Sequence[Mapping[str, Any]], mapped: Mapping[str, str]) -> TakenNames:
    """The names requests use, of the model's `declared` voices and the `mapped` names (names.voice_map): what an
    upload may not take, and what hides an uploaded voice stored before it, by one rule.

    A name mapped onto a voice the model lacks (a typo in the config's `voices`) takes no request
    (request._model_voice: a request for it gets the uploaded voice of that name, or voice_not_found), so it is
    neither listed, nor hides an uploaded voice, nor keeps one from being uploaded: an upload of it was refused
    409 "it is mapped onto the model's voice 'hert'", a voice that is not there. serve's log names the entry for
    the operator (names.unknown_voice_targets).
    """
    names = declared_names(declared)
    return TakenNames(names, {name: target for name, target in mapped.items() if not declared or target in names})


class VoiceExists(Exception):
    """An uploaded voice of that name is already stored; `unreadable` when what holds the name is not one the
    store can read."""

    def __init__(self, name: str, unreadable: UnreadableVoice | None = None) -> None:
        super().__init__(name)
        self.name = name
        self.unreadable = unreadable

    def message(self) -> str:
        """The 409's words: what holds the name and how to free it."""
        name, unreadable = self.name, self.unreadable
        if unreadable is None:
            return f"a voice named {name!r} is already uploaded; DELETE it first or choose another name"
        if unreadable.denied:
            return (
                f"voice name {name!r} is held by an uploaded voice whose folder the daemon may not read (its "
                "permissions were changed; the daemon log says which); choose another name, or have the daemon's "
                "operator restore its permissions or remove it"
            )
        if unreadable.removable:
            return (
                f"voice name {name!r} is held by an uploaded voice the daemon cannot read (its files are missing or "
                "damaged; the daemon log says which); DELETE it first or choose another name"
            )
        return (
            f"voice name {name!r} is held in the daemon's voices directory by something the daemon did not store and "
            "will not remove (a symbolic link, a file or another user's folder; the daemon log says which); choose "
            "another name, or have the daemon's operator remove it"
        )


class VoiceNotRemovable(Exception):
    """DELETE of a name held by something the store did not make (UnreadableVoice, not `removable`)."""

    def __init__(self, held: UnreadableVoice) -> None:
        super().__init__(held.name)
        self.held = held


class VoiceStoreFull(Exception):
    """The store holds as many voices as it keeps."""


class VoiceStoreUnavailable(Exception):
    """The store cannot write its directory: `reason` is the OS's (or the safety check's) words, for the log;
    `no_space` when the disk or quota is full."""

    def __init__(self, reason: str, *, no_space: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.no_space = no_space


class VoiceStore(Protocol):
    """Where uploaded voices live (http/voice_store.py); every method is quick local file I/O."""

    def list(self) -> list[StoredVoice | UnreadableVoice]: ...
    def get(self, name: str) -> StoredVoice | None: ...
    def find(self, name: str) -> StoredVoice | UnreadableVoice | None: ...
    def add(self, name: str, audio: bytes, transcript: str, seconds: float) -> StoredVoice: ...
    def delete(self, name: str) -> bool:
        """True when removed, False when nothing has that name; VoiceNotRemovable for what the store won't touch."""
        ...


def voice_listing(
    declared: Sequence[Mapping[str, Any]],
    mapped: Mapping[str, str],
    uploaded: Sequence[StoredVoice | UnreadableVoice],
    *,
    clones: bool,
) -> list[dict[str, Any]]:
    """GET /v1/audio/voices: the model's voices, the names mapped onto them, then the uploaded voices.

    An uploaded voice stored before the model or the map came to use its name (a model update, the config's
    `voices`, an OpenAI name such as `marin`) answers to no request: it is listed as not usable, `hidden_by`
    saying which voice takes its requests, so that it can be uploaded again under another name. One the store
    cannot read is listed as `unreadable`. Every entry that is not usable says why in `unusable_reason`.
    """
    listing = [{**voice, "type": "model"} for voice in declared]
    taken = taken_names(declared, mapped)
    effective = taken.mapped
    # A model voice its stage lists as not usable (a Qwen3-TTS Base checkpoint's, which speaks only in a cloned
    # voice) is not usable by the names mapped onto it either.
    unusable = {str(v.get("id", "")): str(v.get("unusable_reason", "")) for v in declared if v.get("usable") is False}
    for name, target in effective.items():
        alias: dict[str, Any] = {"id": name, "type": "alias", "voice": target}
        if target in unusable:
            reason = f"it is mapped onto the model's voice {target!r}, which is not usable: {unusable[target]}"
            alias.update(usable=False, unusable_reason=reason)
        listing.append(alias)
    for voice in uploaded:
        entry = voice.to_json(clones)
        if isinstance(voice, UnreadableVoice):
            listing.append(entry)
            continue
        hidden_by = taken.clash(voice.name)
        if hidden_by is not None:
            reason = f"another voice takes its requests ({hidden_by}); upload it again under another name"
            entry.update(usable=False, hidden_by=hidden_by, unusable_reason=reason)
        listing.append(entry)
    return listing


async def read_upload(request: Request, taken: TakenNames) -> tuple[str, bytes, str, float]:
    """A POST /v1/audio/voices form, checked: (name, WAV audio, transcript, seconds); ApiError names the field.

    `taken` holds the names requests already use (the model's voices and the
    mapped names), so an upload cannot hide one of them.
    """
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "multipart/form-data":
        given = f"got {media_type!r}" if media_type else "the request has none"
        raise ApiError(
            415,
            f"Content-Type must be multipart/form-data (fields name, audio, transcript), {given}",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length")
    size = None if declared is None else whole_number(declared)
    if size is not None and size > MAX_UPLOAD_BYTES:
        raise ApiError(
            413,
            f"the upload is {declared} bytes; the limit is {MAX_UPLOAD_BYTES}",
            param="audio",
            code="audio_too_large",
        )
    try:
        capped = Request(request.scope, _capped(request.receive, MAX_UPLOAD_BYTES))
        parser = _TextPartsParser(capped.headers, capped.stream(), max_files=1, max_fields=8, max_part_size=64 * 1024)
        form = await parser.parse()
    except ApiError:
        raise
    except Exception as error:  # starlette's MultiPartException, a malformed body
        raise ApiError(400, f"the multipart body cannot be read: {error}", code="invalid_multipart") from None
    try:
        for key in dict.fromkeys(form.keys()):
            if len(form.getlist(key)) > 1:  # as a GET's query: which one was meant is not ours to guess
                raise ApiError(400, f"form field {key!r} is given more than once", param=key, code="invalid_value")
        kind = form.get("type")
        if kind is not None and kind != "audio_sample":  # OpenAI's `prompt`: a voice described in words
            given = repr(kind[:40]) if isinstance(kind, str) else "given as a file"
            raise ApiError(
                400,
                f"voice type {given} is not supported: a voice is made from a recording (type 'audio_sample', "
                "the default); send it as 'audio' (or OpenAI's 'audio_sample') with its transcript",
                param="type",
                code="unsupported",
            )
        name = _field(form, "name")
        transcript = _field(form, "transcript", required=False)
        data = await _audio_part(form).read(MAX_REFERENCE_BYTES + 1)
    finally:
        await form.close()
    if not VOICE_NAME.match(name):
        raise ApiError(
            400,
            f"voice name {name[:80]!r} is not allowed; use 1 to 64 letters, digits, '_' or '-', "
            "starting with a letter or digit",
            param="name",
            code="invalid_value",
        )
    clash = taken.clash(name)
    if clash is not None:
        raise ApiError(
            409, f"voice name {name!r} is taken: {clash}; choose another name", param="name", code="voice_exists"
        )
    transcript = transcript.strip()
    # What every request carrying the voice is held to (limits.check_request_fields on reference_transcript): a
    # voice stored with a control character was listed as usable, and each request naming it got a 400 about a
    # `ref_text` the client never sent. A voice stored before is held to the same rule when read back.
    problem = transcript_problem(transcript)
    if problem:
        raise ApiError(400, f"transcript {problem}", param="transcript", code="invalid_value")
    try:
        wav, seconds = normalize_reference(data)
    except BadReference as error:
        status = {"audio_too_large": 413, "unsupported_audio_format": 415}.get(error.code, 400)
        raise ApiError(status, f"audio: {error}", param="audio", code=error.code) from None
    return name, wav, transcript, seconds


AUDIO_PARTS = ("audio", "audio_sample")
"""The names of an upload's file part: ours, and OpenAI's (its SDK's `client.audio.voices.create(audio_sample=...,
consent=..., name=...)`; the consent id means nothing here and is ignored, as other fields are)."""


class _TextPartsParser(MultiPartParser):
    """starlette's multipart parser, except that a text field that is not in the form's charset (UTF-8 unless the
    Content-Type names another, which starlette decodes) is refused, naming the field: starlette decodes it as
    Latin-1 instead, and a transcript sent in another encoding was stored as that mojibake, listed as usable."""

    def on_part_end(self) -> None:
        part, charset = self._current_part, self._charset
        if part.file is None:
            try:
                bytes(part.data).decode(charset)
            except UnicodeDecodeError as error:
                field, encoding, byte = part.field_name, charset.upper(), error.object[error.start]
                raise ApiError(
                    400,
                    f"form field {field[:80]!r} is not valid {encoding} text (byte {byte:#04x} at offset "
                    f"{error.start}); send it as {encoding}, or name its encoding in the Content-Type "
                    "(multipart/form-data; charset=...)",
                    param=field,
                    code="invalid_value",
                ) from None
        super().on_part_end()


def _audio_part(form: Any) -> UploadFile:
    """The form's audio file (one file at most: the form reader refuses a second)."""
    key = next((key for key in AUDIO_PARTS if key in form), "audio")
    audio = form.get(key)
    if not isinstance(audio, UploadFile):
        raise ApiError(
            400, f"'{key}' must be a file part (-F audio=@voice.wav)", param=key, code="missing_required_parameter"
        )
    return audio


def _capped(receive: Any, limit: int) -> Any:
    """`receive` that fails with 413 once the body passes `limit` bytes (a chunked body has no Content-Length)."""
    seen = 0

    async def wrapped() -> Any:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise ApiError(413, f"the upload exceeds {limit} bytes", param="audio", code="audio_too_large")
        return message

    return wrapped


def _field(form: Any, key: str, *, required: bool = True) -> str:
    value = form.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        what = "missing" if value is None else "a file, not text"
        raise ApiError(400, f"form field {key!r} is {what}", param=key, code="missing_required_parameter")
    return value
