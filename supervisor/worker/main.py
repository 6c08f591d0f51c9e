"""The worker process main: tie its life to the daemon, bind the GPU, build the stages, serve, report READY.

Runs in a process forked from the daemon's fork server or spawned (supervisor/daemon/launcher.py), called by
supervisor/worker/boot.py's main.
Order matters: the parent-death guards come first so that a worker can never
outlive its daemon, even if it hangs later while loading a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import inspect
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterable, Mapping, cast

from stagevisor.supervisor import envs
from stagevisor.stages.base import (
    declared_max_text_chars,
    max_text_chars_declared_by,
    usable_max_text_chars,
    voices_declared_by,
)
from stagevisor.supervisor.errors import clipped
from stagevisor.supervisor.plan import PlannedStage
from stagevisor.supervisor.worker.app_paths import import_failure
from stagevisor.supervisor.worker.handshake import Activation, WorkerFailed, WorkerReady, WorkerReport
from stagevisor.supervisor.worker.spec import VISIBLE_DEVICES, WorkerSpec

log = logging.getLogger("stagevisor.worker")

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
WORKER_COMM_PREFIX = "sv:"
"""Workers name themselves `sv:<group>` (visible in /proc/PID/comm and `ps -o comm`)."""
WATCHDOG_INTERVAL = 0.5
STOP_GRACE = 5.0
INJECTED = ("model_path", "gpu_id", "total_gpu_memory_fraction")


def node_cache_dir(environ: Mapping[str, str] = os.environ) -> str:
    """Where a worker keeps what it may reuse across daemons on this node (the voice's optimized graphs):
    $XDG_CACHE_HOME/stagevisor/<version>, else ~/.cache/stagevisor/<version>.

    Per node and per stagevisor version: a Ray worker on another node finds its node's own copy, and
    an upgrade never reads graphs an older version wrote. Computed in the worker, on its node.
    """
    from stagevisor import __version__

    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stagevisor", __version__)


class StageBuildError(Exception):
    """A stage's factory raised; carries the stage name so the daemon can name the root cause.

    A failed import says which one, coded as `stagevisor check` says it (MODULE_NOT_FOUND, MISSING_DEPENDENCY).
    """

    def __init__(self, stage: str, cause: BaseException, factory: str | None = None) -> None:
        problem = import_failure(stage, factory, cause, sys.path) if factory else None
        why = f"{problem.code.value}: factory {factory!r} cannot be imported: {problem.reason()}" if problem else None
        super().__init__(f"stage {stage!r} failed to build: {why or f'{type(cause).__name__}: {cause}'}")
        self.stage = stage
        self.cause = cause


@dataclass(frozen=True)
class GpuBinding:
    """Result of binding a group's GPU: the CUDA ordinal used, whether the fraction is enforced, the device."""

    gpu: int | None
    """The CUDA ordinal of the group's GPU in this process (WorkerSpec.local_gpu)."""
    fraction_enforced: bool
    warning: str | None = None
    device: str = ""
    """`cuda:<ordinal> (<name>, <uuid>)` when bound, `cpu` for GPU stages without CUDA, empty for a CPU group."""


def _describe_device(torch: Any, ordinal: int) -> str:
    try:
        props = torch.cuda.get_device_properties(ordinal)
    except Exception:  # noqa: BLE001 - a description only; binding already succeeded
        return f"cuda:{ordinal}"
    uuid = getattr(props, "uuid", None)
    return f"cuda:{ordinal} ({props.name}" + (f", GPU-{uuid})" if uuid else ")")


def bind_gpu(spec: WorkerSpec, import_module: Callable[[str], Any] = importlib.import_module) -> GpuBinding:
    """Select the group's GPU and cap this process's allocator at the group's fraction.

    Under isolation (the default) the worker was started with
    CUDA_VISIBLE_DEVICES naming only its group's GPU, which it sees as CUDA
    device 0 (a TP rank: its stage's GPUs, its own at index tp_rank). A group
    with no GPU stage never imports torch. Without torch or without a CUDA
    device the GPU stages run on CPU and the fraction is reported as not
    enforced, with one warning.
    """
    group = spec.group
    gpu_stages = [stage.name for stage in spec.stages if stage.gpu is not None]
    ordinal = spec.local_gpu
    if ordinal is None or not gpu_stages:
        return GpuBinding(None, False)
    try:
        torch = import_module("torch")
        has_cuda = bool(torch.cuda.is_available()) and torch.cuda.device_count() > ordinal
    except ImportError:
        torch, has_cuda = None, False
    if not has_cuda:
        where = f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})" if spec.isolated else ""
        warning = (
            f"no CUDA device {group.gpu}{where}: GPU stages of group {group.name!r} "
            f"({', '.join(gpu_stages)}) run on CPU; memory fraction not enforced"
        )
        return GpuBinding(ordinal, False, warning, device="cpu")
    torch.cuda.set_device(ordinal)
    device = _describe_device(torch, ordinal)
    if group.total_gpu_memory_fraction is None:
        return GpuBinding(ordinal, False, device=device)
    undeclared = [s.name for s in spec.stages if s.gpu is not None and s.total_gpu_memory_fraction is None]
    if undeclared:  # the declared stages' sum would cap these too (the plan warned)
        warning = (
            f"memory fraction of group {group.name!r} not enforced: {', '.join(undeclared)} declare(s) no "
            f"total_gpu_memory_fraction, and a cap at the others' {group.total_gpu_memory_fraction:g} would hold "
            "them too"
        )
        return GpuBinding(ordinal, False, warning, device=device)
    torch.cuda.set_per_process_memory_fraction(group.total_gpu_memory_fraction, ordinal)
    return GpuBinding(ordinal, True, device=device)


def resolve_factory(path: str) -> Callable[..., Any]:
    """Import `module:callable` (the callable may be dotted, e.g. `pkg.mod:Class.build`)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"factory {path!r} is not of the form 'module:callable'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"factory {path!r} is not callable")
    return target


def factory_kwargs(factory: Callable[..., Any], args: Mapping[str, Any], injected: Mapping[str, Any]) -> dict[str, Any]:
    """The stage's `args` plus each injected value the factory's signature accepts.

    Injected values describe where the stage really runs, so they win over an
    `args` entry of the same name.
    """
    kwargs = dict(args)
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: inject nothing
        return kwargs
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    names = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    for name, value in injected.items():
        if accepts_any or name in names:
            kwargs[name] = value
    return kwargs


async def build_stage(stage: PlannedStage, spec: WorkerSpec) -> Any:
    """Call the stage's factory (sync or async) with its args and the values it accepts."""
    if stage.factory is None:
        raise ValueError(f"stage {stage.name!r} has no factory to build it from")
    factory = resolve_factory(stage.factory)
    # The CUDA ordinal to use in this process (0 under isolation); the physical
    # device is in the topology (`physical_gpu`).
    gpu_id = spec.local_gpu if stage.gpu is not None else None
    injected = {
        "model_path": spec.model_path,
        "gpu_id": gpu_id,
        "total_gpu_memory_fraction": stage.total_gpu_memory_fraction,
    }
    built = factory(**factory_kwargs(factory, stage.args, injected))
    if inspect.isawaitable(built):
        built = await built
    return built


class ExecutorContractError(TypeError):
    """What a factory returned is not an executor: `field` is `executor` (no process()) or `process`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_executor(stage: PlannedStage, built: Any) -> None:
    """Refuse what a factory returned unless it has an async `process(payload, ctx)`.

    Caught at build time, the stage fails to start with its name in the root
    cause, instead of a READY worker that fails every request. The one
    definition of this part of the contract: `stagevisor check` applies it too.
    `process` is looked up by name here because this is where foreign objects
    are validated against the Stage contract; past it, executors are typed as Stage.
    """
    process = getattr(built, "process", None)
    if built is None or process is None:
        what = "None" if built is None else f"a {type(built).__qualname__}"
        raise ExecutorContractError(
            "executor",
            f"factory {stage.factory!r} returned {what} with no process() "
            "method; it must return an executor with `async def process(self, payload, "
            "ctx)` (see stages/README.md)",
        )
    limit = max_text_chars_declared_by(built)
    if limit is not None and not usable_max_text_chars(limit):
        # Ignored, it would leave the stage open to texts longer than its author meant to accept.
        raise ExecutorContractError(
            "max_text_chars",
            f"{type(built).__qualname__}.max_text_chars is {clipped(repr(limit), 40)}; declare it as a positive "
            "int, the longest text the stage accepts (e.g. `max_text_chars = 500`)",
        )
    if inspect.isasyncgenfunction(process):
        raise ExecutorContractError(
            "process",
            f"factory {stage.factory!r} returned a {type(built).__qualname__} whose process yields (an async "
            "generator); stream each chunk with `await ctx.stream(chunk)` instead of `yield`, and return a dict "
            "or None (see stages/README.md)",
        )
    if not inspect.iscoroutinefunction(process):
        kind = "not callable" if not callable(process) else "not a coroutine function (`async def`)"
        raise ExecutorContractError(
            "process",
            f"factory {stage.factory!r} returned a {type(built).__qualname__} "
            f"whose process is {kind}; declare it `async def process(self, payload, ctx)` "
            "(see stages/README.md)",
        )


async def build_stages(spec: WorkerSpec, stamps: dict[str, float] | None = None) -> dict[str, Any]:
    """Build the group's stages in config order; the first failure is raised as StageBuildError.

    An executor without an async `process()` is a build failure too (check_executor).
    With `stamps`, records for the READY handshake's phases the wall-clock
    instant the stages were built (`built`) and the seconds spent importing
    the factories' modules (`factory_import_seconds`).
    """
    built: dict[str, Any] = {}
    importing = 0.0
    for stage in spec.stages:
        log.info("building stage %r%s", stage.name, f" ({stage.factory})" if stage.factory else "")
        try:
            if stage.factory is not None:
                start = time.perf_counter()
                with contextlib.suppress(Exception):  # build_stage raises it again, in order
                    resolve_factory(stage.factory)
                importing += time.perf_counter() - start
            built[stage.name] = await build_stage(stage, spec)
            check_executor(stage, built[stage.name])
        except (Exception, SystemExit) as error:  # sys.exit() in a factory too: the root cause names the stage
            # (not a cancellation, nor Ctrl-C: the worker is being stopped, not failing to build)
            raise StageBuildError(stage.name, error, stage.factory) from error
    if stamps is not None:
        stamps["built"] = time.time()
        stamps["factory_import_seconds"] = importing
    return built


def declared_voices(stages: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The voices the stages declare in an optional `voices` attribute: dicts with at least `id`.

    A declaration that is not a list of such dicts is logged and ignored, so a
    stage's metadata can never keep its worker from becoming READY.
    """
    voices: list[dict[str, Any]] = []
    for name, stage in stages.items():
        declared = voices_declared_by(stage)
        if declared is None:
            continue
        try:
            kept = []  # all or nothing: the warning says the declaration is ignored
            # Iterated as it stands: one that is not iterable raises the TypeError handled below.
            for voice in cast("Iterable[object]", declared):
                if not isinstance(voice, dict) or not isinstance(voice.get("id"), str):
                    raise TypeError(f"{clipped(repr(voice), 80)} is not a dict with a string 'id'")
                kept.append({k: v for k, v in voice.items() if isinstance(v, (str, int, float, bool, list))})
            voices.extend(kept)
        except TypeError as error:
            log.warning("stage %r declares voices the daemon cannot use (%s); ignored", name, error)
    return voices


def _guard_parent(spec: WorkerSpec, lifeline: Connection) -> None:
    """Exit as soon as the daemon is gone: PDEATHSIG, plus a watchdog on the lifeline for what it misses.

    The parent is the daemon (spawn) or the daemon's fork server, which exits
    with the daemon; either way EOF on the lifeline means the daemon is gone.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        name = (WORKER_COMM_PREFIX + spec.name).encode()[:15]
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    # The parent may have died between fork and prctl; PDEATHSIG would not fire then.
    if os.getppid() != parent:
        os._exit(1)
    fd = lifeline.fileno()
    os.set_blocking(fd, False)  # heartbeats must never block the event loop

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            if poller.poll(WATCHDOG_INTERVAL * 1000):
                try:
                    if not os.read(fd, 4096):
                        os._exit(1)  # EOF: no cleanup, nothing may delay releasing GPU memory
                except BlockingIOError:
                    pass
                except OSError:
                    os._exit(1)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="stagevisor-watchdog", daemon=True).start()


async def _heartbeat(lifeline: Connection, interval: float) -> None:
    """Write one byte on the lifeline every `interval` seconds, from the event loop itself.

    The daemon replaces a worker whose bytes stop: that is how a loop blocked
    by a synchronous call, or a stopped process, is told from a busy one.
    """
    fd = lifeline.fileno()
    while True:
        try:
            os.write(fd, b".")
        except BlockingIOError:
            pass  # the daemon is behind on reading; the next beat will do
        except OSError:
            return  # the daemon is gone; the watchdog ends this process
        await asyncio.sleep(interval)


def _configure_logging(spec: WorkerSpec) -> None:
    from stagevisor.supervisor import logs

    logs.configure(spec.log_level, f"{spec.name} pid %(process)d")


async def _await_activation(activation: Connection, stop: asyncio.Event) -> Activation | None:
    """A standby worker waits here, built: the daemon's Activation once it sends one, None on EOF or SIGTERM."""
    loop = asyncio.get_running_loop()
    fd = activation.fileno()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    waits = [asyncio.ensure_future(readable.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(fd)
        for wait in waits:
            wait.cancel()
    if stop.is_set():
        return None
    try:
        message = activation.recv()
    except (EOFError, OSError):
        return None
    return message if isinstance(message, Activation) else None


async def _serve(
    spec: WorkerSpec,
    handshake: Connection,
    lifeline: Connection,
    heartbeat_interval: float,
    stamps: dict[str, float],
    activation: Connection | None = None,
) -> int:
    from stagevisor.supervisor.worker.node import WorkerNode

    stop = asyncio.Event()

    binding = bind_gpu(spec)
    if binding.warning:
        log.warning(binding.warning)
    try:
        stages = await build_stages(spec, stamps)
        if spec.record_handoffs:
            from stagevisor.supervisor.worker.handoffs import record_handoffs

            stages = record_handoffs(spec.record_handoffs, spec.group.name, stages)
        # Only once built: until then SIGTERM keeps its default action, so a worker stopped while it loads a model
        # (a shutdown or an apply during a restart or a scale) exits at once; it holds no request to finish.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        if activation is not None:
            # A standby (launcher.Launcher, --standby-worker): built, it binds nothing until the group's
            # worker is gone and the daemon hands it the address to serve.
            log.info("standby: stages %s built; waiting to take over", ", ".join(stages))
            taking_over = await _await_activation(activation, stop)
            if taking_over is None:
                return 0
            stamps["activated"] = time.time()
            spec = taking_over.apply(spec)
        node = WorkerNode(spec, stages)
        await node.start()
        stamps["bound"] = time.time()
    except StageBuildError as error:
        _send(
            handshake,
            WorkerFailed(str(error), error.stage, "".join(traceback.format_exception(error.cause))),
        )
        return 1
    except Exception as error:
        _send(handshake, WorkerFailed(f"worker failed to start its data plane: {error}", "", traceback.format_exc()))
        return 1
    # Read back from this process's own environment: the device it really runs on.
    isolated_gpu = None
    if spec.group.gpu is not None and spec.isolated:
        visible = os.environ.get(VISIBLE_DEVICES, "").split(",")
        local = spec.local_gpu
        isolated_gpu = visible[local].strip() if local is not None and local < len(visible) else None
    # Logged before the handshake, so it comes ahead of the daemon's READY lines.
    log.info(
        "READY: stages %s on %s%s",
        ", ".join(stages),
        spec.address,
        f" and {node.tcp_address} ({node.directory.security.describe()})"
        if node.tcp_address and node.directory is not None
        else "",
    )
    _send(
        handshake,
        WorkerReady(
            pid=os.getpid(),
            fraction_enforced=binding.fraction_enforced,
            physical_gpu=isolated_gpu or None,
            device=binding.device,
            voices=tuple(declared_voices(stages)),
            max_text_chars=declared_max_text_chars(stages.values()),
            data_address=node.tcp_address,
            stamps={**stamps, "cpu_seconds": sum(os.times()[:2])},
        ),
    )
    handshake.close()
    beat = asyncio.create_task(_heartbeat(lifeline, heartbeat_interval)) if heartbeat_interval > 0 else None
    await stop.wait()
    log.info("stopping")
    try:
        await node.stop(spec.drain_grace or STOP_GRACE)
    finally:
        if beat is not None:  # beating through the drain: the daemon kills a worker that stops beating
            beat.cancel()
    return 0


def _send(conn: Connection, message: WorkerReport) -> None:
    try:
        conn.send(message)
    except (BrokenPipeError, OSError):
        pass  # the daemon is gone; the watchdog ends this process


def main(
    spec: WorkerSpec,
    handshake: Connection,
    lifeline: Connection,
    heartbeat_interval: float = 0.0,
    stamps: dict[str, float] | None = None,
    activation: Connection | None = None,
) -> None:
    """Entry point of a worker (called by worker/boot.py's main); 0 heartbeat interval: no heartbeats.

    `stamps`: wall-clock instants of its start so far (`entered`, `imported`);
    the READY handshake carries them with the later ones. With `activation`, a
    standby: it builds its stages, then waits for the daemon's byte on that pipe
    before it binds its address and reports READY (EOF: it exits).
    """
    stamps = dict(stamps or {})
    stamps.setdefault("entered", time.time())
    stamps.setdefault("imported", stamps["entered"])
    _guard_parent(spec, lifeline)
    # Normally already in the environment this process was started with (launcher.child_environment);
    # applied again before anything can load CUDA, in case the daemon's environment changed meanwhile.
    os.environ.update(spec.env)
    # SIGINT (Ctrl-C reaches the daemon's process group; the worker has its own, see boot.py, but a signal to a
    # whole cgroup reaches it too): only the daemon decides when a worker stops, so that a drain is not cut short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _configure_logging(spec)
    # An operator's own setting wins: a directory of their choice, or empty to turn caching off.
    os.environ.setdefault(envs.CACHE_DIR.name, spec.cache_dir or node_cache_dir())
    # Before any factory is imported: the user's packages beside the config or in --app-dir.
    sys.path[:0] = [path for path in spec.import_paths if path not in sys.path]
    code = asyncio.run(_serve(spec, handshake, lifeline, heartbeat_interval, stamps, activation))
    # Skip interpreter teardown: stage objects (CUDA contexts, onnxruntime sessions)
    # can hang in their finalizers, and the daemon is waiting for this exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
