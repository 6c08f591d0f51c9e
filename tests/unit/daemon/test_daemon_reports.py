"""What the daemon reports: its topology is the plan's JSON plus each worker's runtime fields, and its status agrees."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.daemon.core import Daemon, DaemonOptions
from stagevisor.supervisor.reports import StatusReport, TopologyReport
from tests.integration.daemon_helpers import RUNTIME_EDGE_FIELDS, higgs_isolated_audio_encoder, plan_part
from tests.unit.daemon.test_daemon_shutdown import BrokenStopGateway
from tests.unit.daemon.test_lifecycle_runner import FakeLauncher


class ReportingGateway(BrokenStopGateway):
    """A gateway that saw one request cross audio_encoder -> tts_engine over gRPC, and stops cleanly."""

    def edge_transports(self) -> dict[tuple[str, str], str]:
        return {("audio_encoder", "tts_engine"): "grpc"}

    def edge_requests(self) -> dict[tuple[str, str], dict[str, int]]:
        return {("audio_encoder", "tts_engine"): {"grpc": 1}}

    async def stop(self, grace: float) -> None:
        pass


def reports(tmp_path) -> tuple[TopologyReport, StatusReport, list[int]]:
    async def scenario():
        launcher = FakeLauncher([])
        daemon = Daemon(
            higgs_isolated_audio_encoder(),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=launcher.factory,
            gateway_factory=ReportingGateway,
        )
        await daemon.start()
        try:
            return daemon.topology(), daemon.status(), [w.pid for w in launcher.workers]
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    return asyncio.run(scenario())


def test_the_topology_is_the_plan_json_plus_each_worker_s_runtime_fields(tmp_path):
    topology, _, pids = reports(tmp_path)
    data = topology.to_json()
    assert plan_part(data) == higgs_isolated_audio_encoder().to_json()
    assert sorted(g["pid"] for g in data["groups"]) == sorted(pids)
    assert {g["state"] for g in data["groups"]} == {"READY"}
    edges = {(e["src"], e["dst"], e["kind"]): {k: e[k] for k in RUNTIME_EDGE_FIELDS} for e in data["edges"]}
    assert edges[("audio_encoder", "tts_engine", "next")] == {
        "transport": "grpc",
        "src_group": "audio_encoder",
        "dst_group": "pipeline",
        "requests": {"grpc": 1},
    }
    assert edges[("preprocessing", "audio_encoder", "next")]["transport"] == "grpc"  # planned, none crossed yet
    assert TopologyReport.from_proto(topology.to_proto()) == topology


def test_the_status_counts_the_ready_workers_and_has_no_root_cause(tmp_path):
    topology, status, _ = reports(tmp_path)
    assert (status.state, status.groups_ready, status.groups_total, status.root_cause) == ("SERVING", 4, 4, None)
    assert [(g.name, g.pid) for g in status.groups] == [(g.name, g.pid) for g in topology.groups]
    assert StatusReport.from_proto(status.to_proto()) == status
