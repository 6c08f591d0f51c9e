"""StageCalls: runs a stage for one request in a task, and then, in the same task, its chain of direct calls.

In-process edges are direct calls: the receiving stage gets the very objects
the sender returned (the `data` dict itself for a `next` edge); nothing is
encoded or copied, and a local `next` stage runs as a plain awaited call in
the sender's task. A stage's failure fails only its request.

With a Recorder (metrics on), a direct call costs nothing extra: the Recorder
derives the calls and handoffs of direct calls when it reports, from one count
per chain of calls and the chains live at that moment (`running_calls`); it
times the stage calls of the chains it picks, and of requests whose timings
someone reads, whose process() calls are also Spans in the trace (see
supervisor/metrics/recorder.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from stagevisor.stages.base import InvalidRequest, StageError, StagePayload, is_error_code, is_field_name
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.invocation import Invocation, Streams, cancelled_from_outside
from stagevisor.supervisor.dataplane.request_state import Fail, RequestState
from stagevisor.supervisor.dataplane.routing import Routing
from stagevisor.supervisor.dataplane.streams import ChunkQueue
from stagevisor.supervisor.dataplane.trace import Trace, sent_at
from stagevisor.supervisor.errors import clipped
from stagevisor.supervisor.metrics.recorder import EdgeStats, Recorder

# The runtime's logger: stage failures keep the logger name they were always logged under.
log = logging.getLogger("stagevisor.supervisor.dataplane.runtime")

_now = time.monotonic


def _error_text(error: BaseException) -> str:
    """An executor's exception as text for a Failure: clipped to one readable line's length, and empty when its
    __str__ raises (a stage's own exception class), so that failing the request cannot fail in turn."""
    try:
        return clipped(str(error))
    except Exception:  # noqa: BLE001 - whatever a broken __str__ raises
        return ""


def _error_code(error: StageError) -> str:
    """A StageError's `code` for a Failure, or "": a subclass may set the attribute after StageError checked it,
    or never call StageError.__init__, so it is checked again."""
    code: object = error.code
    return code if is_error_code(code) else ""


def _error_field(error: StageError) -> str:
    """A StageError's `field` for a Failure, or "": checked again, as its code is (`_error_code`)."""
    field: object = getattr(error, "field", None)
    return field if is_field_name(field) else ""


SendOutputs = Callable[[Invocation, Routing, "dict[str, Any]", float, bool], Awaitable[None]]
"""emit.Emitter.send_outputs: (invocation, its stage's routing, the data it returned, when it returned, spans)."""
TaskDone = Callable[[RequestState, "asyncio.Task[None]", "ChunkQueue | None"], None]
"""request_state.RequestTable.task_done."""


class StageCalls:
    """Starts and runs the stage calls of requests: one task per call that a frame, fan-out or stream starts."""

    def __init__(
        self,
        plan: Mapping[str, tuple[Any, Routing]],
        in_process_edges: Mapping[str, EdgeStats],
        recorder: Recorder | None,
        streams: Streams,
        send_outputs: SendOutputs,
        fail: Fail,
        task_done: TaskDone,
    ) -> None:
        self._plan = plan
        self._in_process_edges = in_process_edges
        self.recorder = recorder
        self._streams = streams
        self._send_outputs = send_outputs
        self._fail = fail
        self._task_done = task_done
        self._live: set[Invocation] = set()
        """Invocations inside run now (metrics on): a report counts their current stages as running."""

    def start(
        self, state: RequestState, stage: str, payload: StagePayload, trace: Trace, inbound: ChunkQueue | None = None
    ) -> None:
        """Run `stage` for the request in a task of its own."""
        self.start_invocation(Invocation(self._streams, state, stage, payload, trace, inbound))

    def start_invocation(self, inv: Invocation) -> None:
        state = inv.state
        task = asyncio.get_running_loop().create_task(self.run(inv), name=f"{inv.stage}:{state.request_id}")
        state.tasks.add(task)
        inbound = inv.inbound  # read now: the invocation is reused for later local stages
        task.add_done_callback(lambda t: self._task_done(state, t, inbound))

    async def run(self, inv: Invocation) -> None:
        """Run a stage for one request, route its outputs, then run the local `next` stage, if any.

        A loop rather than a call per stage: a local `next` stage runs in this
        very task as a plain awaited call, with no task or coroutine created
        for the handoff (the hot path of in-process edges, kept flat on purpose).
        With metrics on, a hop does no metric work unless this chain is timed:
        the Recorder derives its counts when it reports (recorder.py).
        """
        plan = self._plan
        rec = self.recorder
        timed = spans = False
        ended = 0.0  # when the previous stage returned, if nothing ran since (0: read the clock)
        executor, routing = plan[inv.stage]
        payload = inv.payload
        request_id, request = payload.request_id, payload.request  # the same for every stage of the chain
        # A direct hop sets the invocation's Run of direct hops to the next one, prebuilt (trace.Run), and
        # allocates nothing for the trace: `chain` is the runs from the stage whose trace is the
        # invocation's base, `taken` the direct hops made since.
        chain, taken = routing.runs, 0
        if rec is not None:
            # Spans go into the trace only for requests whose timings someone reads
            # (`stagevisor synthesize --timings`, OTLP export); those are always timed.
            spans = request.get("timings") is True
            stats = routing.stats
            stats.starts = starts = stats.starts + 1
            timed = spans or (starts >= stats.next_timed and rec.timing(stats))
            self._live.add(inv)
            trace = inv.trace
            # Only a handoff inside this worker that started a task (fan-out, stream) is accounted on
            # arrival; a chain that a peer's frame started needs nothing here unless it is timed.
            if timed or trace is not None and (trace[1].__class__ is list or trace[1] in self._in_process_edges):
                arrived = self._arrived(trace, timed)
                if timed:
                    ended = arrived  # the first stage starts now
        try:
            while True:
                if timed:
                    started = ended or _now()  # a direct call starts as the previous stage returns
                    if spans:
                        span = [inv.stage, started, 0.0]  # a Span
                        inv.trace = (inv.trace, span)
                        chain, taken = routing.runs, 0
                try:
                    try:
                        result = await executor.process(payload, inv)
                    finally:
                        if timed:
                            ended = _now()
                            if spans:
                                span[2] = ended
                            routing.stats.durations.append(ended - started)
                    data = result
                    if data.__class__ is not dict:  # one check on the hot path; None and dict subclasses below
                        if data is None:
                            data = {}
                        elif not isinstance(data, dict):
                            raise TypeError(f"process() returned {type(data).__qualname__}; expected a dict or None")
                    if routing.sends:
                        await self._send_outputs(inv, routing, data, ended, spans)
                        ended = 0.0  # sending took time: the next stage reads the clock
                except asyncio.CancelledError:
                    if inv.state.cancelled or cancelled_from_outside():
                        if rec is not None:
                            routing.stats.cancelled += 1
                        raise
                    # The executor raised it itself (a helper task it cancelled, a library's timeout):
                    # nothing else would end the request, which would hang until --pipeline-idle-timeout.
                    log.warning("stage %r failed request %s", inv.stage, inv.request_id, exc_info=True)
                    if rec is not None:
                        routing.stats.failures += 1
                    self._fail(
                        inv.state,
                        inv.stage,
                        pb.FAILURE_CODE_INTERNAL,
                        f"stage '{inv.stage}' failed: CancelledError",
                        error_type="CancelledError",
                    )
                    return
                except InvalidRequest as error:
                    if rec is not None:
                        routing.stats.failures += 1
                    text = _error_text(error)
                    self._fail(
                        inv.state,
                        inv.stage,
                        pb.FAILURE_CODE_INVALID_ARGUMENT,
                        text,
                        client_message=text,
                        client_code=_error_code(error),
                        client_field=_error_field(error),
                    )
                    return
                except StageError as error:  # its text is written for the client (stages/README.md)
                    text = _error_text(error)
                    log.warning("stage %r failed request %s: %s", inv.stage, inv.request_id, text)
                    if rec is not None:
                        routing.stats.failures += 1
                    self._fail(
                        inv.state,
                        inv.stage,
                        pb.FAILURE_CODE_INTERNAL,
                        f"stage '{inv.stage}' failed: {text or type(error).__name__}",
                        client_message=text,
                        client_code=_error_code(error),
                        client_field=_error_field(error),
                    )
                    return
                except (KeyboardInterrupt, SystemExit) as error:
                    # They end the worker, as they end any asyncio program: crash recovery restarts it and its
                    # requests fail UNAVAILABLE. multiprocessing prints nothing for a SystemExit (sys.exit() in a
                    # library), so without this line the operator saw only `exited unexpectedly (exit code 0)`.
                    log.error(
                        "stage %r raised %s in request %s; the worker exits",
                        inv.stage,
                        type(error).__name__,
                        inv.request_id,
                        exc_info=isinstance(error, SystemExit),  # multiprocessing prints a KeyboardInterrupt's
                    )
                    raise
                except BaseException as error:  # noqa: BLE001 - any executor failure ends only this request
                    # BaseException: a GeneratorExit or a library's own BaseException subclass that got out of
                    # process() would otherwise end the task with no failure, the client waiting for a timeout.
                    log.warning("stage %r failed request %s", inv.stage, inv.request_id, exc_info=True)
                    if rec is not None:
                        routing.stats.failures += 1
                    detail = _error_text(error) or type(error).__name__
                    self._fail(
                        inv.state,
                        inv.stage,
                        pb.FAILURE_CODE_INTERNAL,
                        f"stage '{inv.stage}' failed: {detail}",
                        error_type=type(error).__name__,
                    )
                    return
                direct = routing.direct
                if direct is None:
                    return
                if routing.local_tasks:  # fan-out: all local stages but one run as tasks
                    for dst, in_process_hop in routing.local_tasks:
                        self.start_invocation(
                            Invocation(
                                self._streams,
                                inv.state,
                                dst,
                                StagePayload(request_id, request, data),
                                (inv.trace, in_process_hop),
                            )
                        )
                # The direct call: the same request and data objects, nothing copied. The
                # finished stage's context is reused for the next stage (a context is only
                # valid inside process(), see stages/base.py), so a hop allocates one payload.
                inv.stage, executor, routing = direct
                inv.payload = payload = StagePayload(request_id, request, data)
                inv.run = chain[taken]
                taken += 1
                inv.inbound = None
        finally:
            if rec is not None:
                self._live.discard(inv)

    def running_calls(self) -> dict[str, int]:
        """Stage -> calls running now (in process() or handing on its outputs), for the Recorder's reports."""
        running: dict[str, int] = {}
        for inv in self._live:
            running[inv.stage] = running.get(inv.stage, 0) + 1
        return running

    def _arrived(self, trace: Trace, timed: bool) -> float:
        """Account the in-process handoff that started this task (fan-out or stream); close a stream hop.

        Returns the time this task started when the clock was read (always for a timed chain), else 0.
        """
        now = _now() if timed else 0.0
        if trace is None:
            return now
        last = trace[1]
        if last.__class__ is list:  # a stream hop's Span: it ends as its receiver starts
            now = now or _now()
            if not last[2]:
                last[2] = now
            name = last[0]
        else:
            name = last
        edge = self._in_process_edges.get(name)
        if edge is not None:
            edge.handoffs += 1
            sent = sent_at(trace)
            if sent:
                now = now or _now()
                edge.latencies.append(now - sent)
        return now
