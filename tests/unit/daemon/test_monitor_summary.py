"""What `stagevisor top` shows per worker (Monitor.summary): the stage calls running in each one."""

from __future__ import annotations

from types import SimpleNamespace

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.daemon.lifecycle import GroupState
from stagevisor.supervisor.daemon.monitor import Monitor
from stagevisor.supervisor.plan import Plan, PlannedStage, ProcessGroup


def replicated_plan() -> Plan:
    """`pipeline` (tts_engine) and `vocoder` in two replicas."""
    return Plan(
        model="demo",
        model_path="demo",
        changed=True,
        stages=(
            PlannedStage("tts_engine", "pipeline", None, 1, None, None, "m:f"),
            PlannedStage("vocoder", "vocoder", None, 1, None, None, "m:f"),
        ),
        groups=(
            ProcessGroup("pipeline", ("tts_engine",), None, None),
            ProcessGroup("vocoder", ("vocoder",), None, None, replicas=2, replica_gpus=(None, None)),
        ),
        edges=(),
        gpus=(),
        warnings=(),
    )


def runner(pid: int) -> SimpleNamespace:
    return SimpleNamespace(state=GroupState.READY, pid=pid, restarts=0)


def running(worker: str, pid: int, stage: str, calls: int) -> pb.MetricsReport:
    report = pb.MetricsReport(group=worker, pid=pid)
    report.stages.add(stage=stage, in_flight=calls)
    return report


def test_each_replica_shows_the_calls_running_in_it_not_zero():
    """Four requests in flight, three on replica 0 and one on replica 1: `top` showed 0 on both replicas (it
    looked the calls up under the group's name) while the stage line said 4."""
    runners = {"pipeline": runner(10), "vocoder/0": runner(20), "vocoder/1": runner(21)}
    monitor = Monitor(replicated_plan(), runners, lambda event: None)
    assert monitor.metrics is not None
    monitor.metrics.apply_report(running("pipeline", 10, "tts_engine", 4))
    monitor.metrics.apply_report(running("vocoder/0", 20, "vocoder", 3))
    monitor.metrics.apply_report(running("vocoder/1", 21, "vocoder", 1))
    summary = monitor.summary("SERVING", 4)
    assert {g.name: g.in_flight for g in summary.groups} == {"pipeline": 4, "vocoder/0": 3, "vocoder/1": 1}
    assert {s.name: s.in_flight for s in summary.stages} == {"tts_engine": 4, "vocoder": 4}


def test_a_replaced_replica_s_last_report_does_not_count_in_its_successor():
    runners = {"pipeline": runner(10), "vocoder/0": runner(30), "vocoder/1": runner(21)}  # vocoder/0 was pid 20
    monitor = Monitor(replicated_plan(), runners, lambda event: None)
    assert monitor.metrics is not None
    monitor.metrics.apply_report(running("vocoder/0", 20, "vocoder", 3))
    summary = monitor.summary("SERVING", 0)
    assert {g.name: g.in_flight for g in summary.groups}["vocoder/0"] == 0


def test_a_worker_that_replaced_a_dead_one_shows_no_figures_until_it_is_sampled():
    """A worker killed, its replacement STARTING with a pid: until the next sample (up to a second) `status` said
    `pid 4885 ... rss 0.0 MiB` and `top` 0 bytes, the dead worker's figures put under the new pid."""
    import os

    runners = {"pipeline": runner(os.getpid()), "vocoder/0": runner(0), "vocoder/1": runner(0)}
    monitor = Monitor(replicated_plan(), runners, lambda event: None)
    monitor.sample()
    measured = monitor.resources("pipeline")
    assert measured is not None and measured.rss_bytes > 0
    runners["pipeline"].pid = 0  # it died: nothing runs
    monitor.sample()
    assert monitor.resources("pipeline") is not None  # no process: status says so from the pid, not the figures
    runners["pipeline"].pid = os.getppid()  # its replacement, not sampled yet
    assert monitor.resources("pipeline") is None
    assert {g.name: g.resources for g in monitor.summary("DEGRADED", 0).groups}["pipeline"] is None
    monitor.sample()
    measured = monitor.resources("pipeline")
    assert measured is not None and measured.rss_bytes > 0
