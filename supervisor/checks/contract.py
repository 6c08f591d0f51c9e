"""`stagevisor check`: build every stage, run one request through the pipeline, and check the Stage contract.

Runs in one process, in the check command's own event loop: every stage is
built with the worker's own factory call, then one request flows along the
plan's `next` and `stream_to` edges the way the runtime moves it. Each step is
checked against the contract (an async `process`, a dict or None returned,
data that can cross a process boundary, terminal audio as float32 in [-1, 1]
with a sample rate) and measured. Edge safety by experiment lives in
supervisor/checks/edges.py.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stagevisor.stages.base import InvalidRequest, StagePayload
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.codec_errors import CodecError
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.plan import Plan, PlannedStage
from stagevisor.supervisor.worker.app_paths import import_failure
from stagevisor.supervisor.worker.spec import WorkerSpec

_END = object()
REQUEST_REFUSED = "REQUEST_REFUSED"
"""A stage refused the check's request (InvalidRequest): the text or options are wrong, not the stage."""
REQUEST_FLAGS = "--text, --voice, --reference-audio, --reference-transcript, --option"
"""The `stagevisor check` flags that make up its request (commands/request_options.py), as a refusal names them."""


class ContractViolation(Exception):
    """A stage broke the Stage contract; `stage` and `field` say where (e.g. `data["latent"]`).

    `code` is CONTRACT_VIOLATION, REQUEST_REFUSED (a stage refused the check's own request, as the contract lets
    it), or the ErrorCode of a factory that cannot be imported (MODULE_NOT_FOUND, MISSING_DEPENDENCY), whose text
    is then the one serve and plan print. A finding about several stages or the whole model (an extra they need,
    the model's checkpoint) has `stage` None and names them all in `stages`.
    """

    def __init__(
        self,
        stage: str | None,
        field: str,
        message: str,
        *,
        code: str = "CONTRACT_VIOLATION",
        stages: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message if code != "CONTRACT_VIOLATION" else f"stage {stage!r}: {field}: {message}")
        self.stage = stage
        self.stages = stages or ((stage,) if stage is not None else ())
        self.field = field
        self.message = message
        self.code = code

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "stage": self.stage,
            "stages": list(self.stages),
            "field": self.field,
            "message": str(self),
        }


def describe(value: Any, depth: int = 0) -> Any:
    """A small, JSON-friendly picture of a value: keys, types, shapes, sizes (never the contents)."""
    if isinstance(value, dict):
        if depth > 2:
            return f"dict[{len(value)}]"
        return {str(key): describe(item, depth + 1) for key, item in list(value.items())[:20]}
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {list(value.shape)}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} {value.dtype} {list(value.shape)}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"bytes[{len(value)}]"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[{len(value)}]"
    if isinstance(value, str):
        return f"str[{len(value)}]"
    return type(value).__name__


@dataclass
class StageReport:
    name: str
    group: str
    build_seconds: float = 0.0
    process_seconds: float = 0.0
    received: Any = None
    returned: Any = None
    chunks_in: int = 0
    chunks_out: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class EdgeReport:
    src: str
    dst: str
    kind: str
    cross_process: bool
    transport: str
    bytes: int = 0
    handoffs: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CheckReport:
    model: str | None
    stages: dict[str, StageReport] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], EdgeReport] = field(default_factory=dict)
    audio_seconds: float = 0.0
    sample_rate: int | None = None
    violations: list[ContractViolation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "ok": self.ok,
            "audio_seconds": round(self.audio_seconds, 3),
            "sample_rate": self.sample_rate,
            "stages": [s.to_json() for s in self.stages.values()],
            "edges": [e.to_json() for e in self.edges.values()],
            "violations": [v.to_json() for v in self.violations],
        }


class _Context:
    """The StageContext of one stage for the one check request; records and validates what is streamed."""

    def __init__(
        self, checker: "_Checker", stage: PlannedStage, request_id: str, inbox: asyncio.Queue | None, outputs: list[Any]
    ) -> None:
        self._checker = checker
        self._stage = stage
        self._request_id = request_id
        self._inbox = inbox
        self._outputs = outputs

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def cancelled(self) -> bool:
        return False

    async def stream(self, chunk: Any) -> None:
        await self._checker.on_chunk(self._stage, chunk, self._outputs)

    async def chunks(self):
        if self._inbox is None:
            return
        while True:
            item = await self._inbox.get()
            if item is _END:
                return
            self._checker.report.stages[self._stage.name].chunks_in += 1
            yield item


class _Checker:
    def __init__(self, plan: Plan, executors: dict[str, Any], report: CheckReport) -> None:
        self.plan = plan
        self.executors = executors
        self.report = report
        self.codec = Codec()  # no shared memory: sizes are what an inline handoff carries
        self.audio: list[np.ndarray] = []
        self.audio_seconds = 0.0

    def _edge(self, src: str, dst: str, kind: str) -> EdgeReport:
        key = (src, dst, kind)
        if key not in self.report.edges:
            cross = self.plan.group_of(src).name != self.plan.group_of(dst).name
            self.report.edges[key] = EdgeReport(src, dst, kind, cross, "grpc" if cross else "in_process")
        return self.report.edges[key]

    def _crossable(self, stage: str, value: Any, what: str) -> int:
        """Bytes `value` takes on the wire; a ContractViolation naming the field when it cannot cross."""
        try:
            return self.codec.encode(value).ByteSize()
        except CodecError as error:
            text = str(error)
            # The codec's text is "<path>: <what is wrong>"; the path becomes the field, said once.
            path, _, problem = text.partition(": ") if text.startswith("data") else ("data", "", "")
            raise ContractViolation(
                stage, path.replace("data", what, 1), problem or f"cannot cross a process boundary: {text}"
            ) from error

    async def on_chunk(self, stage: PlannedStage, chunk: Any, outputs: list[Any]) -> None:
        self.report.stages[stage.name].chunks_out += 1
        if not stage.stream_to and not stage.next:
            self._check_audio(stage.name, chunk)
            return
        for dst, queue, consumer in outputs:
            edge = self._edge(stage.name, dst, "stream_to")
            edge.bytes += self._crossable(stage.name, chunk, "chunk")
            edge.handoffs += 1
            await _hand_over(queue, chunk, consumer)

    def _check_audio(self, stage: str, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise ContractViolation(stage, "chunk", f"a terminal stage streams dicts, got {type(chunk).__name__}")
        if (
            "sample_rate" not in chunk
            or isinstance(chunk["sample_rate"], bool)
            or not isinstance(chunk["sample_rate"], (int, np.integer))
            or chunk["sample_rate"] <= 0
        ):
            raise ContractViolation(
                stage, 'chunk["sample_rate"]', f"must be a positive int, got {chunk.get('sample_rate')!r}"
            )
        audio = chunk.get("audio")
        if not isinstance(audio, np.ndarray) or audio.dtype != np.float32 or audio.ndim != 1:
            raise ContractViolation(
                stage, 'chunk["audio"]', f"must be a 1-D float32 numpy array, got {describe(audio)}"
            )
        if audio.size and (not np.all(np.isfinite(audio)) or float(np.max(np.abs(audio))) > 1.0):
            raise ContractViolation(
                stage,
                'chunk["audio"]',
                f"samples must be finite and within [-1, 1], got a peak of {float(np.max(np.abs(audio))):g}",
            )
        if self.report.sample_rate not in (None, int(chunk["sample_rate"])):
            raise ContractViolation(stage, 'chunk["sample_rate"]', "changed within one request")
        self.report.sample_rate = int(chunk["sample_rate"])
        self.audio.append(audio)
        self.audio_seconds += audio.size / self.report.sample_rate
        limit = RequestLimits.max_audio_seconds
        if self.audio_seconds > limit:  # a stage that streams forever would hold the check, and its memory
            raise ContractViolation(
                stage,
                "chunk",
                f"streamed more than {limit:g} s of audio for one request, which serve ends with "
                "RESOURCE_EXHAUSTED (--max-audio-seconds); does the stage stop streaming?",
            )

    async def run(self, stage: PlannedStage, payload: StagePayload, inbox: asyncio.Queue | None = None) -> None:
        report = self.report.stages[stage.name]
        executor = self.executors[stage.name]
        queues: dict[str, asyncio.Queue[Any]] = {dst: asyncio.Queue(maxsize=8) for dst in stage.stream_to}
        downstream = {dst: StagePayload(payload.request_id, payload.request, {}) for dst in stage.stream_to}
        tasks = [asyncio.create_task(self.run(self.plan.stage(dst), downstream[dst], queues[dst])) for dst in queues]
        streams = [(dst, queues[dst], task) for dst, task in zip(queues, tasks, strict=True)]
        report.received = describe(payload.data)
        started = time.perf_counter()
        try:
            returned = await executor.process(payload, _Context(self, stage, payload.request_id, inbox, streams))
        except BaseException as error:
            for task in tasks:
                task.cancel()
            if isinstance(error, InvalidRequest):  # the contract's way to refuse a request: the request is wrong
                raise ContractViolation(
                    stage.name,
                    "request",
                    f"stage {stage.name!r} refused the check's request: {error}; the stage kept the contract: "
                    f"change the request ({REQUEST_FLAGS})",
                    code=REQUEST_REFUSED,
                ) from error
            # SystemExit too: sys.exit(0) in a stage ended `check` with status 0, a pass in the operator's CI.
            if isinstance(error, (Exception, SystemExit)) and not isinstance(error, ContractViolation):
                raise ContractViolation(stage.name, "process", f"raised {type(error).__name__}: {error}") from error
            raise
        report.process_seconds += time.perf_counter() - started
        if returned is not None and not isinstance(returned, dict):
            raise ContractViolation(
                stage.name, "return value", f"process() must return a dict or None, got {type(returned).__name__}"
            )
        data = returned or {}
        report.returned = describe(data)
        for dst in stage.next:
            edge = self._edge(stage.name, dst, "next")
            edge.bytes += self._crossable(stage.name, data, "data")
            edge.handoffs += 1
        for dst, queue, consumer in streams:
            downstream[dst].data.update(data)
            await _hand_over(queue, _END, consumer)
        await asyncio.gather(*tasks)
        for dst in stage.next:
            if dst not in stage.stream_to:
                await self.run(self.plan.stage(dst), StagePayload(payload.request_id, payload.request, dict(data)))


async def _hand_over(queue: asyncio.Queue[Any], item: Any, consumer: asyncio.Task[None]) -> None:
    """Put `item` for a stream_to stage, unless that stage has ended: then raise its violation, or drop
    the item as the runtime drops chunks a target that returned never read (waiting would hang the check)."""
    if consumer.done():
        consumer.result()
        return
    put = asyncio.ensure_future(queue.put(item))
    await asyncio.wait((put, consumer), return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        consumer.result()


def missing_factory_attribute(factory: str) -> str | None:
    """A plain sentence when `module:attr`'s module imports but lacks the attribute; None otherwise.

    An import that fails is left to the build, which reports it with its traceback.
    """
    import difflib
    import importlib

    module_name, _, attr = factory.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - reported by the build itself
        return None
    owner = f"module {module_name}"
    for part in attr.split("."):
        if not hasattr(target, part):
            names = sorted(n for n in vars(target) if not n.startswith("_") and callable(getattr(target, n, None)))
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (f"; it has {', '.join(names[:8])}" if names else "")
            return f"{factory!r}: {owner} has no attribute {part!r}{hint}"
        target = getattr(target, part)
        owner = f"{module_name}:{attr[: attr.index(part) + len(part)]}"
    return None


async def build_executors(plan: Plan, report: CheckReport) -> dict[str, Any]:
    """Build every stage with the worker's factory call; ContractViolation for a malformed executor."""
    from stagevisor.supervisor.worker.build import ExecutorContractError, build_stage, check_executor

    executors = {}
    for stage in plan.stages:
        group = plan.group_of(stage.name)
        spec = WorkerSpec(group=group, stages=(stage,), model_path=plan.model_path, address="")
        started = time.perf_counter()
        problem = missing_factory_attribute(stage.factory) if stage.factory else None
        if problem is not None:
            raise ContractViolation(stage.name, "factory", problem)
        try:
            executor = await build_stage(stage, spec)
        except (Exception, SystemExit) as error:  # sys.exit() in a factory: a violation, never a silent exit 0
            unimportable = import_failure(stage.name, stage.factory or "", error, sys.path)
            if unimportable is not None:
                code = unimportable.code.value
                raise ContractViolation(stage.name, "factory", unimportable.message(), code=code) from error
            raise ContractViolation(
                stage.name, "factory", f"{stage.factory!r} failed to build: {type(error).__name__}: {error}"
            ) from error
        report.stages[stage.name] = StageReport(stage.name, group.name, time.perf_counter() - started)
        try:
            check_executor(stage, executor)
        except ExecutorContractError as error:
            raise ContractViolation(stage.name, error.field, str(error)) from error
        executors[stage.name] = executor
    return executors


async def check_pipeline(plan: Plan, request: dict[str, Any]) -> CheckReport:
    """Build every stage and run `request` end to end; violations are collected in the report."""
    report = CheckReport(plan.model)
    try:
        executors = await build_executors(plan, report)
        checker = _Checker(plan, executors, report)
        await checker.run(plan.stages[0], StagePayload("check-1", request, {}))
        samples = sum(len(a) for a in checker.audio)
        if not samples:
            raise ContractViolation(plan.stages[-1].name, "chunk", "the pipeline streamed no audio to the client")
        report.audio_seconds = samples / (report.sample_rate or 1)
    except ContractViolation as violation:
        report.violations.append(violation)
    return report
