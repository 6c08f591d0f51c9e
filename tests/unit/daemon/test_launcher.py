"""Pure parts of the launcher: what the fork server preloads, how often workers beat, argument checks."""

from __future__ import annotations

import pytest

import types

from stagevisor.supervisor.daemon.handle import Handshake, heartbeat_interval
from stagevisor.supervisor.daemon.launcher import Launcher
from stagevisor.supervisor.daemon.process_worker import STARTUP_PHASES, startup_phases
from stagevisor.supervisor.daemon.start_policy import (
    CONSOLE_SCRIPT_IMPORTS,
    WORKER_PRELOAD,
    main_module_preload,
    preload_modules,
)
from stagevisor.supervisor.plan import PlannedStage, ProcessGroup
from stagevisor.supervisor.worker.spec import WorkerSpec


def spec(group: str, *stages: tuple[str, str, int | None]) -> WorkerSpec:
    planned = tuple(
        PlannedStage(
            name=name,
            process=group,
            gpu=gpu,
            tp_size=1,
            total_gpu_memory_fraction=None,
            fraction_source=None,
            factory=factory,
        )
        for name, factory, gpu in stages
    )
    gpus = {gpu for _, _, gpu in stages if gpu is not None}
    return WorkerSpec(
        group=ProcessGroup(group, tuple(s.name for s in planned), next(iter(gpus), None), None),
        stages=planned,
        model_path=None,
        address=f"unix:/tmp/{group}.sock",
    )


def test_the_fork_server_preloads_builtin_executors_of_cpu_groups_only():
    specs = [
        spec(
            "cpu",
            ("preprocessing", "stagevisor.stages.piper.executors:preprocessing", None),
            ("other", "stagevisor.stages.piper.executors:tts_engine", None),
        ),
        spec("gpu", ("vocoder", "stagevisor.stages.standins:vocoder", 0)),
        spec("third_party", ("x", "acme.tts:build", None)),
    ]
    modules = preload_modules(specs, ("voice.graph",))
    assert modules[: len(WORKER_PRELOAD)] == WORKER_PRELOAD
    assert modules[len(WORKER_PRELOAD) :] == ("stagevisor.stages.piper.executors", "voice.graph")


def test_without_builtin_executors_the_model_s_preload_is_not_imported():
    assert preload_modules([spec("third_party", ("x", "acme.tts:build", None))], ("voice.graph",)) == WORKER_PRELOAD


def test_the_demo_and_the_stand_in_models_declare_the_default_voice_s_preload_and_plans_carry_it():
    from stagevisor.models.registry import builtin_models
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    voice = ("stagevisor.stages.hibari.preload",)
    assert all(d.preload() == voice for d in builtin_models() if d.standin_executors or d.key == "demo")
    assert plan_placement(PlacementRequest("demo")).preload == voice
    assert plan_placement(PlacementRequest("piper")).preload == ("stagevisor.stages.piper.preload",)
    assert "preload" not in plan_placement(PlacementRequest("demo")).to_json()


def test_the_fork_server_never_preloads_torch():
    assert not any("torch" in module for module in WORKER_PRELOAD)


@pytest.mark.parametrize("timeout, interval", [(0, 0.0), (2, 0.5), (10, 1.0), (0.4, 0.1)])
def test_workers_beat_four_times_per_timeout_and_at_least_once_a_second(timeout, interval):
    assert heartbeat_interval(timeout) == pytest.approx(interval)


def test_launcher_rejects_an_unknown_start_method_and_a_negative_heartbeat_timeout():
    with pytest.raises(ValueError, match="forkserver, spawn"):
        Launcher("fork")
    with pytest.raises(ValueError, match="heartbeat timeout must be >= 0"):
        Launcher("spawn", heartbeat_timeout=-1)


@pytest.mark.parametrize(
    "model, package, prepared",
    [
        ("demo", "hibari", "voice.shared_g2p.cache_info().currsize"),
        ("piper", "piper", "voice.split_graphs.cache_info().currsize"),
    ],
)
def test_what_the_fork_server_preloads_for_a_voice_leaves_it_safe_to_fork(model, package, prepared):
    """Importing the preload list starts no thread, initializes no gRPC core, loads no onnxruntime or torch.

    A subprocess (the preload must not leak into this one); OpenBLAS's own pool
    is capped at one thread so any other thread shows (OpenBLAS stops its pool
    around fork itself). GRPC_TRACE=api logs `grpc_init` on the first channel or
    server, never on import.
    """
    import json
    import os
    import subprocess
    import sys

    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
    from stagevisor.supervisor.worker.spec import WorkerSpec

    plan = plan_placement(PlacementRequest(model, None, [], []))
    specs = [
        WorkerSpec(
            group=g,
            stages=tuple(s for s in plan.stages if s.process == g.name),
            model_path=model,
            address="unix:/tmp/x.sock",
        )
        for g in plan.groups
    ]
    # What the fork server of `stagevisor serve`, run by the console script, imports.
    modules = (*preload_modules(specs, plan.preload), *CONSOLE_SCRIPT_IMPORTS)
    assert f"stagevisor.stages.{package}.executors" in modules and f"stagevisor.stages.{package}.preload" in modules
    script = (
        "import importlib, json, os, sys\n"
        f"for m in {list(modules)!r}: importlib.import_module(m)\n"
        f"from stagevisor.stages.{package} import voice\n"
        "print(json.dumps({'threads': len(os.listdir('/proc/self/task')),"
        " 'loaded': sorted(m for m in ('onnxruntime', 'torch', 'piper') if m in sys.modules),"
        f" 'prepared': {prepared}}}))\n"
    )
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "GRPC_TRACE": "api", "GRPC_VERBOSITY": "debug"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts == {"threads": 1, "loaded": [], "prepared": 1}
    assert "grpc_init" not in result.stderr


def module(name: str | None = None, file: str | None = None) -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=name) if name else None  # type: ignore[assignment]
    if file:
        main.__file__ = file
    return main


@pytest.mark.parametrize(
    "main, preloaded",
    [
        (module("tests.integration.daemon_entry", "/x/daemon_entry.py"), ("tests.integration.daemon_entry",)),
        (module("stagevisor.__main__", "/x/__main__.py"), ()),  # multiprocessing skips a package's __main__
        (module(None, "/venv/bin/stagevisor"), CONSOLE_SCRIPT_IMPORTS),
        (module(None, None), ()),  # an interactive interpreter
    ],
)
def test_the_fork_server_imports_what_each_worker_would_import_again_for_the_daemons_main_module(main, preloaded):
    assert main_module_preload(main) == preloaded


def test_a_workers_start_splits_into_phases_that_add_up_to_launch_until_ready_read():
    stamps = {"entered": 10.02, "imported": 10.05, "factory_import_seconds": 0.01, "built": 10.35, "bound": 10.36}
    phases = startup_phases(10.0, 10.01, stamps, 10.38)
    assert [name for name, _ in phases] == list(STARTUP_PHASES)
    assert dict(phases) == pytest.approx(
        {"launch": 0.01, "interpreter": 0.01, "imports": 0.04, "build": 0.29, "serve": 0.01, "handshake": 0.02}
    )
    assert sum(seconds for _, seconds in phases) == pytest.approx(0.38)
    described = Handshake(pid=1, fraction_enforced=False, phases=phases, cpu_seconds=0.25).describe_phases()
    assert described.startswith("started in 0.380s: launch 0.010s, interpreter 0.010s, imports 0.040s, build 0.290s")
    assert described.endswith("handshake 0.020s; worker cpu 0.250s")


def test_phases_are_unknown_without_the_workers_stamps_and_never_negative():
    assert startup_phases(1.0, 1.1, {"entered": 1.2}, 2.0) == ()
    assert Handshake(pid=1, fraction_enforced=False).describe_phases() == ""
    stepped = startup_phases(5.0, 5.1, {"entered": 4.0, "imported": 4.1, "built": 4.2, "bound": 4.3}, 4.5)
    assert dict(stepped)["interpreter"] == 0.0


def test_standby_workers_are_for_existing_cpu_groups_only():
    from stagevisor.supervisor.errors import ConfigError, ErrorCode
    from stagevisor.supervisor.daemon.start_policy import standby_groups

    specs = {
        "cpu": spec("cpu", ("pre", "stagevisor.stages.piper.executors:preprocessing", None)),
        "gpu": spec("gpu", ("vocoder", "stagevisor.stages.standins:vocoder", 0)),
    }
    assert standby_groups(specs, ["cpu", "cpu"]) == frozenset({"cpu"})
    assert standby_groups(specs, []) == frozenset()
    # A bad setting: INVALID_CONFIG, exit 2 from `serve` (it was a DaemonError, exit 1)
    with pytest.raises(ConfigError, match="names no process group: nope; the groups are cpu, gpu") as caught:
        standby_groups(specs, ["nope"])
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    with pytest.raises(ConfigError, match="--standby-worker gpu: the group has GPU stages"):
        standby_groups(specs, ["gpu", "cpu"])


def test_a_replicated_group_takes_standby_workers_by_its_group_name():
    """Before: specs are keyed by worker, so `--standby-worker pipeline` with `--process-replicas pipeline=2` was
    refused ("the groups are pipeline/0, pipeline/1"), and `pipeline/0` was taken but the launcher, which matches
    group names, kept no standby for it."""
    import dataclasses

    from stagevisor.supervisor.errors import ConfigError
    from stagevisor.supervisor.daemon.start_policy import standby_groups

    pipeline = spec("pipeline", ("pre", "stagevisor.stages.piper.executors:preprocessing", None))
    specs = {f"pipeline/{i}": dataclasses.replace(pipeline, worker=f"pipeline/{i}") for i in range(2)}
    assert standby_groups(specs, ["pipeline"]) == frozenset({"pipeline"})
    with pytest.raises(ConfigError) as caught:
        standby_groups(specs, ["pipeline/1"])
    assert str(caught.value) == (
        "--standby-worker names no process group: pipeline/1; the groups are pipeline (see `stagevisor plan`); "
        "'pipeline/1' is one replica of group 'pipeline': name the group, and each of its replicas keeps a standby"
    )


@pytest.mark.parametrize("forks, warmed", [(True, 1), (False, 0)])
def test_prepare_starts_the_fork_server_only_where_a_worker_will_fork_from_it(monkeypatch, forks, warmed):
    """With every group spawned (each has a GPU stage) the daemon skips the fork server's preload."""
    import asyncio

    calls = []
    launcher = Launcher("forkserver", forks=forks)
    monkeypatch.setattr(launcher, "_warm", lambda: calls.append("warm"))
    asyncio.run(launcher.prepare())
    assert len(calls) == warmed


def test_a_standby_can_take_over_at_the_groups_other_address_but_not_for_another_blueprint(tmp_path):
    """A restart without a pause starts the group's new worker at its other address (`g<i>.alt.sock`, with
    routing to match): the standby built for the current one serves there once its activation says so. A
    spec that differs otherwise (another topology's, another replica's) gets no standby."""
    from dataclasses import replace

    from stagevisor.supervisor.daemon.specs import worker_specs
    from stagevisor.supervisor.daemon.start_policy import can_take_over
    from stagevisor.supervisor.worker.handshake import Activation
    from tests.unit.daemon.daemon_driver import cpu_plan

    plan = cpu_plan("front", "front", "pipeline", "pipeline")

    def specs(run_dir, alternate=frozenset()):
        return worker_specs(plan, run_dir, parent_pid=1, log_level="INFO", environ={}, alternate=alternate)[0]

    here, beside = specs(tmp_path)["pipeline"], specs(tmp_path, frozenset({"pipeline"}))["pipeline"]
    assert beside.address != here.address and beside.replica_routes != here.replica_routes
    assert can_take_over(here, beside) and can_take_over(beside, here) and can_take_over(here, here)
    assert Activation.of(beside).apply(here) == beside
    assert not can_take_over(None, here)
    assert not can_take_over(specs(tmp_path / "g1")["pipeline"], here)  # an apply's new topology
    assert not can_take_over(specs(tmp_path)["front"], here)
    assert not can_take_over(replace(here, drain_grace=5.0), here)
