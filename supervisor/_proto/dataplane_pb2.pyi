from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FailureCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_CODE_INTERNAL: _ClassVar[FailureCode]
    FAILURE_CODE_INVALID_ARGUMENT: _ClassVar[FailureCode]
    FAILURE_CODE_UNAVAILABLE: _ClassVar[FailureCode]
FAILURE_CODE_INTERNAL: FailureCode
FAILURE_CODE_INVALID_ARGUMENT: FailureCode
FAILURE_CODE_UNAVAILABLE: FailureCode

class FrameBatch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("request_id", "src", "dst", "hello", "submit", "chunk", "end", "done", "failure", "cancel", "credit", "release", "metrics", "keepalive", "handed_on", "leaving", "piece", "replicas", "peers")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    SUBMIT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    HANDED_ON_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    src: str
    dst: str
    hello: Hello
    submit: Submit
    chunk: Chunk
    end: StreamEnd
    done: Done
    failure: Failure
    cancel: Cancel
    credit: Credit
    release: Release
    metrics: MetricsReport
    keepalive: KeepAlive
    handed_on: HandedOn
    leaving: Leaving
    piece: Piece
    replicas: Replicas
    peers: Peers
    def __init__(self, request_id: _Optional[str] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., submit: _Optional[_Union[Submit, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., end: _Optional[_Union[StreamEnd, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., metrics: _Optional[_Union[MetricsReport, _Mapping]] = ..., keepalive: _Optional[_Union[KeepAlive, _Mapping]] = ..., handed_on: _Optional[_Union[HandedOn, _Mapping]] = ..., leaving: _Optional[_Union[Leaving, _Mapping]] = ..., piece: _Optional[_Union[Piece, _Mapping]] = ..., replicas: _Optional[_Union[Replicas, _Mapping]] = ..., peers: _Optional[_Union[Peers, _Mapping]] = ...) -> None: ...

class Peers(_message.Message):
    __slots__ = ("version", "peers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    version: int
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    def __init__(self, version: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ...) -> None: ...

class Peer(_message.Message):
    __slots__ = ("address", "node_id", "tcp")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TCP_FIELD_NUMBER: _ClassVar[int]
    address: str
    node_id: str
    tcp: str
    def __init__(self, address: _Optional[str] = ..., node_id: _Optional[str] = ..., tcp: _Optional[str] = ...) -> None: ...

class Replicas(_message.Message):
    __slots__ = ("version", "sets", "lost", "names")
    class NamesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SETS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    version: int
    sets: _containers.RepeatedCompositeFieldContainer[ReplicaSet]
    lost: _containers.RepeatedScalarFieldContainer[str]
    names: _containers.ScalarMap[str, str]
    def __init__(self, version: _Optional[int] = ..., sets: _Optional[_Iterable[_Union[ReplicaSet, _Mapping]]] = ..., lost: _Optional[_Iterable[str]] = ..., names: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReplicaSet(_message.Message):
    __slots__ = ("address", "ready")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    address: str
    ready: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, address: _Optional[str] = ..., ready: _Optional[_Iterable[str]] = ...) -> None: ...

class HandedOn(_message.Message):
    __slots__ = ("replica", "request_ids")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    replica: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Leaving(_message.Message):
    __slots__ = ("finished", "failed", "message")
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    finished: _containers.RepeatedScalarFieldContainer[str]
    failed: _containers.RepeatedScalarFieldContainer[str]
    message: str
    def __init__(self, finished: _Optional[_Iterable[str]] = ..., failed: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("peer",)
    PEER_FIELD_NUMBER: _ClassVar[int]
    peer: str
    def __init__(self, peer: _Optional[str] = ...) -> None: ...

class Submit(_message.Message):
    __slots__ = ("request", "data", "trace", "timings")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    request: Value
    data: Value
    trace: _containers.RepeatedScalarFieldContainer[str]
    timings: Timings
    def __init__(self, request: _Optional[_Union[Value, _Mapping]] = ..., data: _Optional[_Union[Value, _Mapping]] = ..., trace: _Optional[_Iterable[str]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Opening(_message.Message):
    __slots__ = ("request", "trace", "timings")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    request: Value
    trace: _containers.RepeatedScalarFieldContainer[str]
    timings: Timings
    def __init__(self, request: _Optional[_Union[Value, _Mapping]] = ..., trace: _Optional[_Iterable[str]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("value", "opening")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    OPENING_FIELD_NUMBER: _ClassVar[int]
    value: Value
    opening: Opening
    def __init__(self, value: _Optional[_Union[Value, _Mapping]] = ..., opening: _Optional[_Union[Opening, _Mapping]] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("has_data", "data", "opening", "src_end", "timings")
    HAS_DATA_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OPENING_FIELD_NUMBER: _ClassVar[int]
    SRC_END_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    has_data: bool
    data: Value
    opening: Opening
    src_end: float
    timings: Timings
    def __init__(self, has_data: _Optional[bool] = ..., data: _Optional[_Union[Value, _Mapping]] = ..., opening: _Optional[_Union[Opening, _Mapping]] = ..., src_end: _Optional[float] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("trace", "timings")
    TRACE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    trace: _containers.RepeatedScalarFieldContainer[str]
    timings: Timings
    def __init__(self, trace: _Optional[_Iterable[str]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("names", "starts", "ends")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    starts: _containers.RepeatedScalarFieldContainer[float]
    ends: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, names: _Optional[_Iterable[str]] = ..., starts: _Optional[_Iterable[float]] = ..., ends: _Optional[_Iterable[float]] = ...) -> None: ...

class MetricsReport(_message.Message):
    __slots__ = ("group", "pid", "stages", "edges")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    group: str
    pid: int
    stages: _containers.RepeatedCompositeFieldContainer[StageStats]
    edges: _containers.RepeatedCompositeFieldContainer[EdgeStats]
    def __init__(self, group: _Optional[str] = ..., pid: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[StageStats, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[EdgeStats, _Mapping]]] = ...) -> None: ...

class StageStats(_message.Message):
    __slots__ = ("stage", "count", "sum", "buckets", "in_flight", "failures", "calls")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    count: int
    sum: float
    buckets: _containers.RepeatedScalarFieldContainer[int]
    in_flight: int
    failures: int
    calls: int
    def __init__(self, stage: _Optional[str] = ..., count: _Optional[int] = ..., sum: _Optional[float] = ..., buckets: _Optional[_Iterable[int]] = ..., in_flight: _Optional[int] = ..., failures: _Optional[int] = ..., calls: _Optional[int] = ...) -> None: ...

class EdgeStats(_message.Message):
    __slots__ = ("src", "dst", "transport", "handoffs", "chunks", "bytes", "latency_count", "latency_sum", "latency_buckets")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LATENCY_COUNT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SUM_FIELD_NUMBER: _ClassVar[int]
    LATENCY_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    transport: str
    handoffs: int
    chunks: int
    bytes: int
    latency_count: int
    latency_sum: float
    latency_buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., transport: _Optional[str] = ..., handoffs: _Optional[int] = ..., chunks: _Optional[int] = ..., bytes: _Optional[int] = ..., latency_count: _Optional[int] = ..., latency_sum: _Optional[float] = ..., latency_buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("stage", "code", "message", "client_message", "error_type", "client_code", "client_field")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CODE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_FIELD_FIELD_NUMBER: _ClassVar[int]
    stage: str
    code: FailureCode
    message: str
    client_message: str
    error_type: str
    client_code: str
    client_field: str
    def __init__(self, stage: _Optional[str] = ..., code: _Optional[_Union[FailureCode, str]] = ..., message: _Optional[str] = ..., client_message: _Optional[str] = ..., error_type: _Optional[str] = ..., client_code: _Optional[str] = ..., client_field: _Optional[str] = ...) -> None: ...

class KeepAlive(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class Piece(_message.Message):
    __slots__ = ("buffer", "offset", "data", "total")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    offset: int
    data: bytes
    total: int
    def __init__(self, buffer: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total: _Optional[int] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: int
    def __init__(self, chunks: _Optional[int] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("none", "boolean", "integer", "real", "text", "raw", "list", "map", "tensor", "shared_raw", "big_integer", "packed")
    NONE_FIELD_NUMBER: _ClassVar[int]
    BOOLEAN_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    REAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    SHARED_RAW_FIELD_NUMBER: _ClassVar[int]
    BIG_INTEGER_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    none: bool
    boolean: bool
    integer: int
    real: float
    text: str
    raw: bytes
    list: ValueList
    map: ValueMap
    tensor: Tensor
    shared_raw: SharedBuffer
    big_integer: str
    packed: bytes
    def __init__(self, none: _Optional[bool] = ..., boolean: _Optional[bool] = ..., integer: _Optional[int] = ..., real: _Optional[float] = ..., text: _Optional[str] = ..., raw: _Optional[bytes] = ..., list: _Optional[_Union[ValueList, _Mapping]] = ..., map: _Optional[_Union[ValueMap, _Mapping]] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., shared_raw: _Optional[_Union[SharedBuffer, _Mapping]] = ..., big_integer: _Optional[str] = ..., packed: _Optional[bytes] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ValueMap(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "shared", "framework")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    shared: SharedBuffer
    framework: str
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., shared: _Optional[_Union[SharedBuffer, _Mapping]] = ..., framework: _Optional[str] = ...) -> None: ...

class SharedBuffer(_message.Message):
    __slots__ = ("name", "size", "pooled", "inline")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    POOLED_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    pooled: bool
    inline: bool
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., pooled: _Optional[bool] = ..., inline: _Optional[bool] = ...) -> None: ...
