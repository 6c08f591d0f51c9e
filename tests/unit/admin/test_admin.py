"""The admin servicer against a fake daemon, and the CLI's tables of the reports it serves."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.addresses import is_loopback
from stagevisor.supervisor.admin.servicer import AdminServicer
from stagevisor.supervisor.commands.report_text import format_status, format_topology
from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent
from stagevisor.supervisor.errors import ConfigError, DaemonError, ErrorCode, PlacementError, WorkerStartError
from stagevisor.supervisor.plan import Edge, GpuBudget, Plan, PlannedStage, ProcessGroup
from stagevisor.supervisor.reports import StatusReport, TopologyReport
from tests.fakes import Aborted, FakeServicerContext

PLAN = Plan(
    model="higgs-tts",
    model_path="bosonai/higgs-tts-3-4b",
    changed=True,
    stages=(
        PlannedStage("preprocessing", "tts_frontend", None, 1, None, None, "m:f"),
        PlannedStage("tts_engine", "pipeline", (0, 1), 2, 0.85, "declared", "m:f"),
        PlannedStage("vocoder", "vocoder", 0, 1, 0.10, "recommended", "m:f"),
    ),
    groups=(
        ProcessGroup("tts_frontend", ("preprocessing",), None, None),
        ProcessGroup("pipeline_tp0", ("tts_engine",), 0, 0.85, tp_rank=0, tp_size=2),
        ProcessGroup("pipeline_tp1", ("tts_engine",), 1, 0.85, tp_rank=1, tp_size=2),
        ProcessGroup("vocoder", ("vocoder",), 0, 0.10, node="tts-b"),
    ),
    edges=(
        Edge("preprocessing", "tts_engine", "next", True, True),
        Edge("tts_engine", "vocoder", "stream_to", True, True),
    ),
    gpus=(GpuBudget(0, 0.95, 1.0, ("pipeline_tp0", "vocoder")),),
    warnings=("vocoder: explicit 0.05 below the recommended 0.10",),
)


def runtime_topology() -> dict:
    data = PLAN.to_json()
    for i, group in enumerate(data["groups"]):
        group.update(
            pid=100 + i,
            state="READY",
            restarts=i,
            started_at=1700000000.5 if i else None,
            fraction_enforced=group["gpu"] is not None,
            physical_gpu=None if group["gpu"] is None else f"GPU-{i}",
            device="" if group["gpu"] is None else "cuda:0 (NVIDIA H200, GPU-x)",
            resources=RESOURCES if i else None,
            host="vm" if i else "",
            node_id=f"{i:056x}" if i else "",
            silent_s=4.5 if i == 1 else None,
        )
    for edge in data["edges"]:
        edge.update(transport="grpc", src_group="x", dst_group="y", requests={"grpc": 3})
    for gpu in data["gpus"]:
        gpu.update(total_bytes=80 << 30, measured_bytes=None, over_limit=False)
    return data


RESOURCES = {
    "rss_bytes": 300 << 20,
    "cpu_seconds": 2.5,
    "cpu_percent": 50.0,
    "threads": 9,
    "open_fds": 21,
    "gpu_memory_bytes": None,
    "memory_budget_bytes": 256 << 20,
    "budget_kind": "rss",
    "over_budget": True,
}


STATUS = {
    "state": "DEGRADED",
    "pid": 7,
    "uptime_seconds": 12.5,
    "groups_ready": 1,
    "groups_total": 2,
    "workers_ready": 1,
    "workers_total": 2,
    "in_flight": 3,
    "groups": [
        {
            "name": "a",
            "state": "READY",
            "pid": 9,
            "restarts": 0,
            "resources": RESOURCES,
            "host": "vm",
            "node_id": "ab" * 28,
            "silent_s": 3.25,
        },
        {
            "name": "b",
            "state": "BACKOFF",
            "pid": 0,
            "restarts": 2,
            "resources": None,
            "host": "",
            "node_id": "",
            "silent_s": None,
        },
    ],
    "warnings": ["group 'a' uses 300.0 MiB resident memory, over its --rss-budget 256.0 MiB"],
    "metrics_url": "http://127.0.0.1:9464/metrics",
    "listen": "127.0.0.1:50551",
    "http_url": "http://127.0.0.1:8000",
    "root_cause": {
        "group": "b",
        "stage": "vocoder",
        "message": "boom",
        "traceback": "Traceback",
        "time": 5.0,
        "recovered_at": None,
    },
}


class FakeDaemon:
    """An AdminDaemon with two READY groups."""

    def __init__(self, restart_error=None):
        self.states = {"tts_frontend": GroupState.READY, "vocoder": GroupState.READY}
        self.restart_error = restart_error
        self.shutdowns = []
        self.restarts: list[tuple[str, bool]] = []
        self.queue: asyncio.Queue | None = None
        self.unsubscribed = False

    def topology(self):
        return TopologyReport.from_json(runtime_topology())

    def group_names(self):
        return list(self.states)

    def group_state(self, name):
        return self.states[name]

    def status(self):
        return StatusReport.from_json(STATUS)

    def restarted_state(self, name, pid):
        return self.states[name]

    async def restart_group(self, name, *, force=False):
        self.restarts.append((name, force))
        if name not in self.group_names():  # as the daemon's Restarts.restart, once no live change runs
            raise KeyError(name)
        if self.restart_error:
            raise self.restart_error
        return 10, 11

    def request_shutdown(self, grace):
        self.shutdowns.append(grace)
        return 42.0

    def subscribe(self, history=False):
        self.queue = asyncio.Queue()
        return self.queue

    def unsubscribe(self, queue):
        self.unsubscribed = queue is self.queue


def call(coro):
    return asyncio.run(coro)


def test_get_topology_and_get_status_answer_what_the_cli_reads_back_unchanged():
    servicer = AdminServicer(FakeDaemon())
    topology = call(servicer.GetTopology(admin_pb2.GetTopologyRequest(), FakeServicerContext()))
    status = call(servicer.GetStatus(admin_pb2.GetStatusRequest(), FakeServicerContext()))
    assert TopologyReport.from_proto(topology).to_json() == runtime_topology()
    assert StatusReport.from_proto(status).to_json() == STATUS


def replicated_topology() -> dict:
    """A group of two replicas pinned to node `tts-b`, each on its own Ray node (as under --launcher ray)."""
    plan = Plan(
        model="demo",
        model_path="demo",
        changed=True,
        stages=(PlannedStage("vocoder", "vocoder", None, 1, None, None, "m:f"),),
        groups=(
            ProcessGroup("vocoder", ("vocoder",), None, None, replicas=2, replica_gpus=(None, None), node="tts-b"),
        ),
        edges=(),
        gpus=(),
        warnings=(),
    )
    data = plan.to_json()
    runtime = dict(
        state="READY", restarts=0, started_at=None, fraction_enforced=True, physical_gpu=None, device="", resources=None
    )
    workers = [
        {
            "name": f"vocoder/{i}",
            "replica": i,
            "gpu": None,
            **{k: v for k, v in runtime.items() if k != "fraction_enforced"},
            "pid": 200 + i,
            "host": "vm",
            "node_id": f"{i + 1:x}" * 56,
            "silent_s": 2.0 if i else None,
            "node": "tts-b",
        }
        for i in range(2)
    ]
    data["groups"][0].update(**runtime, pid=None, host="", node_id="", silent_s=None, workers=workers)
    return data


def test_replica_entries_keep_their_host_and_node_through_proto_and_show_them():
    data = replicated_topology()
    back = TopologyReport.from_proto(TopologyReport.from_json(data).to_proto())
    assert back.to_json() == data
    lines = format_topology(back).splitlines()
    assert lines[2].lstrip().startswith("vocoder/0") and "on host vm, node 111111111111 (pinned: tts-b)" in lines[2]
    assert lines[3].lstrip().startswith("vocoder/1") and "node 222222222222 (pinned: tts-b)" in lines[3]


def test_the_topology_table_names_the_model_and_the_path_it_was_asked_by_only_where_one_differs():
    """Before: the default voice, asked by no --model-path, read `model: demo (-)`."""
    data = runtime_topology()
    heads = []
    for model, path in (("demo", None), ("higgs-tts", "bosonai/higgs-tts-3-4b"), ("demo", "demo")):
        data.update(model=model, model_path=path)
        heads.append(format_topology(TopologyReport.from_json(data)).splitlines()[0])
    assert heads == ["model: demo", "model: higgs-tts (bosonai/higgs-tts-3-4b)", "model: demo"]


def test_status_shows_each_worker_s_host_and_node_on_a_cluster():
    lines = format_status(StatusReport.from_json(STATUS)).splitlines()
    assert "on host vm, node abababababab" in lines[2] and "on host -, node -" in lines[3]
    local = {**STATUS, "groups": [{**g, "host": "", "node_id": ""} for g in STATUS["groups"]]}
    assert "node" not in format_status(StatusReport.from_json(local))


def test_status_and_topology_say_how_long_a_silent_worker_has_been_silent_and_nothing_of_one_that_beats():
    status = format_status(StatusReport.from_json(STATUS)).splitlines()
    assert status[2].lstrip().startswith("a ") and status[2].endswith("  silent 3.2s")  # 3.25 s
    assert status[3].lstrip().startswith("b ") and "silent" not in status[3]
    topology = format_topology(TopologyReport.from_json(runtime_topology())).splitlines()
    assert [line.endswith("  silent 4.5s") for line in topology[1:5]] == [False, True, False, False]
    replicas = format_topology(TopologyReport.from_json(replicated_topology())).splitlines()
    assert ["silent" in line for line in replicas[1:4]] == [False, False, True]
    assert replicas[3].endswith("  silent 2.0s")


def test_status_counts_a_silent_ready_worker_beside_the_ready_groups_and_its_json_keeps_the_counts():
    ready_b = {**STATUS["groups"][1], "state": "READY", "pid": 10}
    silent = StatusReport.from_json(
        {**STATUS, "groups_ready": 2, "workers_ready": 2, "groups": [STATUS["groups"][0], ready_b]}
    )
    assert format_status(silent).splitlines()[1] == "groups: 2/2 READY, 1 worker silent (a), 3 requests in flight"
    assert silent.to_json()["groups_ready"] == 2 and silent.to_json()["workers_ready"] == 2
    beating = StatusReport.from_json({**STATUS, "groups": [{**STATUS["groups"][0], "silent_s": None}, ready_b]})
    assert "silent" not in format_status(beating).splitlines()[1]
    replicas = [{**ready_b, "name": f"b/{i}", "silent_s": 1.0} for i in range(2)]
    both = StatusReport.from_json({**silent.to_json(), "groups": [STATUS["groups"][0], *replicas], "workers_total": 3})
    assert "READY (2/3 workers), 3 workers silent (a, b/0, b/1), 3 requests" in format_status(both)


def test_status_without_failure_has_a_null_root_cause():
    healthy = StatusReport.from_json({**STATUS, "root_cause": None})
    assert StatusReport.from_proto(healthy.to_proto()).to_json()["root_cause"] is None


def test_get_topology_serves_the_daemon_topology():
    reply = call(AdminServicer(FakeDaemon()).GetTopology(admin_pb2.GetTopologyRequest(), FakeServicerContext()))
    assert [(g.name, g.pid) for g in reply.groups] == [
        ("tts_frontend", 100),
        ("pipeline_tp0", 101),
        ("pipeline_tp1", 102),
        ("vocoder", 103),
    ]


def test_restart_of_an_unknown_group_is_not_found_naming_the_known_groups():
    with pytest.raises(Aborted) as caught:
        call(
            AdminServicer(FakeDaemon()).RestartGroup(admin_pb2.RestartGroupRequest(name="nope"), FakeServicerContext())
        )
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert caught.value.details == "no process group 'nope'; known groups: tts_frontend, vocoder"


def test_a_huge_unknown_group_name_is_echoed_cut():
    with pytest.raises(Aborted) as caught:
        call(
            AdminServicer(FakeDaemon()).RestartGroup(
                admin_pb2.RestartGroupRequest(name="x" * 1_000_000), FakeServicerContext()
            )
        )
    assert caught.value.code == grpc.StatusCode.NOT_FOUND and len(caught.value.details) < 300


def test_restart_reports_old_and_new_pid():
    reply = call(
        AdminServicer(FakeDaemon()).RestartGroup(admin_pb2.RestartGroupRequest(name="vocoder"), FakeServicerContext())
    )
    assert (reply.old_pid, reply.new_pid, reply.state) == (10, 11, "READY")


def test_restart_of_a_replica_a_scale_removed_while_it_waited_is_not_found():
    daemon = FakeDaemon(restart_error=KeyError("vocoder/2"))
    with pytest.raises(Aborted) as caught:
        call(AdminServicer(daemon).RestartGroup(admin_pb2.RestartGroupRequest(name="vocoder"), FakeServicerContext()))
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert "removed by a scale" in caught.value.details
    assert caught.value.details.endswith("known groups: tts_frontend, vocoder")


def test_a_restart_that_an_apply_overtook_reports_the_restarted_worker_stopped_not_an_unexpected_error():
    daemon = FakeDaemon()

    async def replaced(name, *, force=False):  # the apply that ran during the restart merged the group into another
        del daemon.states[name]
        return 10, 11

    daemon.restart_group = replaced
    reply = call(
        AdminServicer(daemon).RestartGroup(admin_pb2.RestartGroupRequest(name="vocoder"), FakeServicerContext())
    )
    assert (reply.old_pid, reply.new_pid, reply.state) == (10, 11, "STOPPED")


def test_restart_whose_worker_fails_to_start_is_internal_naming_the_stage():
    daemon = FakeDaemon(restart_error=WorkerStartError("vocoder", "stage 'vocoder' failed", stage="vocoder"))
    with pytest.raises(Aborted) as caught:
        call(AdminServicer(daemon).RestartGroup(admin_pb2.RestartGroupRequest(name="vocoder"), FakeServicerContext()))
    assert caught.value.code == grpc.StatusCode.INTERNAL
    assert "(stage 'vocoder')" in caught.value.details


class ScalingDaemon(FakeDaemon):
    """A FakeDaemon whose scale_group raises `refusal`."""

    def __init__(self, refusal: Exception) -> None:
        super().__init__()
        self.refusal = refusal

    async def scale_group(self, name, replicas):
        raise self.refusal


def test_a_scale_answers_each_worker_s_pid_as_the_topology_shows_it():
    """The reply named the group's workers without their pids, which `status` shows: an operator scaling had to
    look them up to know which process was which."""

    class ScaledDaemon(FakeDaemon):
        async def scale_group(self, name, replicas):
            return 2, 1, ["vocoder"]

    request = admin_pb2.ScaleGroupRequest(name="vocoder", replicas=1)
    reply = call(AdminServicer(ScaledDaemon()).ScaleGroup(request, FakeServicerContext()))
    assert list(reply.workers) == ["vocoder"] and list(reply.pids) == [103]


def test_a_watcher_that_went_away_mid_write_is_unsubscribed_when_its_call_ends():
    # Its generator stays suspended at the write gRPC cancelled: its `finally` waits for the garbage collector.
    async def scenario():
        daemon, context = FakeDaemon(), FakeServicerContext()
        stream = AdminServicer(daemon).WatchEvents(admin_pb2.WatchEventsRequest(), context)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        daemon.queue.put_nowait(LifecycleEvent("vocoder", GroupState.READY, GroupState.BACKOFF, 5, "died", 1.0))
        await first  # suspended at its yield, as during a write
        context.end()
        unsubscribed = daemon.unsubscribed
        await stream.aclose()
        return unsubscribed

    assert asyncio.run(scenario())


@pytest.mark.parametrize(
    "refusal, message",
    [
        (PlacementError(ErrorCode.OVER_LIMIT, "GPU 0 would carry 1.9"), "OVER_LIMIT: GPU 0 would carry 1.9"),
        (ConfigError(ErrorCode.INVALID_CONFIG, "no such stage"), "INVALID_CONFIG: no such stage"),
        (DaemonError("cannot scale group 'vocoder' while draining"), "cannot scale group 'vocoder' while draining"),
    ],
    ids=["placement", "config", "daemon"],
)
def test_a_refused_scale_is_a_failed_precondition_with_its_code_as_an_apply_s_is(refusal, message):
    request = admin_pb2.ScaleGroupRequest(name="vocoder", replicas=2)
    with pytest.raises(Aborted) as caught:
        call(AdminServicer(ScalingDaemon(refusal)).ScaleGroup(request, FakeServicerContext()))
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION and caught.value.details == message


def test_a_scale_whose_group_an_apply_removed_while_it_waited_says_so():
    """Before: "MISSING_PROCESS: there is no process group named 'vocoder'", as if the operator had mistyped it."""
    daemon = ScalingDaemon(PlacementError(ErrorCode.MISSING_PROCESS, "there is no process group named 'vocoder'"))

    async def merged(name, replicas):  # the apply that ran first merged the vocoder into tts_frontend
        del daemon.states[name]
        raise daemon.refusal

    daemon.scale_group = merged
    request = admin_pb2.ScaleGroupRequest(name="vocoder", replicas=2)
    with pytest.raises(Aborted) as caught:
        call(AdminServicer(daemon).ScaleGroup(request, FakeServicerContext()))
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details == (
        "MISSING_PROCESS: process group 'vocoder' was removed by an apply while the scale waited for it; "
        "known groups: tts_frontend"
    )


def test_shutdown_passes_the_grace_and_returns_the_deadline():
    daemon = FakeDaemon()
    servicer = AdminServicer(daemon)
    reply = call(servicer.Shutdown(admin_pb2.ShutdownRequest(grace_seconds=2.5), FakeServicerContext()))
    call(servicer.Shutdown(admin_pb2.ShutdownRequest(), FakeServicerContext()))
    assert daemon.shutdowns == [2.5, None] and reply.deadline_seconds == 42.0


def test_shutdown_with_negative_grace_is_invalid_argument():
    with pytest.raises(Aborted) as caught:
        call(AdminServicer(FakeDaemon()).Shutdown(admin_pb2.ShutdownRequest(grace_seconds=-1), FakeServicerContext()))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_events_streams_until_the_daemon_stops():
    async def scenario():
        daemon = FakeDaemon()
        stream = AdminServicer(daemon).WatchEvents(admin_pb2.WatchEventsRequest(), FakeServicerContext())
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        daemon.queue.put_nowait(LifecycleEvent("vocoder", GroupState.READY, GroupState.BACKOFF, 5, "died", 1.0))
        daemon.queue.put_nowait(None)
        event = await first
        rest = [e async for e in stream]
        return daemon, event, rest

    daemon, event, rest = asyncio.run(scenario())
    assert (event.group, event.old_state, event.new_state, event.reason) == ("vocoder", "READY", "BACKOFF", "died")
    assert rest == [] and daemon.unsubscribed


@pytest.mark.parametrize(
    "address,expected",
    [
        ("unix:/run/x.sock", True),
        ("127.0.0.1:50999", True),
        ("[::1]:1", True),
        ("localhost:5", True),
        ("0.0.0.0:50999", False),
        ("10.1.2.3:9", False),
        ("example.com:80", False),
    ],
)
def test_loopback_detection(address, expected):
    assert is_loopback(address) is expected


def test_topology_table_pads_group_names_and_marks_unenforced_fractions():
    table = format_topology(TopologyReport.from_json(runtime_topology()))
    lines = table.splitlines()
    assert lines[1].startswith("tts_frontend : preprocessing")
    assert lines[4].startswith("vocoder      : vocoder")
    assert "fraction 0.1 enforced" in lines[4]
    assert "gpu 0 (physical GPU-3, on cuda:0 (NVIDIA H200, GPU-x))" in lines[4]
    assert "preprocessing -> tts_engine [next] grpc (x -> y)" in table


def test_status_table_shows_the_root_cause():
    assert "root cause: group 'b', stage 'vocoder': boom" in format_status(StatusReport.from_json(STATUS))


def test_status_shows_an_incident_every_worker_recovered_from_as_past_with_its_times():
    """Every group READY again: the crash is the last incident, with when it happened and when it ended, not a
    `root cause` of a daemon that has nothing wrong."""
    import time

    happened, recovered = 1_800_000_000.0, 1_800_000_042.0
    root = {**STATUS["root_cause"], "time": happened, "recovered_at": recovered}
    report = StatusReport.from_json({**STATUS, "state": "SERVING", "root_cause": root})
    assert StatusReport.from_proto(report.to_proto()) == report
    text = format_status(report)
    assert "root cause" not in text
    stamp = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))  # noqa: E731
    assert (
        f"last incident (over: every worker READY since {stamp(recovered)}): group 'b', stage 'vocoder' at "
        f"{stamp(happened)}: boom"
    ) in text.splitlines()


def test_status_says_a_worker_with_no_process_has_none_instead_of_using_0_bytes():
    sampled = {**STATUS["groups"][1], "resources": {**RESOURCES, "rss_bytes": 0}}
    text = format_status(StatusReport.from_json({**STATUS, "groups": [STATUS["groups"][0], sampled]}))
    [line] = [line for line in text.splitlines() if line.lstrip().startswith("b ")]
    assert "memory: no process" in line and "rss" not in line


def test_a_replicated_group_line_sends_the_reader_to_its_replicas_memory_instead_of_a_sample_that_never_comes():
    data = replicated_topology()
    for worker in data["groups"][0]["workers"]:
        worker["resources"] = {**RESOURCES, "rss_bytes": 100 * 1024**2}
    lines = format_topology(TopologyReport.from_json(data)).splitlines()
    assert lines[1].startswith("vocoder") and "memory: per replica" in lines[1] and "not sampled" not in lines[1]
    assert "rss 100.0 MiB" in lines[2] and "rss 100.0 MiB" in lines[3]


def test_restart_passes_force_on_and_a_gpu_without_room_is_a_coded_failed_precondition():
    from stagevisor.supervisor.errors import ErrorCode, PlacementError

    daemon = FakeDaemon(restart_error=PlacementError(ErrorCode.OVER_LIMIT, "GPU 0 would carry 1.7"))
    request = admin_pb2.RestartGroupRequest(name="vocoder", force=True)
    with pytest.raises(Aborted) as caught:
        call(AdminServicer(daemon).RestartGroup(request, FakeServicerContext()))
    assert daemon.restarts == [("vocoder", True)]
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details == "OVER_LIMIT: GPU 0 would carry 1.7"


def test_the_topology_table_says_its_per_edge_requests_are_the_completed_ones():
    """It read `requests: 3 via grpc` beside stagevisor_edge_handoffs_total, which also counts the handoffs of
    requests that failed or were cancelled: two figures for "requests over an edge" that did not agree."""
    table = format_topology(TopologyReport.from_json(runtime_topology()))
    assert "preprocessing -> tts_engine [next] grpc (x -> y)  completed requests: 3 via grpc" in table
