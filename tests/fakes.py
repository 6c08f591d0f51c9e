"""Test doubles shared by the suite: a clock, a launcher and its workers, a replica gateway and host, the daemon the
HTTP API reads, a gateway and the requests it hands back (`ScriptedGateway`, `ScriptedHandle`), data-plane links that
record what is sent on them, a client's backlog of unread bytes (`FakeBacklog`), a gRPC servicer context, bounded
waits, and what a client reads from a request (`outcome`).

Tests import these instead of redefining them per file (supervisord keeps its
`Dummy*` fakes in one `tests/base.py` for the same reason). Nothing here
starts a process or opens a socket.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import grpc
import numpy as np

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.daemon.specs import worker_specs
from stagevisor.supervisor.daemon.handle import Handshake
from stagevisor.supervisor.daemon.lifecycle import BackoffPolicy, LifecycleEvent
from stagevisor.supervisor.daemon.replicas import ReplicaSets
from stagevisor.supervisor.daemon.runner import WorkerRunner, RunnerHooks
from stagevisor.supervisor.dataplane.admission import Admission
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.errors import RequestFailed, WorkerStartError
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import GroupStatus, StatusReport, TopologyReport
from stagevisor.supervisor.worker.spec import WorkerSpec


class FakeClock:
    """A clock that moves only when the test says so: `clock()` reads it, `clock.advance(s)` moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class FakeBacklog:
    """A client's backlog as a waiting write reads it (`limits.Backlog`): `readings` in turn, then the last one
    for ever (the client stopped reading). `taken` counts the readings made."""

    def __init__(self, *readings: int | None) -> None:
        self.readings = list(readings)
        self.taken = 0

    def __call__(self) -> int | None:
        self.taken += 1
        return self.readings[min(self.taken, len(self.readings)) - 1]

    @classmethod
    def falling(cls, steps: int, start: int = 1_000_000, step: int = 1000) -> "FakeBacklog":
        """A client that takes `step` bytes between any two readings, `steps` times."""
        return cls(*range(start, start - step * (steps + 1), -step))


class CountingBufferSource:
    """A BufferSource (dataplane/codec.py) standing in for an InboundLink: counts the Releases of each pooled buffer.

    It holds no inline pieces: taking one is a test error.
    """

    def __init__(self) -> None:
        self.releases: Counter[str] = Counter()

    def release(self, name: str) -> None:
        self.releases[name] += 1

    def take_inline(self, buffer_id: str, size: int) -> bytearray:
        raise AssertionError(f"no inline buffer {buffer_id!r} in this test")

    def discard_inline(self, buffer_id: str) -> None:
        pass


class FakeWorker:
    """A WorkerHandle (daemon/handle.py) whose handshake and exit the test controls.

    `outcome` decides the handshake: "ready" answers it, "fail" exits 1 and
    raises WorkerStartError, "hang" never answers (WorkerStartError once it exits), "held" answers once the
    test calls `answer()`, "ignore-term" answers but survives SIGTERM (only SIGKILL ends it).
    """

    def __init__(self, pid: int, outcome: str = "ready") -> None:
        self.pid = pid
        self.outcome = outcome
        self.exited: asyncio.Future = asyncio.get_running_loop().create_future()
        self.wedged: asyncio.Future = asyncio.get_running_loop().create_future()
        self.signals: list[str] = []
        self.closed = False
        self.answered = asyncio.Event()
        self.quiet = asyncio.Event()
        self.beats = asyncio.Event()

    def answer(self) -> None:
        """A "held" worker answers its handshake now."""
        self.answered.set()

    async def handshake(self, timeout: float) -> Handshake:
        if self.outcome == "fail":
            self.exit(1)
            raise WorkerStartError("g", "stage 'x' failed to build: boom", stage="x", traceback="Traceback ...")
        if self.outcome == "hang":  # never answers; its handshake pipe ends when it exits, as a real one's does
            await asyncio.shield(self.exited)
            raise WorkerStartError("g", "the worker exited before its handshake")
        if self.outcome == "held":
            await self.answered.wait()
        return Handshake(self.pid, fraction_enforced=False)

    async def wait_exit(self) -> int:
        return await asyncio.shield(self.exited)

    async def unresponsive(self) -> str:
        # Shielded, as wait_exit: a cancelled waiter (the runner's watch, as a stop begins) must not cancel the
        # worker's own state, which would end every later wait on it at once, as if it had stopped answering.
        await asyncio.shield(self.wedged)
        return f"worker pid {self.pid} did not answer its heartbeat for 5s"

    async def silent(self) -> str:
        while not self.quiet.is_set():
            await self.quiet.wait()
        return f"worker pid {self.pid} sent no heartbeat for 3s"

    async def beating(self) -> None:
        while self.quiet.is_set():
            await self.beats.wait()

    def wedge(self) -> None:
        """The worker's event loop stops answering (a stage blocked it, or SIGSTOP)."""
        if not self.wedged.done():
            self.wedged.set_result(None)

    def fall_silent(self) -> None:
        """The worker misses heartbeats (handle.SILENT_BEATS), short of its heartbeat timeout."""
        self.beats.clear()
        self.quiet.set()

    def beat(self) -> None:
        """A silent worker beats again."""
        self.quiet.clear()
        self.beats.set()

    def exitcode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    def exit(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    def terminate(self) -> None:
        self.signals.append("TERM")
        if self.outcome != "ignore-term":
            self.exit(-15)

    def kill(self) -> None:
        self.signals.append("KILL")
        self.exit(-9)

    def close(self) -> None:
        self.closed = True


class FakeLauncher:
    """Hands out FakeWorkers with pids 100, 101, ...; each takes the next outcome from the list ("ready" after)."""

    def __init__(self, outcomes: list[str] | None = None) -> None:
        self.outcomes = list(outcomes or [])
        self.workers: list[FakeWorker] = []
        self.names: dict[int, str] = {}
        """Pid -> the name its spec gave the worker when it started (what a real worker answers frames with)."""
        self.prepared = self.closed = False
        self.adopted: list[list[str]] = []
        """The worker names of each `adopt` (a scale or an apply), in order."""

    def start(self, spec: Any) -> FakeWorker:
        outcome = self.outcomes.pop(0) if self.outcomes else "ready"
        worker = FakeWorker(100 + len(self.workers), outcome)
        self.workers.append(worker)
        self.names[worker.pid] = spec.name
        return worker

    async def prepare(self) -> None:
        self.prepared = True

    def adopt(self, specs: Any) -> None:
        self.adopted.append(list(specs))

    async def close(self) -> None:
        self.closed = True

    def factory(self, *made_with: Any) -> "FakeLauncher":
        """Stands for a LauncherFactory (`Daemon(..., launcher=fake.factory)`): hands out this launcher."""
        return self


class RunnerRecorder:
    """Records what a WorkerRunner reports (events, failures, lost and silent workers) and the backoff delays it
    sleeps."""

    def __init__(self) -> None:
        self.events: list = []
        self.failures: list = []
        self.lost: list[tuple[str, str]] = []
        self.sleeps: list[float] = []
        self.silences: list[tuple[str, str]] = []
        """(worker, why it is silent, "" once it beats again), as `on_silence` reported them."""

    def hooks(self) -> RunnerHooks:
        return RunnerHooks(
            on_event=self.events.append,
            on_failure=self.failures.append,
            on_worker_lost=lambda worker, reason: self.lost.append((worker, reason)),
            on_silence=lambda worker, reason: self.silences.append((worker, reason)),
        )

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)

    def states(self) -> list[tuple[str, str]]:
        return [(e.old_state.value, e.new_state.value) for e in self.events]


def audio_chunk(samples: int, rate: int = 24000, value: float = 0.25) -> dict[str, Any]:
    """A terminal stage's chunk of `samples` float32 samples, all `value`, at `rate` Hz."""
    return {"audio": np.full(samples, value, dtype=np.float32), "sample_rate": rate}


class ScriptedHandle:
    """An admitted request, as a gateway hands it back: its chunks, then a failure (`error`), or, with `then_wait`,
    nothing more until it is cancelled. It counts its closes; `timings` is what its terminal stages reported."""

    def __init__(
        self,
        chunks: Any = (),
        error: Exception | None = None,
        request_id: str = "req-1",
        then_wait: bool = False,
    ) -> None:
        self.request_id = request_id
        self.chunks = list(chunks)
        self.error = error
        self.then_wait = then_wait
        self.timings: list[tuple[str, float, float]] = []
        self.closed = 0

    async def __aiter__(self) -> Any:
        for item in self.chunks:
            yield item
        if self.error is not None:
            raise self.error
        if self.then_wait:
            await asyncio.Event().wait()

    def close(self) -> None:
        self.closed += 1


class ScriptedGateway:
    """A gateway for the speech paths (gRPC Synthesize, HTTP): `submit` hands back `handle`, or raises `refusal` (an
    admission's or a pipeline's); it keeps every payload submitted."""

    admission = Admission()
    limits = RequestLimits()
    metrics: Any = None
    max_text_chars = DEFAULT_MAX_TEXT_CHARS

    def __init__(self, handle: ScriptedHandle | None = None, refusal: Exception | None = None) -> None:
        self.handle = handle
        self.refusal = refusal
        self.payloads: list[dict[str, Any]] = []
        self.stage_groups: dict[str, str] = {}

    async def submit(self, payload: dict[str, Any]) -> ScriptedHandle:
        self.payloads.append(payload)
        if self.refusal is not None:
            raise self.refusal
        assert self.handle is not None, "a ScriptedGateway without a handle or a refusal"
        return self.handle


class RecordedLink:
    """One peer's link, as a LinkPool hands it out (the same object for an address): it keeps the frames sent on it
    and counts the credits returned on it. `peer` names the other side in log lines, as a link's does."""

    def __init__(self, address: str = "") -> None:
        self.address = address
        self.peer = address
        self.frames: list[pb.Frame] = []
        self.credits = 0
        self.broken = False
        self.left: frozenset[str] = frozenset()
        """What an OutboundLink keeps of its peer's Leaving frame: the requests that no longer depend on it."""

    def send(self, frame: pb.Frame, out: Any = None) -> None:
        self.frames.append(frame)

    async def send_async(self, frame: pb.Frame, out: Any = None) -> None:
        self.frames.append(frame)

    def credit(self, stream: Any) -> None:
        self.credits += 1


class RecordedLinks:
    """Stands in for a LinkPool (the gateway's or a worker runtime's): a RecordedLink per address; sending to
    `refuse` fails as an unreachable peer does."""

    def __init__(self, refuse: str = "") -> None:
        self.links: dict[str, RecordedLink] = {}
        self.refuse = refuse
        self.closed = False

    def get(self, address: str) -> RecordedLink:
        return self.links.setdefault(address, RecordedLink(address))

    def send(self, address: str, frame: pb.Frame, out: Any = None) -> None:
        if self.refuse and address == self.refuse:
            raise OSError(f"cannot reach {address}")
        self.get(address).send(frame)

    def send_if_linked(self, address: str, frame: pb.Frame) -> bool:
        if address not in self.links:
            return False
        self.links[address].send(frame)
        return True

    @property
    def sent(self) -> dict[str, list[pb.Frame]]:
        """The frames sent so far, by address (each list is its link's own, so it grows with later sends)."""
        return {address: link.frames for address, link in self.links.items()}

    def bodies(self, address: str) -> list[str]:
        """The kind of each frame sent to `address` (`submit`, `chunk`, `done`, ...), in order."""
        return [f.WhichOneof("body") for f in self.links[address].frames] if address in self.links else []

    async def close(self) -> None:
        self.closed = True


class FakeInboundLink:
    """The link a frame came in on, as a worker runtime sees it: its replies (credits, releases) are kept."""

    tcp = False

    def __init__(self, peer: str = "test-peer") -> None:
        self.peer = peer
        self.replies: list[pb.Frame] = []

    def reply(self, frame: pb.Frame) -> None:
        self.replies.append(frame)

    async def flush(self, timeout: float) -> bool:
        return True

    def credit(self, stream: tuple[str, str, str], chunks: int = 1) -> None:
        request_id, src, dst = stream
        self.reply(pb.Frame(request_id=request_id, src=src, dst=dst, credit=pb.Credit(chunks=chunks)))

    def release(self, name: str) -> None:
        self.replies.append(pb.Frame(release=pb.Release(names=[name])))

    def take_inline(self, buffer_id: int, size: int) -> Any:
        raise AssertionError("no inline buffers in these tests")

    def discard_inline(self, buffer_id: int) -> None:
        pass


class Aborted(grpc.aio.AbortError):
    """What grpc.aio's `context.abort` raises: the status is set, the handler unwinds."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        super().__init__(details)
        self.code, self.details, self.trailing_metadata = code, details, dict(trailing_metadata)


class FakeServicerContext:
    """A grpc.aio servicer context: it keeps what a handler writes, `abort` raises `Aborted` as grpc.aio's does,
    and `end()` runs the done callbacks, as gRPC does when the call ends (the client went away)."""

    def __init__(self) -> None:
        self.written: list[Any] = []
        self.done_callbacks: list[Callable[[Any], None]] = []

    def invocation_metadata(self) -> tuple:
        return ()

    async def send_initial_metadata(self, metadata: Any) -> None:
        return None

    async def write(self, message: Any) -> None:
        self.written.append(message)

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        raise Aborted(code, details, trailing_metadata)

    def cancelled(self) -> bool:
        return False

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.done_callbacks.append(callback)

    def end(self) -> None:
        for callback in self.done_callbacks:
            callback(self)


class LeavingClient:
    """An HTTP client, as an ASGI server shows it, that goes away during its response: `gone` "start" fails the
    response start, "body" its first body write; "stalled" leaves its first body write pending (it reads
    nothing), then disconnects."""

    def __init__(self, gone: str) -> None:
        self.gone = gone
        self._writing = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        body = message["type"] == "http.response.body"
        if self.gone == "start" or (self.gone == "body" and body):
            raise OSError("the client is gone")
        if body:
            self._writing.set()
            await asyncio.Event().wait()  # the client reads nothing: the write never leaves

    async def receive(self) -> dict[str, Any]:
        await self._writing.wait()
        return {"type": "http.disconnect"}  # ...then it leaves


async def settle(predicate: Callable[[], Any], limit: int = 1000) -> None:
    """Yield to the event loop until `predicate()` holds; fail after `limit` turns (no wall clock involved)."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never reached")


async def poll_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005) -> Any:
    """Poll `predicate` on the running loop until it is truthy or `timeout` passes; return its last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := predicate()) and loop.time() < deadline:
        await asyncio.sleep(interval)
    return value


async def outcome(handle: Any) -> list | RequestFailed:
    """What a client reading a request's handle (RequestHandle) gets: its chunks if it ended well, else its failure."""
    try:
        return [chunk async for chunk in handle]
    except RequestFailed as error:
        return error


class FakeReplicaGateway:
    """The gateway's side of replica routing (dataplane/gateway.py), recorded in call order.

    `push_replicas` returns a new version per announcement; `wait_replicas`
    answers with `unacknowledged` once `acks` is set (set from the start: clear
    it to hold every acknowledgement until the test sets it again);
    `replica_in_flight` reads `in_flight`, which the test changes.
    """

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        """("push", version, sets, lost), ("wait", version, timeout), ("acked", version), ("in_flight", address)."""
        self.version = 0
        self.acks = asyncio.Event()
        self.acks.set()
        self.unacknowledged: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.told: list[dict[str, str]] = []
        """The workers (name -> address) each announcement went to, in order."""
        self.names: list[dict[str, str]] = []
        """Each announcement's worker names now, by the name each started under, in order."""
        self.text_limits: dict[str, int | None] = {}
        self.requests: set[str] = set()
        """The requests in flight (`request_ids`), which the test changes."""

    def push_replicas(
        self,
        sets: dict[str, tuple[str, ...]],
        lost: tuple[str, ...],
        workers: dict[str, str],
        names: dict[str, str] | None = None,
    ) -> int:
        self.version += 1
        self.calls.append(("push", self.version, dict(sets), tuple(lost)))
        self.told.append(dict(workers))
        self.names.append(dict(names or {}))
        return self.version

    async def wait_replicas(self, version: int, workers: dict[str, str], timeout: float) -> list[str]:
        self.calls.append(("wait", version, timeout))
        await self.acks.wait()
        self.calls.append(("acked", version))
        return list(self.unacknowledged)

    def replica_in_flight(self, replica: str) -> int:
        self.calls.append(("in_flight", replica))
        return self.in_flight.get(replica, 0)

    def request_ids(self) -> frozenset[str]:
        return frozenset(self.requests)

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        self.text_limits[group] = max_text_chars

    def pushes(self) -> list[tuple[dict[str, tuple[str, ...]], tuple[str, ...]]]:
        """Every announcement so far: (group address -> replicas taking requests, lost replicas)."""
        return [(call[2], call[3]) for call in self.calls if call[0] == "push"]

    def kinds(self) -> list[str]:
        """The calls' kinds in order, repeated in-flight reads folded into one."""
        kinds = [call[0] for call in self.calls]
        return [k for i, k in enumerate(kinds) if not (k == "in_flight" and i and kinds[i - 1] == "in_flight")]


class FakeReplicaHost:
    """A daemon as ReplicaSets sees it (daemon/replicas.py's ReplicaHost), wired as daemon/core.py wires its own.

    Real WorkerRunners on a FakeLauncher, a FakeReplicaGateway, and the
    ReplicaSets under test as `replicas`: lifecycle events go to its
    `on_event`, a replica's lost worker to its `on_lost`. Nothing is
    created on disk (the run directory is only a name in the specs).
    """

    def __init__(self, plan: Plan, *, drain_timeout: float = 30.0, launcher: FakeLauncher | None = None) -> None:
        self.plan = plan
        self.drain_timeout = drain_timeout
        self.gateway = FakeReplicaGateway()
        self.launcher = launcher or FakeLauncher()
        self.events: list[LifecycleEvent] = []
        self.adopted: list[Plan] = []
        self.runners: dict[str, WorkerRunner] = {}
        self.alternate: frozenset[str] = frozenset()
        self.retired: list[tuple[WorkerRunner, str]] = []
        """Runners left outside the topology, with the outcome watchers were told."""
        self.warned: list[str] = []
        """The outcomes of those told as a WARNING."""
        self.replicas = ReplicaSets(self)
        for spec in self.specs_for(plan).values():
            self.add_runner(spec)

    def specs_for(self, plan: Plan, alternate: frozenset[str] | None = None) -> dict[str, WorkerSpec]:
        specs, _ = worker_specs(
            plan,
            Path("/run/sv"),
            parent_pid=1,
            log_level="INFO",
            environ={},
            drain_timeout=self.drain_timeout,
            alternate=self.alternate if alternate is None else alternate,
        )
        return specs

    def beside_runner(self, name: str) -> WorkerRunner:
        return self._runner(self.specs_for(self.plan, self.alternate ^ {name})[name])

    def swap_runner(self, old: WorkerRunner, new: WorkerRunner) -> None:
        new.follow(old)  # as restarts.py's: the count goes on from the old worker's as the new one takes over
        self.runners[old.name] = new
        self.alternate ^= {old.name}
        old.hooks = RunnerHooks(
            on_event=lambda event: None,
            on_failure=lambda failure: None,
            on_worker_lost=lambda _worker, _reason: self.replicas.on_lost(old),
            not_restarted=lambda: "replaced",  # as restarts.py's: dying while it drains, it ends STOPPED
        )

    def retire_runner(self, runner: WorkerRunner, outcome: str, *, warning: bool = False) -> None:
        self.retired.append((runner, outcome))
        if warning:
            self.warned.append(outcome)

    def add_runner(self, spec: WorkerSpec) -> WorkerRunner:
        runner = self.runners[spec.name] = self._runner(spec)
        return runner

    def _runner(self, spec: WorkerSpec) -> WorkerRunner:
        async def no_backoff(delay: float) -> None:
            pass

        hooks = RunnerHooks(on_event=self._on_event, on_failure=lambda failure: None, on_worker_lost=self._on_lost)
        policy = BackoffPolicy(max_restarts=3, initial=0.5, max_delay=4.0)
        return WorkerRunner(
            spec, self.launcher, policy, hooks, start_timeout=5.0, stop_timeout=1.0, clock=FakeClock(), sleep=no_backoff
        )

    def remove_runner(self, name: str) -> None:
        self.runners.pop(name, None)

    def rename_runner(self, name: str, spec: WorkerSpec) -> None:
        runner = self.runners.pop(name)
        runner.rename(spec)
        self.runners[spec.name] = runner

    def adopt_plan(self, plan: Plan, specs: dict[str, WorkerSpec]) -> None:
        self.plan = plan
        self.adopted.append(plan)
        ordered = {name: self.runners[name] for name in specs if name in self.runners}
        self.runners.clear()
        self.runners.update(ordered)

    def _on_event(self, event: LifecycleEvent) -> None:
        self.events.append(event)
        self.replicas.on_event(event)

    def _on_lost(self, name: str, reason: str) -> None:
        runner = self.runners.get(name)
        if runner is not None and (self.replicas.is_replica(runner) or self.replicas.beside_old(runner)):
            self.replicas.on_lost(runner)

    async def start(self) -> None:
        """Every worker spawned and READY, as the daemon's start leaves them."""
        for runner in self.runners.values():
            runner.spawn(reason="test")
        await asyncio.gather(*(r.await_ready() for r in self.runners.values()))

    async def stop(self) -> None:
        await asyncio.gather(*(r.stop() for r in list(self.runners.values())))

    def runner(self, name: str) -> WorkerRunner:
        return self.runners[name]

    def address(self, name: str) -> str:
        return self.runners[name].spec.address


def one_group_status(group_state: str = "READY", daemon_state: str = "SERVING") -> StatusReport:
    """A daemon's status with one group `pipeline` (pid 2) in `group_state`: what the HTTP fakes report."""
    ready = group_state == "READY"
    group = GroupStatus(name="pipeline", state=group_state, pid=2, restarts=0)
    return StatusReport(daemon_state, 1, 1.0, int(ready), 1, 0, None, (group,), int(ready), 1)


def empty_topology(model: str = "fake", model_path: str = "test/fake") -> TopologyReport:
    """A topology with no groups, stages, edges or GPUs."""
    return TopologyReport(model, model_path, False, (), (), (), ())


HEART = {"id": "heart", "language": "en", "sample_rate": 24000}


class FakeSpeechDaemon:
    """What create_app (http/app.py) reads of the daemon: a plan, a gateway with admission, status, topology, voices
    and the config's voice names.

    Its model `fake` declares `voices` (default: one voice, `heart`); a test may replace any attribute.
    """

    def __init__(
        self, group_state: str = "READY", stand_in: bool = False, voices: list[dict[str, Any]] | None = None
    ) -> None:
        self.plan = SimpleNamespace(model="fake", model_path="test/fake", stages=(SimpleNamespace(stand_in=stand_in),))
        self.gateway = SimpleNamespace(
            admission=Admission(), limits=RequestLimits(), metrics=None, max_text_chars=DEFAULT_MAX_TEXT_CHARS
        )
        self.group_state = group_state
        self.declared = [HEART] if voices is None else voices
        self.voice_names: dict[str, str] = {}

    def status(self) -> StatusReport:
        return one_group_status(self.group_state)

    def topology(self) -> TopologyReport:
        return empty_topology()

    def voices(self) -> list[dict[str, Any]]:
        return self.declared
