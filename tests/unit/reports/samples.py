"""Sample reports, each kind filled and empty, for the round-trip tests and the HTTP API's schema tests: a GPU
group measured at 0 bytes, a replicated group, a TP stage, a degraded status with its root cause; a silent worker
in each (0.0 s silent is present, not absent)."""

from __future__ import annotations

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.plan import Autoscale
from stagevisor.supervisor.reports import (
    EdgeReport,
    GpuReport,
    GroupReport,
    GroupResources,
    GroupStatus,
    GroupSummary,
    ReplicaReport,
    RootCause,
    StageReport,
    StageSummary,
    StatusReport,
    SummaryReport,
    TopologyReport,
)

MEASURED = GroupResources(300 << 20, 2.5, 50.0, 9, 21, 0, 256 << 20, "rss", True)
"""GPU memory measured as 0 bytes: present, not None."""
UNMEASURED = GroupResources(0, 0.0, 0.0, 0, 0)
BOUNDS = Autoscale(1, 3, 0.5, None, 4.0, 0.5, 5.0, 30.0, 10.0)

SINGLE = GroupReport("pipeline", ("preprocessing", "tts_engine"), None, None, None, pid=0, state="STOPPED", restarts=0)
"""A CPU group whose worker is not running: every optional field absent."""
ON_GPU = GroupReport(
    "engine_tp1",
    ("tts_engine",),
    1,
    0.85,
    1,
    pid=41,
    state="READY",
    restarts=2,
    started_at=1700000000.25,
    fraction_enforced=True,
    physical_gpu="GPU-3",
    device="cuda:0 (NVIDIA H200, GPU-3)",
    resources=MEASURED,
    host="vm",
    node_id="ab" * 28,
    node="tts-a",
    autoscale=BOUNDS,
    silent_s=4.5,
)
REPLICATED = GroupReport(
    "vocoder",
    ("vocoder",),
    None,
    None,
    None,
    pid=None,
    state="READY",
    restarts=1,
    fraction_enforced=True,
    node="tts-b",
    replicas=2,
    replica_gpus=(None, None),
    workers=(
        ReplicaReport(
            "vocoder/0", 0, None, 200, "READY", 0, 1.5, None, "", UNMEASURED, "vm", "1" * 56, "tts-b", silent_s=0.0
        ),
        ReplicaReport("vocoder/1", 1, None, 0, "BACKOFF", 1),
    ),
)
TOPOLOGY = TopologyReport(
    model="higgs-tts",
    model_path="bosonai/higgs-tts-3-4b",
    changed=True,
    groups=(SINGLE, ON_GPU, REPLICATED),
    stages=(
        StageReport("preprocessing", "pipeline", None, 1, None, None),
        StageReport("tts_engine", "engine", (0, 1), 2, 0.85, "declared", stand_in=True),
        StageReport("vocoder", "vocoder", 0, 1, 0.1, "recommended"),
    ),
    edges=(
        EdgeReport("preprocessing", "tts_engine", "next", True, True, "grpc", "pipeline", "engine_tp0", {"grpc": 3}),
        EdgeReport("tts_engine", "vocoder", "stream_to", False, True),
    ),
    gpus=(GpuReport(0, 0.95, 1.0, ("engine_tp0", "vocoder"), 80 << 30, 0, True), GpuReport(1, 0.85, 1.0, ())),
    warnings=("vocoder: explicit 0.05 below the recommended 0.10",),
)
EMPTY_TOPOLOGY = TopologyReport(None, None, False, (), (), (), ())
STATUS = StatusReport(
    state="DEGRADED",
    pid=7,
    uptime_seconds=12.5,
    groups_ready=1,
    groups_total=2,
    in_flight=3,
    root_cause=RootCause("b", "vocoder", "boom", "Traceback", 5.0),
    groups=(
        GroupStatus("a", "READY", 9, 0, MEASURED, "vm", "ab" * 28, silent_s=3.25),
        GroupStatus("b", "BACKOFF", 0, 2),
    ),
    workers_ready=1,
    workers_total=2,
    warnings=("group 'a' uses 300.0 MiB",),
    metrics_url="http://127.0.0.1:9464/metrics",
    listen="127.0.0.1:43211",
    http_url="http://127.0.0.1:8000",
    missing_replicas=("vocoder/1",),
)
EMPTY_STATUS = StatusReport("STARTING", 1, 0.0, 0, 0, 0, None, (), 0, 0)
SUMMARY = SummaryReport(
    "SERVING",
    60.0,
    1,
    (GroupSummary("g1", "READY", 10, 0, 1, MEASURED), GroupSummary("g2", "BACKOFF", 0, 1, 0)),
    (StageSummary("a", "g1", 1, 7, 0.002, 0.01), StageSummary("b", "g2", 0, 0)),
    ("group 'g1' is over",),
)
EMPTY_SUMMARY = SummaryReport("STOPPED", 60.0, 0, (), ())

REPORTS = [TOPOLOGY, EMPTY_TOPOLOGY, STATUS, EMPTY_STATUS, SUMMARY, EMPTY_SUMMARY]
MESSAGES = {TopologyReport: admin_pb2.Topology, StatusReport: admin_pb2.Status, SummaryReport: admin_pb2.MetricsSummary}
