"""Worker startup logic without a process: factory injection, GPU binding, stage building."""

from __future__ import annotations

import asyncio
import sys
import types
from dataclasses import replace

import pytest

from stagevisor.supervisor.plan import PlannedStage, ProcessGroup
from stagevisor.supervisor.worker.build import StageBuildError, build_stages, factory_kwargs, resolve_factory
from stagevisor.supervisor.worker.gpu import bind_gpu
from stagevisor.supervisor.worker.main import STOP_GRACE, STOP_RESERVE, drain_budget
from stagevisor.supervisor.worker.spec import WorkerSpec

INJECTED = {"model_path": "org/model", "gpu_id": 0, "total_gpu_memory_fraction": 0.1}


def stage(name, factory, gpu=None, fraction=None, args=None):
    return PlannedStage(
        name=name,
        process="p",
        gpu=gpu,
        tp_size=1,
        total_gpu_memory_fraction=fraction,
        fraction_source=None,
        factory=factory,
        args=args or {},
    )


def spec_of(*stages, gpu=None, fraction=None):
    group = ProcessGroup("p", tuple(s.name for s in stages), gpu, fraction)
    return WorkerSpec(group=group, stages=stages, model_path="org/model", address="unix:/tmp/x.sock")


def test_factory_receives_only_the_injected_values_its_signature_names():
    def factory(lang, gpu_id):
        return None

    assert factory_kwargs(factory, {"lang": "en"}, INJECTED) == {"lang": "en", "gpu_id": 0}


def test_factory_with_var_keyword_receives_every_injected_value():
    def factory(**kwargs):
        return None

    assert factory_kwargs(factory, {}, INJECTED) == INJECTED


def test_factory_without_matching_parameters_receives_none_of_them():
    def factory(lang="en"):
        return None

    assert factory_kwargs(factory, {}, INJECTED) == {}


def test_injected_values_win_over_args_of_the_same_name():
    def factory(total_gpu_memory_fraction):
        return None

    assert factory_kwargs(factory, {"total_gpu_memory_fraction": 0.5}, INJECTED) == {"total_gpu_memory_fraction": 0.1}


def test_resolve_factory_follows_dotted_attributes():
    assert resolve_factory("os.path:join") is __import__("os").path.join


@pytest.mark.parametrize("path", ["os.path.join", ":join", "os:"])
def test_resolve_factory_rejects_paths_without_module_and_callable(path):
    with pytest.raises(ValueError, match="module:callable"):
        resolve_factory(path)


def test_a_cpu_only_group_never_imports_torch():
    imported = []
    binding = bind_gpu(spec_of(stage("pre", "m:f")), import_module=imported.append)
    assert imported == [] and binding.fraction_enforced is False and binding.warning is None


def test_without_torch_a_gpu_group_runs_on_cpu_with_one_warning():
    def no_torch(name):
        raise ImportError(name)

    binding = bind_gpu(spec_of(stage("voc", "m:f", gpu=0, fraction=0.1), gpu=0, fraction=0.1), import_module=no_torch)
    assert binding.fraction_enforced is False
    assert binding.warning == (
        "no CUDA device 0: GPU stages of group 'p' (voc) run on CPU; memory fraction not enforced"
    )


def test_the_no_cuda_warning_names_only_the_groups_gpu_stages():
    def no_torch(name):
        raise ImportError(name)

    spec = spec_of(stage("pre", "m:f"), stage("enc", "m:f", gpu=0, fraction=0.03), gpu=0, fraction=0.03)
    assert "GPU stages of group 'p' (enc) run on CPU" in bind_gpu(spec, import_module=no_torch).warning


def recording_torch(calls: list, devices: int) -> types.SimpleNamespace:
    """A torch whose CUDA has `devices` GPUs and records what the worker binds in `calls`."""
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: devices,
        set_device=lambda gpu: calls.append(("set_device", gpu)),
        set_per_process_memory_fraction=lambda f, gpu: calls.append(("fraction", f, gpu)),
    )
    return types.SimpleNamespace(cuda=cuda)


def test_with_cuda_the_group_binds_its_gpu_and_enforces_its_fraction():
    calls: list = []
    fake_torch = recording_torch(calls, devices=2)
    spec = spec_of(stage("voc", "m:f", gpu=1, fraction=0.1), gpu=1, fraction=0.1)
    binding = bind_gpu(spec, import_module=lambda name: fake_torch)
    assert calls == [("set_device", 1), ("fraction", 0.1, 1)]
    assert binding.fraction_enforced is True and binding.warning is None


def test_a_process_alone_on_its_gpu_is_capped_at_the_fractions_its_stages_declare_whole():
    """MOSS-TTS Local declares 0.90 for its engine and none for the preprocessing and vocoder beside it: the
    worker's cap is that sum, which the whole process shares."""
    calls: list = []
    fake_torch = recording_torch(calls, devices=1)
    spec = spec_of(stage("engine", "m:f", gpu=0, fraction=0.9), stage("voc", "m:f", gpu=0), gpu=0, fraction=0.9)
    binding = bind_gpu(spec, import_module=lambda name: fake_torch)
    assert calls == [("set_device", 0), ("fraction", 0.9, 0)] and binding.fraction_enforced is True


def test_stages_build_in_config_order_from_sync_and_async_factories():
    spec = spec_of(
        stage("a", "tests.integration.daemon_stages:make_echo", args={"name": "a"}),
        stage("b", "tests.integration.daemon_stages:make_async_echo", args={"name": "b"}),
    )
    built = asyncio.run(build_stages(spec))
    assert list(built) == ["a", "b"]
    assert built["a"].injected == {"model_path": "org/model", "gpu_id": None, "total_gpu_memory_fraction": None}
    assert built["b"].name == "b"


def test_a_gpu_stage_factory_receives_its_own_fraction_and_the_local_gpu():
    """The placement's fraction of each stage reaches its factory (a group's fraction is the sum of its stages'):
    an engine that sizes its own memory from it must get the stage's share, not the group's or none."""
    spec = spec_of(
        stage("engine", "tests.integration.daemon_stages:make_echo", gpu=3, fraction=0.6, args={"name": "engine"}),
        stage("vocoder", "tests.integration.daemon_stages:make_echo", gpu=3, fraction=0.15, args={"name": "vocoder"}),
        gpu=3,
        fraction=0.75,
    )
    built = asyncio.run(build_stages(spec))
    assert built["engine"].injected == {"model_path": "org/model", "gpu_id": 3, "total_gpu_memory_fraction": 0.6}
    assert built["vocoder"].injected["total_gpu_memory_fraction"] == 0.15


def test_a_failing_factory_is_reported_with_its_stage_and_exception():
    spec = spec_of(
        stage("a", "tests.integration.daemon_stages:make_echo"),
        stage("b", "tests.integration.daemon_stages:make_broken"),
    )
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec))
    assert caught.value.stage == "b"
    assert str(caught.value) == "stage 'b' failed to build: StageBuildBoom: weights not found"


def exiting_factory(name: str = "") -> None:
    sys.exit("cannot find the model weights")  # as a model library's loader may do


def test_a_factory_that_calls_sys_exit_is_reported_with_its_stage():
    """A factory that calls sys.exit() ended the worker with no word of which stage: the daemon said only
    `worker pid N died during initialization (exit code 0); see its output above`."""
    spec = spec_of(stage("vocoder", "tests.unit.worker.test_worker:exiting_factory"))
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec))
    assert caught.value.stage == "vocoder"
    assert str(caught.value) == "stage 'vocoder' failed to build: SystemExit: cannot find the model weights"


def test_a_factory_import_that_fails_is_reported_coded_as_check_reports_it():
    """serve's startup failure for a module that imports a missing package names the case, as `check` does;
    it said `ModuleNotFoundError: No module named '...'`, as if the stage's own module were missing."""
    spec = spec_of(stage("vocoder", "tests.unit.checks.test_check:lazy_vocoder"))
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec))
    assert str(caught.value).startswith(
        "stage 'vocoder' failed to build: MISSING_DEPENDENCY: factory 'tests.unit.checks.test_check:lazy_vocoder' "
        "cannot be imported: module 'tests.unit.checks.test_check' was found, but an import failed: No module "
        "named 'not_installed_vocoder_dep' (at "
    )
    spec = spec_of(stage("vocoder", "tests.unit.checks.test_chek:make_vocoder"))
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec))
    assert str(caught.value).startswith(
        "stage 'vocoder' failed to build: MODULE_NOT_FOUND: factory 'tests.unit.checks.test_chek:make_vocoder' "
        "cannot be imported: no module 'tests.unit.checks.test_chek' on the import path"
    )


class SyncProcess:
    def process(self, payload, ctx):
        return {}


class NoProcess:
    pass


class TextLimited:
    def __init__(self, limit) -> None:
        self.max_text_chars = limit

    async def process(self, payload, ctx):
        return None


class YieldingProcess:
    async def process(self, payload, ctx):
        yield {"audio": None, "sample_rate": 16000}


@pytest.mark.parametrize(
    "factory, expected",
    [
        ("tests.integration.daemon_stages:make_nothing", "returned None"),
        ("tests.unit.worker.test_worker:NoProcess", "a NoProcess with no process() method"),
        ("tests.unit.worker.test_worker:SyncProcess", "not a coroutine function"),
        ("tests.unit.worker.test_worker:YieldingProcess", "process yields (an async generator); stream each chunk"),
    ],
)
def test_a_factory_without_an_async_process_fails_the_build_naming_the_stage(factory, expected):
    spec = spec_of(stage("a", "tests.integration.daemon_stages:make_echo"), stage("voc", factory))
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec))
    assert caught.value.stage == "voc"
    assert str(caught.value).startswith("stage 'voc' failed to build: ExecutorContractError: factory")
    assert expected in str(caught.value)


@pytest.mark.parametrize("limit", ["500", 0, 12.5])
def test_a_text_limit_that_is_not_a_positive_int_fails_the_build_instead_of_being_ignored(limit):
    spec = spec_of(stage("voc", "tests.unit.worker.test_worker:TextLimited", args={"limit": limit}))
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec))
    assert caught.value.stage == "voc"
    assert f"max_text_chars is {limit!r}; declare it as a positive int" in str(caught.value)


def test_building_records_when_the_stages_were_built_and_how_long_their_modules_took_to_import():
    spec = spec_of(
        stage("a", "tests.integration.daemon_stages:make_echo", args={"name": "a"}),
        stage("b", "tests.integration.daemon_stages:make_async_echo", args={"name": "b"}),
    )
    stamps = {"imported": 1.0}
    asyncio.run(build_stages(spec, stamps))
    assert set(stamps) == {"imported", "built", "factory_import_seconds"}
    assert stamps["built"] > stamps["imported"] and 0.0 <= stamps["factory_import_seconds"] < stamps["built"]


def test_a_factory_whose_module_does_not_import_still_fails_as_its_stage_in_order():
    spec = spec_of(
        stage("a", "tests.integration.no_such_module:make"), stage("b", "tests.integration.daemon_stages:make_broken")
    )
    with pytest.raises(StageBuildError) as caught:
        asyncio.run(build_stages(spec, {}))
    assert caught.value.stage == "a" and isinstance(caught.value.cause, ModuleNotFoundError)


@pytest.mark.parametrize(
    ("drain_grace", "stop_timeout", "budget"),
    [
        (0.0, None, STOP_GRACE),  # no daemon waits on it with a deadline
        (0.0, 10.0, STOP_GRACE),  # the default stop timeout leaves the whole grace
        (0.0, 3.0, 1.5),  # drained 5 s and was killed at 3 s: half of a short stop timeout now
        (0.0, 6.0, 4.0),  # STOP_RESERVE before the stop timeout's end
        (0.0, 0.0, 0.0),
        (65.0, 75.0, 65.0),  # a replica's stop timeout is its drain grace plus --stop-timeout
        (65.0, 65.0, 63.0),  # --stop-timeout 0: it keeps STOP_RESERVE of its grace to exit
    ],
)
def test_a_stopping_worker_ends_its_drain_in_time_to_exit_within_the_daemons_stop_timeout(
    drain_grace, stop_timeout, budget
):
    spec = replace(spec_of(), drain_grace=drain_grace, stop_timeout=stop_timeout)
    assert drain_budget(spec) == pytest.approx(budget)
    if stop_timeout is not None:
        assert stop_timeout - drain_budget(spec) >= min(STOP_RESERVE, stop_timeout / 2)
