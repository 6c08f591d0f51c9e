"""The local launcher's policy: which workers fork from the fork server, what it preloads, and standby workers.

Pure: takes worker specs and names, returns data or raises ConfigError;
launcher.py acts on it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from stagevisor.supervisor.errors import ConfigError, ErrorCode
from stagevisor.supervisor.worker.handshake import Activation
from stagevisor.supervisor.worker.spec import WorkerSpec


WORKER_PRELOAD = (
    "stagevisor.supervisor.worker.boot",
    "stagevisor.supervisor.worker.main",
    "stagevisor.supervisor.worker.endpoint",
    "numpy",
)
"""What every worker imports, and the fork server imports once: import-only, fork-safe modules."""
FORK_SERVER_MODULE = "stagevisor.supervisor.worker.fork_server"
"""The fork server's first import: it ignores SIGTERM there, so a signal to the whole process group does not kill
every forked worker with it."""


def forks_from_server(spec: WorkerSpec) -> bool:
    """Whether this group's worker forks from the fork server: a CPU group's does, a GPU group's is spawned.

    A GPU group's worker is a fresh interpreter started with only its device
    visible, so nothing in it (torch, onnxruntime's CUDA provider, an engine's
    allocator) sees another's; it loads CUDA and its model anyway, so the fork
    server would save it little.
    """
    return spec.group.gpu is None


def preload_modules(specs: Iterable[WorkerSpec], model_preload: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules the fork server imports before it forks any worker. Pure.

    The worker's own stack plus the factory modules of stagevisor's built-in
    executors in groups without a GPU stage, and then what the model declares
    its workers preload (`model_preload`, the Plan's: e.g. a voice's graphs as
    bytes), only when such an executor is preloaded. Those import numpy, onnx and gRPC's Python modules only:
    no thread (but OpenBLAS's, which stops itself at fork), no channel, no
    server, no onnxruntime, no CUDA exists before a fork (gRPC initializes its
    core on the first channel or server).
    Executors from elsewhere and every GPU group's modules are imported after
    the fork, as with spawn, because what their import does is not known:
    torch must load only in GPU groups' workers.
    """
    modules = list(WORKER_PRELOAD)
    for spec in specs:
        if any(stage.gpu is not None for stage in spec.stages):
            continue
        for stage in spec.stages:
            module = (stage.factory or "").partition(":")[0]
            if module.startswith("stagevisor.stages.") and module not in modules:
                modules.append(module)
    if len(modules) > len(WORKER_PRELOAD):  # built-in executors in a forked worker: what their model declares
        modules.extend(m for m in model_preload if m not in modules)
    return tuple(modules)


CONSOLE_SCRIPT_IMPORTS = ("stagevisor.supervisor.cli",)
"""What the `stagevisor` console script imports (pyproject's [project.scripts])."""


def main_module_preload(main: Any) -> tuple[str, ...]:
    """What the fork server imports so that each forked worker re-runs the daemon's main module cheaply.

    multiprocessing runs the parent's main module again in every child, as
    `__mp_main__`, before the child's target: `python -m some.module` re-runs
    that module (imports and all), a script (the `stagevisor` console script
    of the systemd unit) is run again by path; only a package's `__main__`
    (`python -m stagevisor`) is skipped. With the module, or what the console
    script imports, already imported in the fork server, the re-run in a
    forked worker only executes the module's own body. (The fork server's own
    `__main__` preload never receives the path in Python 3.11.)
    """
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name:
        return () if name == "__main__" or name.endswith(".__main__") else (name,)
    return CONSOLE_SCRIPT_IMPORTS if getattr(main, "__file__", None) else ()


def can_take_over(standby: WorkerSpec | None, spec: WorkerSpec) -> bool:
    """Whether a standby built from `standby` can serve as `spec`'s worker: the same blueprint, or one that
    differs only where it serves (a restart without a pause moves the group's worker to its other address),
    which its Activation carries. Pure."""
    return standby is not None and Activation.of(spec).apply(standby) == spec


def standby_groups(specs: Mapping[str, WorkerSpec], names: Iterable[str]) -> frozenset[str]:
    """The groups `--standby-worker` names, checked: each must exist and run on CPU only. Pure.

    `specs` are keyed by worker (a replicated group's `group/i`); a name is a group's, as `restart` and `scale`
    take it, and every replica of a replicated group keeps its own standby (the launcher's). Raises ConfigError
    (INVALID_CONFIG: exit 2, as any bad setting) naming the known groups, or the GPU group (its standby would hold
    a second copy of its model in GPU memory).
    """
    groups = {spec.group.name: spec.group for spec in specs.values()}
    chosen = frozenset(names)
    unknown = sorted(chosen - set(groups))
    if unknown:
        replica = next((name for name in unknown if name in specs), None)
        detail = (
            f"; {replica!r} is one replica of group {specs[replica].group.name!r}: name the group, and each of "
            "its replicas keeps a standby"
            if replica is not None
            else ""
        )
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"--standby-worker names no process group: {', '.join(unknown)}; "
            f"the groups are {', '.join(groups)} (see `stagevisor plan`){detail}",
        )
    gpu = sorted(name for name in chosen if groups[name].gpu is not None)
    if gpu:
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"--standby-worker {gpu[0]}: the group has GPU stages, and its standby would hold a "
            "second copy of its models in GPU memory; standby workers are for CPU groups",
        )
    return chosen
