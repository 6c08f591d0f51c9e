"""worker_specs turns a Plan into one WorkerSpec per group with routes to each stage's receiving group."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.daemon.specs import worker_specs
from stagevisor.supervisor.plan import Edge, Plan, PlannedStage, ProcessGroup


def plan() -> Plan:
    stages = (
        PlannedStage("pre", "front", None, 1, None, None, "m:f"),
        PlannedStage("engine", "engine", (0, 1), 2, 0.8, "declared", "m:f"),
        PlannedStage("voc", "front", None, 1, None, None, "m:f"),
    )
    groups = (
        ProcessGroup("front", ("pre", "voc"), None, None),
        ProcessGroup("engine_tp0", ("engine",), 0, 0.8, tp_rank=0, tp_size=2),
        ProcessGroup("engine_tp1", ("engine",), 1, 0.8, tp_rank=1, tp_size=2),
    )
    edges = (Edge("pre", "engine", "next", True, True), Edge("engine", "voc", "next", True, True))
    return Plan("m", "org/m", False, stages, groups, edges, ())


def test_one_spec_per_group_in_plan_order_with_its_stages_in_config_order():
    specs, _ = worker_specs(plan(), Path("/tmp/sv/d1"), parent_pid=42, log_level="DEBUG")
    assert list(specs) == ["front", "engine_tp0", "engine_tp1"]
    assert [s.name for s in specs["front"].stages] == ["pre", "voc"]
    assert specs["front"].parent_pid == 42 and specs["front"].log_level == "DEBUG"


def test_routes_send_each_stage_to_its_group_and_a_tp_stage_to_rank_zero():
    specs, sink = worker_specs(plan(), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO")
    routes = specs["front"].routes
    assert routes == {
        "pre": specs["front"].address,
        "voc": specs["front"].address,
        "engine": specs["engine_tp0"].address,
    }
    assert sink == "unix:/tmp/sv/d1/gateway.sock"
    assert len({s.address for s in specs.values()}) == 3


def test_a_runtime_dir_too_long_for_unix_sockets_is_refused_with_a_fix():
    with pytest.raises(DaemonError, match="STAGEVISOR_RUNTIME_DIR"):
        worker_specs(plan(), Path("/tmp/" + "x" * 100), parent_pid=1, log_level="INFO")


def test_the_voice_graph_cache_is_per_node_and_per_version_unless_the_operator_chose(monkeypatch, tmp_path):
    """Workers (local or Ray, on any node) reuse the cut voice graphs of earlier daemons on their node."""
    from stagevisor import __version__
    from stagevisor.supervisor.worker.main import node_cache_dir

    specs, _ = worker_specs(plan(), Path("/tmp/sv/d1"), parent_pid=42, log_level="INFO")
    assert {spec.cache_dir for spec in specs.values()} == {""}  # the worker picks its own node's directory
    assert node_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "stagevisor" / __version__)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert node_cache_dir({}) == str(tmp_path / "home" / ".cache" / "stagevisor" / __version__)


def test_a_daemon_recording_handoffs_has_every_worker_record_them_scaled_restarted_or_applied(tmp_path):
    """`stagevisor check --verify-edges` starts its daemon recording handoffs; a replica added by `scale`
    (Daemon.specs_for) recorded nothing: only the start, restart and apply paths set it on their specs."""
    from stagevisor.supervisor.daemon.core import Daemon
    from stagevisor.supervisor.daemon.options import DaemonOptions
    from stagevisor.supervisor.placement.planner import rescale
    from tests.unit.daemon.daemon_driver import SwitchingGateway, cpu_plan
    from tests.fakes import FakeLauncher

    recorded = str(tmp_path / "handoffs")
    daemon = Daemon(
        cpu_plan("front", "front", "pipeline", "pipeline"),
        DaemonOptions(run_dir=tmp_path / "d1", record_handoffs=recorded),
        launcher=FakeLauncher([]).factory,
        gateway_factory=SwitchingGateway,
    )

    scaled = daemon.specs_for(rescale(daemon.plan, "pipeline", 3))
    assert [spec.record_handoffs for spec in scaled.values()] == [recorded] * 4
    assert [spec.record_handoffs for spec in daemon.specs.values()] == [recorded] * 2
    assert daemon.beside_runner("pipeline").spec.record_handoffs == recorded


def test_every_worker_maps_payloads_in_its_own_gateways_shared_memory_started_scaled_restarted_or_applied(tmp_path):
    """Each gateway has its own shared-memory directory: the daemon's workers get the daemon's, whichever path
    made their specs (start, scale, a restart beside), and an applied topology's workers get its new gateway's."""
    import asyncio
    import itertools

    from stagevisor.supervisor.daemon.core import Daemon
    from stagevisor.supervisor.daemon.options import DaemonOptions
    from stagevisor.supervisor.placement.planner import rescale
    from tests.unit.daemon.daemon_driver import SwitchingGateway, cpu_plan
    from tests.fakes import FakeLauncher

    areas = itertools.count()

    class AreaGateway(SwitchingGateway):
        def __init__(self, *args, admission=None) -> None:
            super().__init__(*args, admission=admission)
            self.shm_dir = f"/dev/shm/area-{next(areas)}"

    class SpecLauncher(FakeLauncher):
        def __init__(self) -> None:
            super().__init__([])
            self.specs: list = []

        def start(self, spec):
            self.specs.append(spec)
            return super().start(spec)

    async def scenario():
        launcher = SpecLauncher()
        daemon = Daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=launcher.factory,
            gateway_factory=AreaGateway,
        )
        scaled = daemon.specs_for(rescale(daemon.plan, "pipeline", 3))
        beside = daemon.beside_runner("pipeline").spec
        await daemon.start()
        try:
            await daemon.apply_plan(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return scaled, beside, launcher.specs

    scaled, beside, started = asyncio.run(scenario())
    assert [spec.shm_dir for spec in scaled.values()] == ["/dev/shm/area-0"] * 4
    assert beside.shm_dir == "/dev/shm/area-0"
    assert [spec.shm_dir for spec in started] == ["/dev/shm/area-0"] * 2 + ["/dev/shm/area-1"]


def test_every_worker_knows_how_long_the_daemon_waits_for_it_to_exit_after_sigterm(tmp_path):
    """A worker drained for a fixed 5 s whatever --stop-timeout: with one of 3 s it was killed in its drain. Each
    spec the daemon makes (start, scale, a restart beside) now carries the wait its runner gives that worker."""
    from stagevisor.supervisor.daemon.core import Daemon
    from stagevisor.supervisor.daemon.options import DaemonOptions
    from stagevisor.supervisor.placement.planner import rescale
    from tests.unit.daemon.daemon_driver import SwitchingGateway, cpu_plan
    from tests.fakes import FakeLauncher

    daemon = Daemon(
        cpu_plan("front", "front", "pipeline", "pipeline"),
        DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=3.0, drain_timeout=20.0),
        launcher=FakeLauncher([]).factory,
        gateway_factory=SwitchingGateway,
    )
    started = daemon.specs
    scaled = daemon.specs_for(rescale(daemon.plan, "pipeline", 2))
    beside = daemon.beside_runner("pipeline")
    assert started["front"].stop_timeout == 3.0 and beside.spec.stop_timeout == 3.0
    drain = daemon.worker_factory.drain_timeout
    assert [scaled[f"pipeline/{i}"].stop_timeout for i in range(2)] == [drain + 3.0] * 2
    assert beside.stop_timeout == beside.spec.stop_timeout
    assert [daemon.worker_factory.stop_timeout(spec) for spec in scaled.values()] == [
        spec.stop_timeout for spec in scaled.values()
    ]


def test_worker_specs_made_without_a_stop_timeout_leave_the_worker_its_whole_grace():
    specs, _ = worker_specs(plan(), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO")
    assert {spec.stop_timeout for spec in specs.values()} == {None}
