"""What the daemon reports: its topology is the plan's JSON plus each worker's runtime fields, and its status agrees."""

from __future__ import annotations

import asyncio
import functools

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.reports import StatusReport, TopologyReport
from tests.integration.daemon_helpers import RUNTIME_EDGE_FIELDS, higgs_isolated_audio_encoder, plan_part
from tests.unit.daemon.daemon_driver import BrokenStopGateway
from tests.fakes import FakeLauncher


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


class WatchedGateway(ReportingGateway):
    def declare_text_limit(self, group: str, limit: int | None) -> None:
        pass  # on every READY: without it the READY hook raises and no worker is watched


def with_daemon(tmp_path, body) -> None:
    """Run `await body(daemon, until, worker_of, launcher)` on a started daemon whose fake workers restart at once."""

    async def scenario():
        launcher = FakeLauncher([])
        daemon = Daemon(
            higgs_isolated_audio_encoder(),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0, backoff_initial=0.01),
            launcher=launcher.factory,
            gateway_factory=WatchedGateway,
        )
        await daemon.start()
        try:
            loop = asyncio.get_running_loop()

            async def until(predicate) -> None:
                deadline = loop.time() + 10.0
                while not predicate() and loop.time() < deadline:
                    await asyncio.sleep(0.01)
                assert predicate(), daemon.status().root_cause

            def worker_of(group: str):
                pid = next(g.pid for g in daemon.status().groups if g.name == group)
                return next(w for w in launcher.workers if w.pid == pid)

            await body(daemon, until, worker_of, launcher)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())


def test_the_root_cause_is_the_first_failure_of_the_current_incident_not_of_one_recovered_from(tmp_path):
    """One group's worker dies and its group is READY again; later another group's worker dies. While that group
    restarts, status names its failure as the root cause, not the first group's, which every group recovered from
    (that crash stays the latest incident's cause once every group is READY again)."""

    async def body(daemon, until, worker_of, launcher):
        def root_group() -> str | None:
            root = daemon.status().root_cause
            return root.group if root is not None else None

        worker_of("vocoder").exit(-9)
        await until(lambda: daemon.status().groups_ready == 4 and root_group() == "vocoder")
        worker_of("pipeline").exit(-9)
        await until(lambda: daemon.status().groups_ready < 4 or root_group() == "pipeline")
        assert root_group() == "pipeline"
        await until(lambda: daemon.status().groups_ready == 4)
        assert root_group() == "pipeline"

    with_daemon(tmp_path, body)


def test_an_incident_is_over_once_every_worker_is_ready_again_and_its_cause_says_when(tmp_path):
    """A worker dies: while its group is down the root cause has no recovery time; once every worker is READY
    again it carries the time the incident ended, so status shows it as past instead of as a current failure."""

    async def body(daemon, until, worker_of, launcher):
        launcher.outcomes.append("hang")  # the restarted worker stays STARTING until the test ends it
        worker_of("vocoder").exit(-9)
        await until(lambda: len(launcher.workers) == 5)
        down = daemon.status()
        assert down.groups_ready == 3 and down.root_cause is not None and down.root_cause.recovered_at is None
        launcher.workers[-1].exit(1)  # fails to start; the next one is READY
        await until(lambda: daemon.status().groups_ready == 4)
        root = daemon.status().root_cause
        assert root.group == "vocoder" and root.recovered_at is not None and root.recovered_at >= root.time
        assert StatusReport.from_proto(daemon.status().to_proto()).root_cause == root

    with_daemon(tmp_path, body)


def test_a_daemon_whose_workers_crash_again_and_again_keeps_the_failures_of_one_incident(tmp_path):
    """A worker crashes and comes back, again and again (a stage that kills its worker on some input, for weeks):
    each crash is an incident of its own, and the daemon keeps the failures that can still be the root cause,
    not one more for every crash it ever had."""

    async def body(daemon, until, worker_of, launcher):
        def back_from(crashed) -> bool:
            return daemon.status().groups_ready == 4 and worker_of("vocoder") is not crashed

        for _ in range(6):
            crashed = worker_of("vocoder")
            crashed.exit(-9)
            await until(functools.partial(back_from, crashed))
        root = daemon.status().root_cause
        assert root.group == "vocoder" and root.recovered_at is not None
        assert [f.group for f in daemon.failures] == ["vocoder"]

    with_daemon(tmp_path, body)


def test_status_and_the_ready_line_count_process_groups_and_their_workers_apart(tmp_path, caplog):
    """`front` and `pipeline` with two replicas: two process groups, three workers. The READY line and status
    say both; with one replica down (restarting) both groups still serve, and one worker of three is not READY."""
    from stagevisor.supervisor.commands.report_text import format_status
    from stagevisor.supervisor.placement.planner import rescale
    from tests.fakes import poll_until
    from tests.unit.daemon.daemon_driver import cpu_plan, started_daemon
    from tests.unit.daemon.daemon_driver import AnnouncingGateway

    async def scenario() -> tuple[StatusReport, StatusReport]:
        launcher = FakeLauncher([])
        plan = rescale(cpu_plan("front", "front", "pipeline", "pipeline"), "pipeline", 2)
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway)
        try:
            serving = daemon.status()
            launcher.outcomes.append("hang")  # the replica's restart stays STARTING
            launcher.workers[2].exit(-9)  # pipeline/1 (pids in start order: front, pipeline/0, pipeline/1)
            await poll_until(lambda: daemon.status().workers_ready == 2)
            return serving, daemon.status()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    with caplog.at_level("INFO", logger="stagevisor.daemon"):
        serving, degraded = asyncio.run(scenario())
    assert "READY: 2 process groups (3 workers)" in caplog.text
    assert (serving.groups_ready, serving.groups_total, serving.workers_ready, serving.workers_total) == (2, 2, 3, 3)
    assert (degraded.groups_ready, degraded.groups_total, degraded.workers_ready, degraded.workers_total) == (
        2,
        2,
        2,
        3,
    )
    assert "groups: 2/2 READY (2/3 workers), 0 requests in flight" in format_status(degraded)
    assert StatusReport.from_proto(degraded.to_proto()) == degraded
    assert StatusReport.from_json(degraded.to_json()) == degraded
