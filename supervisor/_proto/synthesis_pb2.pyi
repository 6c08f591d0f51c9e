from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "voice", "reference_audio", "reference_transcript", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_AUDIO_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    reference_audio: bytes
    reference_transcript: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ..., reference_audio: _Optional[bytes] = ..., reference_transcript: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("pcm", "sample_rate", "sequence")
    PCM_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    sample_rate: int
    sequence: int
    def __init__(self, pcm: _Optional[bytes] = ..., sample_rate: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...
