"""Pure parts of the launcher: what the fork server preloads, how often workers beat, argument checks."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.launcher import WORKER_PRELOAD, Launcher, heartbeat_interval, preload_modules
from stagevisor.supervisor.plan import PlannedStage, ProcessGroup
from stagevisor.supervisor.worker_spec import WorkerSpec


def spec(group: str, *stages: tuple[str, str, int | None]) -> WorkerSpec:
    planned = tuple(PlannedStage(name=name, process=group, gpu=gpu, tp_size=1, total_gpu_memory_fraction=None,
                                 fraction_source=None, factory=factory)
                    for name, factory, gpu in stages)
    gpus = {gpu for _, _, gpu in stages if gpu is not None}
    return WorkerSpec(group=ProcessGroup(group, tuple(s.name for s in planned), next(iter(gpus), None), None),
                      stages=planned, model_path=None, address=f"unix:/tmp/{group}.sock")


def test_the_fork_server_preloads_builtin_executors_of_cpu_groups_only():
    specs = [
        spec("cpu", ("preprocessing", "stagevisor.stages.demo:preprocessing", None),
             ("other", "stagevisor.stages.demo:tts_engine", None)),
        spec("gpu", ("vocoder", "stagevisor.stages.standins:vocoder", 0)),
        spec("third_party", ("x", "acme.tts:build", None)),
    ]
    modules = preload_modules(specs)
    assert modules[:len(WORKER_PRELOAD)] == WORKER_PRELOAD
    assert modules[len(WORKER_PRELOAD):] == ("stagevisor.stages.demo",)


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
