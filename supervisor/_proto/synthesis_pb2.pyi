from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "voice", "reference_audio", "reference_transcript", "options", "timings")
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
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    reference_audio: bytes
    reference_transcript: str
    options: _containers.ScalarMap[str, str]
    timings: bool
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ..., reference_audio: _Optional[bytes] = ..., reference_transcript: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., timings: _Optional[bool] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("pcm", "sample_rate", "sequence", "timings")
    PCM_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    pcm: bytes
    sample_rate: int
    sequence: int
    timings: RequestTimings
    def __init__(self, pcm: _Optional[bytes] = ..., sample_rate: _Optional[int] = ..., sequence: _Optional[int] = ..., timings: _Optional[_Union[RequestTimings, _Mapping]] = ...) -> None: ...

class RequestTimings(_message.Message):
    __slots__ = ("total_seconds", "first_audio_seconds", "stages", "handoffs")
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    total_seconds: float
    first_audio_seconds: float
    stages: _containers.RepeatedCompositeFieldContainer[StageTiming]
    handoffs: _containers.RepeatedCompositeFieldContainer[HandoffTiming]
    def __init__(self, total_seconds: _Optional[float] = ..., first_audio_seconds: _Optional[float] = ..., stages: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., handoffs: _Optional[_Iterable[_Union[HandoffTiming, _Mapping]]] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "group", "start_seconds", "duration_seconds", "end_unknown")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    stage: str
    group: str
    start_seconds: float
    duration_seconds: float
    end_unknown: bool
    def __init__(self, stage: _Optional[str] = ..., group: _Optional[str] = ..., start_seconds: _Optional[float] = ..., duration_seconds: _Optional[float] = ..., end_unknown: _Optional[bool] = ...) -> None: ...

class HandoffTiming(_message.Message):
    __slots__ = ("src", "dst", "transport", "start_seconds", "latency_seconds")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    transport: str
    start_seconds: float
    latency_seconds: float
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., transport: _Optional[str] = ..., start_seconds: _Optional[float] = ..., latency_seconds: _Optional[float] = ...) -> None: ...
