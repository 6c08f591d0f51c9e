"""Autoscaling: the pure policy (thresholds, hysteresis, cooldowns), the loop with a fake daemon, config and plan."""

import asyncio

import pytest

from stagevisor.supervisor.config import parse_config_text
from stagevisor.supervisor.daemon.autoscale import Autoscaler, Policy, Signals
from stagevisor.supervisor.errors import ConfigError, ErrorCode, PlacementError
from stagevisor.supervisor.metrics.recent import HORIZON_SECONDS, RecentRequests, p90
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.plan import Autoscale

RULE = Autoscale(
    min_replicas=1,
    max_replicas=3,
    target_first_audio_p90_seconds=1.0,
    target_stall_p90_seconds=0.2,
    max_in_flight_per_replica=4.0,
    scale_down_ratio=0.5,
    scale_up_cooldown_seconds=5.0,
    scale_down_cooldown_seconds=30.0,
    window_seconds=10.0,
)


def signals(replicas=1, in_flight=0, first_audio=None, stall=None):
    return Signals(replicas, in_flight, 0 if first_audio is None else 10, first_audio, stall)


# ---- the policy ----------------------------------------------------------------------------


def test_first_audio_over_its_target_adds_one_replica_and_says_why():
    decision = Policy(RULE).decide(100.0, signals(first_audio=1.5))
    assert decision.replicas == 2
    assert "first audio p90 1.500 s over its target 1.000 s" in decision.reason


def test_a_stall_over_its_target_adds_one_replica():
    assert Policy(RULE).decide(100.0, signals(first_audio=0.1, stall=0.3)).replicas == 2


def test_requests_per_replica_over_the_limit_add_one_replica():
    decision = Policy(RULE).decide(100.0, signals(replicas=2, in_flight=9))
    assert decision.replicas == 3 and "4.50 requests per replica" in decision.reason


def test_a_signal_exactly_at_its_target_is_not_over_it():
    assert Policy(RULE).decide(100.0, signals(replicas=2, in_flight=8, first_audio=1.0, stall=0.2)) is None


def test_never_above_max_replicas():
    assert Policy(RULE).decide(100.0, signals(replicas=3, first_audio=9.0)) is None


def test_scale_up_waits_out_its_cooldown_after_a_change():
    policy = Policy(RULE)
    policy.changed(100.0)
    assert policy.decide(104.9, signals(first_audio=2.0)) is None
    assert policy.decide(105.0, signals(first_audio=2.0)).replicas == 2


def test_scale_down_needs_every_signal_low_for_the_whole_cooldown():
    policy = Policy(RULE)
    assert policy.decide(0.0, signals(replicas=3, in_flight=1)) is None  # low from now
    assert policy.decide(29.9, signals(replicas=3, in_flight=1)) is None
    decision = policy.decide(30.0, signals(replicas=3, in_flight=1))
    assert decision.replicas == 2 and "for 30 s" in decision.reason


def test_a_signal_between_the_thresholds_resets_the_quiet_time():
    policy = Policy(RULE)
    policy.decide(0.0, signals(replicas=2))
    assert policy.decide(20.0, signals(replicas=2, first_audio=0.7)) is None  # 0.7: above 0.5 x 1.0, below 1.0
    assert policy.decide(35.0, signals(replicas=2)) is None  # quiet again only since 35
    assert policy.decide(65.0, signals(replicas=2)).replicas == 1


def test_scale_down_also_waits_for_the_cooldown_since_the_last_change():
    policy = Policy(RULE)
    policy.decide(0.0, signals(replicas=2))
    policy.changed(25.0)
    assert policy.decide(40.0, signals(replicas=2)) is None  # low since 40 now (changed() reset it)
    assert policy.decide(70.0, signals(replicas=2)).replicas == 1


def test_never_below_min_replicas_and_back_to_the_bounds_when_outside():
    policy = Policy(RULE)
    assert policy.decide(1000.0, signals(replicas=1)) is None
    policy.decide(0.0, signals(replicas=1))
    assert Policy(RULE).decide(0.0, signals(replicas=5)).replicas == 3
    rule = Autoscale(**{**RULE.to_json(), "min_replicas": 2})
    assert Policy(rule).decide(0.0, signals(replicas=1)).replicas == 2


def test_stalls_are_no_signal_without_a_target():
    rule = Autoscale(**{**RULE.to_json(), "target_stall_p90_seconds": None})
    assert Policy(rule).decide(0.0, signals(stall=5.0)) is None
    assert Policy(rule).low(signals(stall=5.0))


# ---- the window of recent requests ---------------------------------------------------------


def test_p90_is_the_nearest_rank():
    assert p90([]) is None
    assert p90([3.0]) == 3.0
    assert p90([float(v) for v in range(1, 11)]) == 9.0
    assert p90([float(v) for v in range(1, 12)]) == 10.0


def test_recent_figures_count_only_the_window():
    recent = RecentRequests()
    recent.add(1.0, 5.0, 0.0)
    recent.add(8.0, 0.1, 0.2)
    recent.add(9.0, 0.3, 0.0)
    figures = recent.figures(10.0, 5.0)
    assert (figures.requests, figures.first_audio_p90, figures.stall_p90) == (2, 0.3, 0.2)
    assert recent.figures(100.0, 5.0).requests == 0


def test_requests_older_than_any_window_are_dropped_as_new_ones_come_whether_or_not_anyone_reads():
    # Without autoscaling nothing reads the figures: a busy daemon held up to 100,000 samples no window reaches.
    recent = RecentRequests()
    for second in range(10):
        recent.add(float(second), 0.1, 0.0)
    recent.add(HORIZON_SECONDS + 5.0, 0.1, 0.0)
    assert len(recent) == 5  # the requests of seconds 6 to 9, and the new one


# ---- the loop --------------------------------------------------------------------------------


class FakeDaemon:
    def __init__(self, readings, refuse=None):
        self.readings = list(readings)
        self.replicas = 1
        self.scaled = []
        self.reports = []
        self.refuse = refuse

    def autoscale_signals(self, group, window):
        return Signals(self.replicas, *self.readings.pop(0))

    async def scale_group(self, name, replicas):
        if self.refuse is not None:
            raise self.refuse
        self.scaled.append((name, replicas))
        old, self.replicas = self.replicas, replicas
        return old, replicas, []

    def autoscale_report(self, group, old, new, reason, applied):
        self.reports.append((group, old, new, applied, reason))


def test_the_loop_applies_decisions_through_scale_and_reports_each():
    now = [0.0]
    daemon = FakeDaemon([(9, 5, 2.0, 0.0), (0, 0, None, None), (0, 0, None, None)])
    scaler = Autoscaler({"vocoder": RULE}, daemon, clock=lambda: now[0])
    asyncio.run(scaler.tick())
    assert daemon.scaled == [("vocoder", 2)]
    now[0] = 10.0
    asyncio.run(scaler.tick())  # low from 10
    now[0] = 40.0
    asyncio.run(scaler.tick())
    assert daemon.scaled == [("vocoder", 2), ("vocoder", 1)]
    assert [(r[1], r[2], r[3]) for r in daemon.reports] == [(1, 2, True), (2, 1, True)]


def test_a_refused_scale_changes_nothing_is_reported_and_waits_a_cooldown():
    now = [0.0]
    refusal = PlacementError(ErrorCode.OVER_LIMIT, "GPU 0 would carry 1.2")
    daemon = FakeDaemon([(0, 5, 2.0, 0.0), (0, 5, 2.0, 0.0)], refuse=refusal)
    scaler = Autoscaler({"vocoder": RULE}, daemon, clock=lambda: now[0])
    asyncio.run(scaler.tick())
    now[0] = 1.0
    asyncio.run(scaler.tick())  # within the scale-up cooldown: not asked again
    assert daemon.replicas == 1
    assert daemon.reports == [("vocoder", 1, 2, False, "GPU 0 would carry 1.2")]


def test_a_worker_that_fails_to_start_does_not_stop_the_loop():
    daemon = FakeDaemon([(0, 5, 2.0, 0.0)], refuse=RuntimeError("factory raised"))
    asyncio.run(Autoscaler({"vocoder": RULE}, daemon, clock=lambda: 0.0).tick())
    assert daemon.reports[0][3] is False and "factory raised" in daemon.reports[0][4]


# ---- config and plan ---------------------------------------------------------------------------


def config(text):
    return parse_config_text(text, "autoscale.yaml")


def test_the_config_needs_min_at_most_max():
    with pytest.raises(ConfigError, match="min_replicas 3 is above max_replicas 2"):
        config("model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {min_replicas: 3, max_replicas: 2}\n")


def test_the_config_refuses_replicas_outside_the_bounds():
    with pytest.raises(ConfigError, match=r"replicas 5 is outside autoscale's bounds \[1, 3\]"):
        config("model_path: demo\nprocesses:\n  vocoder:\n    replicas: 5\n    autoscale: {max_replicas: 3}\n")


@pytest.mark.parametrize("field", ["target_first_audio_p90_seconds", "scale_down_ratio", "window_seconds"])
def test_the_config_refuses_a_zero_target(field):
    with pytest.raises(ConfigError, match=field):
        config(f"model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {{max_replicas: 3, {field}: 0}}\n")


def test_the_plan_carries_the_rule_and_starts_at_min_replicas(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {min_replicas: 2, max_replicas: 3}\n")
    plan = plan_placement(PlacementRequest(None, str(path), ["vocoder"]))
    vocoder = plan.group("vocoder")
    assert vocoder.replicas == 2 and vocoder.autoscale.max_replicas == 3
    assert plan.to_json()["groups"][1]["autoscale"]["min_replicas"] == 2
    assert "autoscale" not in plan.to_json()["groups"][0]


def test_an_autoscale_naming_no_group_is_refused(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {max_replicas: 3}\n")
    with pytest.raises(PlacementError, match="no process group named 'vocoder'") as caught:
        plan_placement(
            PlacementRequest(None, str(path))
        )  # the demo's vocoder shares the `pipeline` process as declared
    assert caught.value.code is ErrorCode.MISSING_PROCESS


def test_a_max_that_would_not_fit_the_gpu_is_refused_at_plan_time(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("model_path: fishaudio/s2-pro\nprocesses:\n  vocoder:\n    autoscale: {max_replicas: 2}\n")
    with pytest.raises(PlacementError, match="max_replicas 2 would not fit") as caught:
        plan_placement(PlacementRequest(None, str(path), ["vocoder"]))  # 0.85 + 2 x 0.10 > 1.0 on GPU 0
    assert caught.value.code is ErrorCode.OVER_LIMIT


def test_a_replicas_option_outside_the_bounds_is_refused(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {max_replicas: 3}\n")
    with pytest.raises(ConfigError, match=r"given 5 replicas, outside the autoscale bounds \[1, 3\]"):
        plan_placement(PlacementRequest(None, str(path), ["vocoder"], [], ["vocoder=5"]))


def test_topology_carries_the_bounds_through_the_admin_api_and_shows_them(tmp_path):
    from stagevisor.supervisor.commands.report_text import format_topology
    from stagevisor.supervisor.reports import TopologyReport

    path = tmp_path / "a.yaml"
    path.write_text("model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {max_replicas: 3}\n")
    data = plan_placement(PlacementRequest(None, str(path), ("vocoder",))).to_json()
    for group in data["groups"]:
        group.update(
            pid=1,
            state="READY",
            restarts=0,
            started_at=None,
            fraction_enforced=False,
            physical_gpu=None,
            device="",
            resources=None,
            host="",
            node_id="",
        )
    back = TopologyReport.from_proto(TopologyReport.from_json(data).to_proto())
    assert back.to_json()["groups"][1]["autoscale"] == data["groups"][1]["autoscale"]
    assert "autoscale" not in back.to_json()["groups"][0]
    assert "autoscale 1-3 replicas" in format_topology(back).splitlines()[2]


def test_an_operators_scale_counts_as_a_change_the_scale_down_cooldown_runs_from():
    """
    1. the group idles at one replica (every signal low for long);
    2. the operator scales it to three ahead of a burst (`stagevisor scale vocoder=3`, within the bounds);
    3. the autoscaler goes on from three: it removes one only after scale_down_cooldown_seconds from that
       change, not at its next reading (the operator's scale was undone within a second).
    """
    now = [0.0]
    daemon = FakeDaemon([(0, 0, None, None)] * 4)
    scaler = Autoscaler({"vocoder": RULE}, daemon, clock=lambda: now[0])
    asyncio.run(scaler.tick())  # low from 0
    now[0] = 100.0
    asyncio.run(scaler.tick())
    daemon.replicas = 3  # the operator's scale
    now[0] = 101.0
    asyncio.run(scaler.tick())
    assert daemon.scaled == []
    now[0] = 131.0
    asyncio.run(scaler.tick())
    assert daemon.scaled == [("vocoder", 2)]


def test_the_requests_a_group_holds_are_its_busiest_stages_not_their_sum():
    """Before: the stages' in-flight calls were added up, and a request streaming through the default voice's
    three stages counted three times (three requests read "9.00 requests per replica")."""
    from types import SimpleNamespace

    from stagevisor.supervisor.daemon.autoscale import DaemonAutoscaling
    from stagevisor.supervisor.metrics.registry import DaemonMetrics
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
    from tests.unit.metrics.exposition import report

    plan = plan_placement(PlacementRequest("demo", None))
    stages = plan.group("pipeline").stages
    metrics = DaemonMetrics("demo", {stage: "pipeline" for stage in stages})
    message = report(31, 0, 0)
    message.group = "pipeline"
    del message.stages[:]
    for stage in stages:  # three requests, each in every stage at once
        message.stages.add(stage=stage, in_flight=3)
    metrics.apply_report(message)
    daemon = SimpleNamespace(plan=plan, metrics=metrics, monitor=SimpleNamespace(pids=lambda: {"pipeline": 31}))
    assert DaemonAutoscaling(daemon).autoscale_signals("pipeline", 10.0).in_flight == 3


def test_the_reason_for_one_replica_under_the_minimum_counts_it_in_the_singular():
    """It read `1 replicas is below min_replicas`."""
    rule = Autoscale(**{**RULE.to_json(), "min_replicas": 2})
    assert Policy(rule).decide(0.0, signals(replicas=1)).reason == "1 replica is below min_replicas"


def test_requests_per_replica_between_the_thresholds_keep_the_count():
    """3 requests per replica: under max_in_flight_per_replica (4), over scale_down_ratio x 4 (2): neither way."""
    policy = Policy(RULE)
    assert policy.decide(0.0, signals(replicas=2, in_flight=6)) is None
    assert policy.decide(100.0, signals(replicas=2, in_flight=6)) is None


def test_a_scale_that_failed_waits_a_cooldown_before_it_is_tried_again():
    now = [0.0]
    daemon = FakeDaemon([(0, 5, 2.0, 0.0), (0, 5, 2.0, 0.0)], refuse=RuntimeError("factory raised"))
    scaler = Autoscaler({"vocoder": RULE}, daemon, clock=lambda: now[0])
    asyncio.run(scaler.tick())
    now[0] = 1.0
    asyncio.run(scaler.tick())  # within the scale-up cooldown: not tried again
    assert len(daemon.reports) == 1 and "factory raised" in daemon.reports[0][4]


def test_autoscaling_restarted_after_an_apply_runs_one_autoscaler_not_two():
    from types import SimpleNamespace

    from stagevisor.supervisor.daemon.autoscale import DaemonAutoscaling

    plan = SimpleNamespace(groups=[SimpleNamespace(name="vocoder", autoscale=RULE)])

    async def scenario():
        autoscaling = DaemonAutoscaling(SimpleNamespace(plan=plan))
        autoscaling.start()
        autoscaling.restart()
        await asyncio.sleep(0)
        running = [t for t in asyncio.all_tasks() if t.get_name() == "autoscaler" and not t.done()]
        await autoscaling.stop()
        return len(running)

    assert asyncio.run(scenario()) == 1
