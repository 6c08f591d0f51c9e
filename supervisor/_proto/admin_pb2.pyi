from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyRequest(_message.Message):
    __slots__ = ("model_path", "config_path", "config_text", "isolate_stages", "stage_processes", "process_replicas", "dry_run")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_PATH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_TEXT_FIELD_NUMBER: _ClassVar[int]
    ISOLATE_STAGES_FIELD_NUMBER: _ClassVar[int]
    STAGE_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    PROCESS_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    config_path: str
    config_text: str
    isolate_stages: _containers.RepeatedScalarFieldContainer[str]
    stage_processes: _containers.RepeatedScalarFieldContainer[str]
    process_replicas: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    def __init__(self, model_path: _Optional[str] = ..., config_path: _Optional[str] = ..., config_text: _Optional[str] = ..., isolate_stages: _Optional[_Iterable[str]] = ..., stage_processes: _Optional[_Iterable[str]] = ..., process_replicas: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("changed", "applied", "diff_json", "plan_json", "voices_json")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DIFF_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    VOICES_JSON_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    applied: bool
    diff_json: str
    plan_json: str
    voices_json: str
    def __init__(self, changed: _Optional[bool] = ..., applied: _Optional[bool] = ..., diff_json: _Optional[str] = ..., plan_json: _Optional[str] = ..., voices_json: _Optional[str] = ...) -> None: ...

class ScaleGroupRequest(_message.Message):
    __slots__ = ("name", "replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    replicas: int
    def __init__(self, name: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class ScaleGroupResponse(_message.Message):
    __slots__ = ("name", "old_replicas", "new_replicas", "workers", "pids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OLD_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NEW_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    old_replicas: int
    new_replicas: int
    workers: _containers.RepeatedScalarFieldContainer[str]
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., old_replicas: _Optional[int] = ..., new_replicas: _Optional[int] = ..., workers: _Optional[_Iterable[str]] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplicaWorker(_message.Message):
    __slots__ = ("name", "replica", "gpu", "pid", "state", "restarts", "started_at", "physical_gpu", "device", "resources", "host", "node_id", "node", "silent_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_GPU_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SILENT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    replica: int
    gpu: int
    pid: int
    state: str
    restarts: int
    started_at: float
    physical_gpu: str
    device: str
    resources: GroupResources
    host: str
    node_id: str
    node: str
    silent_s: float
    def __init__(self, name: _Optional[str] = ..., replica: _Optional[int] = ..., gpu: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., restarts: _Optional[int] = ..., started_at: _Optional[float] = ..., physical_gpu: _Optional[str] = ..., device: _Optional[str] = ..., resources: _Optional[_Union[GroupResources, _Mapping]] = ..., host: _Optional[str] = ..., node_id: _Optional[str] = ..., node: _Optional[str] = ..., silent_s: _Optional[float] = ...) -> None: ...

class GetTopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProcessGroup(_message.Message):
    __slots__ = ("name", "stages", "gpu", "total_gpu_memory_fraction", "tp_rank", "pid", "state", "restarts", "started_at", "fraction_enforced", "physical_gpu", "device", "resources", "replicas", "workers", "node", "host", "node_id", "autoscale", "silent_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPU_MEMORY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FRACTION_ENFORCED_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_GPU_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALE_FIELD_NUMBER: _ClassVar[int]
    SILENT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    stages: _containers.RepeatedScalarFieldContainer[str]
    gpu: int
    total_gpu_memory_fraction: float
    tp_rank: int
    pid: int
    state: str
    restarts: int
    started_at: float
    fraction_enforced: bool
    physical_gpu: str
    device: str
    resources: GroupResources
    replicas: int
    workers: _containers.RepeatedCompositeFieldContainer[ReplicaWorker]
    node: str
    host: str
    node_id: str
    autoscale: AutoscaleBounds
    silent_s: float
    def __init__(self, name: _Optional[str] = ..., stages: _Optional[_Iterable[str]] = ..., gpu: _Optional[int] = ..., total_gpu_memory_fraction: _Optional[float] = ..., tp_rank: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., restarts: _Optional[int] = ..., started_at: _Optional[float] = ..., fraction_enforced: _Optional[bool] = ..., physical_gpu: _Optional[str] = ..., device: _Optional[str] = ..., resources: _Optional[_Union[GroupResources, _Mapping]] = ..., replicas: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[ReplicaWorker, _Mapping]]] = ..., node: _Optional[str] = ..., host: _Optional[str] = ..., node_id: _Optional[str] = ..., autoscale: _Optional[_Union[AutoscaleBounds, _Mapping]] = ..., silent_s: _Optional[float] = ...) -> None: ...

class AutoscaleBounds(_message.Message):
    __slots__ = ("min_replicas", "max_replicas", "target_first_audio_p90_seconds", "target_stall_p90_seconds", "max_in_flight_per_replica", "scale_down_ratio", "scale_up_cooldown_seconds", "scale_down_cooldown_seconds", "window_seconds")
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIRST_AUDIO_P90_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_STALL_P90_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    SCALE_DOWN_RATIO_FIELD_NUMBER: _ClassVar[int]
    SCALE_UP_COOLDOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCALE_DOWN_COOLDOWN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    min_replicas: int
    max_replicas: int
    target_first_audio_p90_seconds: float
    target_stall_p90_seconds: float
    max_in_flight_per_replica: float
    scale_down_ratio: float
    scale_up_cooldown_seconds: float
    scale_down_cooldown_seconds: float
    window_seconds: float
    def __init__(self, min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., target_first_audio_p90_seconds: _Optional[float] = ..., target_stall_p90_seconds: _Optional[float] = ..., max_in_flight_per_replica: _Optional[float] = ..., scale_down_ratio: _Optional[float] = ..., scale_up_cooldown_seconds: _Optional[float] = ..., scale_down_cooldown_seconds: _Optional[float] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class GroupResources(_message.Message):
    __slots__ = ("rss_bytes", "cpu_seconds", "cpu_percent", "threads", "open_fds", "gpu_memory_bytes", "memory_budget_bytes", "budget_kind", "over_budget")
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FDS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_KIND_FIELD_NUMBER: _ClassVar[int]
    OVER_BUDGET_FIELD_NUMBER: _ClassVar[int]
    rss_bytes: int
    cpu_seconds: float
    cpu_percent: float
    threads: int
    open_fds: int
    gpu_memory_bytes: int
    memory_budget_bytes: int
    budget_kind: str
    over_budget: bool
    def __init__(self, rss_bytes: _Optional[int] = ..., cpu_seconds: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., threads: _Optional[int] = ..., open_fds: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., budget_kind: _Optional[str] = ..., over_budget: _Optional[bool] = ...) -> None: ...

class Stage(_message.Message):
    __slots__ = ("name", "process", "gpu", "tp_size", "total_gpu_memory_fraction", "fraction_source", "stand_in")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPU_MEMORY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    FRACTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    STAND_IN_FIELD_NUMBER: _ClassVar[int]
    name: str
    process: str
    gpu: _containers.RepeatedScalarFieldContainer[int]
    tp_size: int
    total_gpu_memory_fraction: float
    fraction_source: str
    stand_in: bool
    def __init__(self, name: _Optional[str] = ..., process: _Optional[str] = ..., gpu: _Optional[_Iterable[int]] = ..., tp_size: _Optional[int] = ..., total_gpu_memory_fraction: _Optional[float] = ..., fraction_source: _Optional[str] = ..., stand_in: _Optional[bool] = ...) -> None: ...

class Edge(_message.Message):
    __slots__ = ("src", "dst", "kind", "cross_process", "process_safe", "transport", "src_group", "dst_group", "requests")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CROSS_PROCESS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_SAFE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    SRC_GROUP_FIELD_NUMBER: _ClassVar[int]
    DST_GROUP_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    src: str
    dst: str
    kind: str
    cross_process: bool
    process_safe: bool
    transport: str
    src_group: str
    dst_group: str
    requests: _containers.ScalarMap[str, int]
    def __init__(self, src: _Optional[str] = ..., dst: _Optional[str] = ..., kind: _Optional[str] = ..., cross_process: _Optional[bool] = ..., process_safe: _Optional[bool] = ..., transport: _Optional[str] = ..., src_group: _Optional[str] = ..., dst_group: _Optional[str] = ..., requests: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GpuBudget(_message.Message):
    __slots__ = ("id", "total_gpu_memory_fraction", "limit", "groups", "total_bytes", "measured_bytes", "over_limit")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GPU_MEMORY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEASURED_BYTES_FIELD_NUMBER: _ClassVar[int]
    OVER_LIMIT_FIELD_NUMBER: _ClassVar[int]
    id: int
    total_gpu_memory_fraction: float
    limit: float
    groups: _containers.RepeatedScalarFieldContainer[str]
    total_bytes: int
    measured_bytes: int
    over_limit: bool
    def __init__(self, id: _Optional[int] = ..., total_gpu_memory_fraction: _Optional[float] = ..., limit: _Optional[float] = ..., groups: _Optional[_Iterable[str]] = ..., total_bytes: _Optional[int] = ..., measured_bytes: _Optional[int] = ..., over_limit: _Optional[bool] = ...) -> None: ...

class Topology(_message.Message):
    __slots__ = ("model", "model_path", "changed", "groups", "stages", "edges", "gpus", "warnings")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_path: str
    changed: bool
    groups: _containers.RepeatedCompositeFieldContainer[ProcessGroup]
    stages: _containers.RepeatedCompositeFieldContainer[Stage]
    edges: _containers.RepeatedCompositeFieldContainer[Edge]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuBudget]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., model_path: _Optional[str] = ..., changed: _Optional[bool] = ..., groups: _Optional[_Iterable[_Union[ProcessGroup, _Mapping]]] = ..., stages: _Optional[_Iterable[_Union[Stage, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[Edge, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuBudget, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RootCause(_message.Message):
    __slots__ = ("group", "stage", "message", "traceback", "time", "recovered_at")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_AT_FIELD_NUMBER: _ClassVar[int]
    group: str
    stage: str
    message: str
    traceback: str
    time: float
    recovered_at: float
    def __init__(self, group: _Optional[str] = ..., stage: _Optional[str] = ..., message: _Optional[str] = ..., traceback: _Optional[str] = ..., time: _Optional[float] = ..., recovered_at: _Optional[float] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("name", "state", "pid", "restarts", "resources", "host", "node_id", "silent_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SILENT_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    pid: int
    restarts: int
    resources: GroupResources
    host: str
    node_id: str
    silent_s: float
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., resources: _Optional[_Union[GroupResources, _Mapping]] = ..., host: _Optional[str] = ..., node_id: _Optional[str] = ..., silent_s: _Optional[float] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("state", "uptime_seconds", "groups_ready", "groups_total", "in_flight", "root_cause", "groups", "pid", "warnings", "metrics_url", "missing_replicas", "workers_ready", "workers_total", "listen", "http_url")
    STATE_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_READY_FIELD_NUMBER: _ClassVar[int]
    GROUPS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ROOT_CAUSE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    MISSING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_READY_FIELD_NUMBER: _ClassVar[int]
    WORKERS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LISTEN_FIELD_NUMBER: _ClassVar[int]
    HTTP_URL_FIELD_NUMBER: _ClassVar[int]
    state: str
    uptime_seconds: float
    groups_ready: int
    groups_total: int
    in_flight: int
    root_cause: RootCause
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    pid: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    metrics_url: str
    missing_replicas: _containers.RepeatedScalarFieldContainer[str]
    workers_ready: int
    workers_total: int
    listen: str
    http_url: str
    def __init__(self, state: _Optional[str] = ..., uptime_seconds: _Optional[float] = ..., groups_ready: _Optional[int] = ..., groups_total: _Optional[int] = ..., in_flight: _Optional[int] = ..., root_cause: _Optional[_Union[RootCause, _Mapping]] = ..., groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ..., pid: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ..., metrics_url: _Optional[str] = ..., missing_replicas: _Optional[_Iterable[str]] = ..., workers_ready: _Optional[int] = ..., workers_total: _Optional[int] = ..., listen: _Optional[str] = ..., http_url: _Optional[str] = ...) -> None: ...

class RestartGroupRequest(_message.Message):
    __slots__ = ("name", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    force: bool
    def __init__(self, name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class RestartGroupResponse(_message.Message):
    __slots__ = ("name", "old_pid", "new_pid", "state")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OLD_PID_FIELD_NUMBER: _ClassVar[int]
    NEW_PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    old_pid: int
    new_pid: int
    state: str
    def __init__(self, name: _Optional[str] = ..., old_pid: _Optional[int] = ..., new_pid: _Optional[int] = ..., state: _Optional[str] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("grace_seconds",)
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    grace_seconds: float
    def __init__(self, grace_seconds: _Optional[float] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ("deadline_seconds",)
    DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    deadline_seconds: float
    def __init__(self, deadline_seconds: _Optional[float] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LifecycleEvent(_message.Message):
    __slots__ = ("group", "old_state", "new_state", "pid", "reason", "time", "kind")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OLD_STATE_FIELD_NUMBER: _ClassVar[int]
    NEW_STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    group: str
    old_state: str
    new_state: str
    pid: int
    reason: str
    time: float
    kind: str
    def __init__(self, group: _Optional[str] = ..., old_state: _Optional[str] = ..., new_state: _Optional[str] = ..., pid: _Optional[int] = ..., reason: _Optional[str] = ..., time: _Optional[float] = ..., kind: _Optional[str] = ...) -> None: ...

class GetMetricsSummaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("name", "state", "pid", "restarts", "resources", "in_flight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    pid: int
    restarts: int
    resources: GroupResources
    in_flight: int
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., pid: _Optional[int] = ..., restarts: _Optional[int] = ..., resources: _Optional[_Union[GroupResources, _Mapping]] = ..., in_flight: _Optional[int] = ...) -> None: ...

class StageSummary(_message.Message):
    __slots__ = ("name", "group", "in_flight", "count", "p50_seconds", "p99_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P50_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P99_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    in_flight: int
    count: int
    p50_seconds: float
    p99_seconds: float
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., in_flight: _Optional[int] = ..., count: _Optional[int] = ..., p50_seconds: _Optional[float] = ..., p99_seconds: _Optional[float] = ...) -> None: ...

class MetricsSummary(_message.Message):
    __slots__ = ("state", "window_seconds", "in_flight", "groups", "stages", "warnings")
    STATE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    state: str
    window_seconds: float
    in_flight: int
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    stages: _containers.RepeatedCompositeFieldContainer[StageSummary]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state: _Optional[str] = ..., window_seconds: _Optional[float] = ..., in_flight: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ..., stages: _Optional[_Iterable[_Union[StageSummary, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...
