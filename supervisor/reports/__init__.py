"""The daemon's reports (topology, status, metrics summary): one typed form, with its protobuf message and its JSON.

The daemon builds these; the admin servicer sends them with `to_proto`; the
CLI reads them back with `from_proto` and prints `to_json` (`--format json`)
or its text; the HTTP API serves `to_json`. Each class has exactly one
conversion each way: `to_proto`/`from_proto` (stagevisor.v1 admin messages)
and `to_json`/`from_json` (the JSON the CLI prints, which is
`stagevisor plan --format json` plus runtime fields for the topology).
Optional proto fields are None here and null in JSON; keys that JSON shows
only sometimes (`replicas`, `node`, `workers`, `missing_replicas`, ...) are
shown exactly when the proto side would carry them.

One module per report: `topology.py` (TopologyReport and its groups, replicas,
stages, edges and GPUs), `status.py` (StatusReport, GroupStatus, RootCause),
`summary.py` (SummaryReport, GroupSummary, StageSummary); `resources.py` holds
what they share (GroupResources, JsonObject). Import them from here.
"""

from stagevisor.supervisor.reports.resources import GroupResources, JsonObject
from stagevisor.supervisor.reports.status import GroupStatus, RootCause, StatusReport
from stagevisor.supervisor.reports.summary import GroupSummary, StageSummary, SummaryReport
from stagevisor.supervisor.reports.topology import (
    EdgeReport,
    GpuReport,
    GroupReport,
    ReplicaReport,
    StageReport,
    TopologyReport,
)

__all__ = [
    "EdgeReport",
    "GpuReport",
    "GroupReport",
    "GroupResources",
    "GroupStatus",
    "GroupSummary",
    "JsonObject",
    "ReplicaReport",
    "RootCause",
    "StageReport",
    "StageSummary",
    "StatusReport",
    "SummaryReport",
    "TopologyReport",
]
