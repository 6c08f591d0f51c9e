"""A load generator for the Synthesis service: closed-loop concurrency or open-loop Poisson arrivals.

Times each request from the client's side (time to first audio, end to end,
audio produced, and how long a client playing the stream from its first
audio would have waited for audio that had not arrived) and keeps each
request's PCM digest, so runs on different topologies can be checked for
identical audio. Used by `stagevisor bench`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterable, Awaitable, Callable, Mapping, Protocol, Sequence

from stagevisor.supervisor.metrics.playback import Playback

if TYPE_CHECKING:
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2
    from stagevisor.supervisor.security.client import ClientSecurity

RECONNECT_WAIT = 5.0
"""Seconds a client waits for its channel to connect again after a call failed UNAVAILABLE without a connection,
before it calls the address unreachable (gRPC retries a lost connection after about 1 s, then backs off)."""


@dataclass(frozen=True)
class VoiceFields:
    """Who every request speaks as: a voice (speaker) name, or reference audio to clone with its transcript.

    Empty fields leave the choice to the model (its own voice); a Qwen3-TTS Base checkpoint needs the reference."""

    voice: str = ""
    reference_audio: bytes = b""
    reference_transcript: str = ""


class RunFailed(Exception):
    """A measured run that cannot give figures: it stops there, and the bench reports `code` and the message for its
    topology (exit status 1). Not retried: the operator fixes what the message names and runs the bench again."""

    code = "RUN_FAILED"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class Unreachable(RunFailed):
    """The daemon stopped answering at its address (it ended, or never listened there): nothing more can succeed."""

    code = "DAEMON_FAILED"


class NoneSucceeded(RunFailed):
    """Every request of a measured run failed (a refused token, a broken model): there are no figures to give."""

    code = "REQUESTS_FAILED"


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it."""

    text_index: int
    started: float
    first_audio: float | None
    """Seconds from sending to the first audio chunk; None when no audio came."""
    total: float
    samples: int
    sample_rate: int
    error: str | None = None
    """The gRPC status code name of a failed request."""
    digest: str = ""
    stall: float = 0.0
    """Seconds a client that starts playing at the first audio chunk would have waited for audio (Playback)."""
    detail: str = ""
    """The status message of a failed request (what the daemon or the channel said)."""

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.sample_rate if self.sample_rate else 0.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Summary:
    """What one measured run produced, in base units (seconds, requests per second)."""

    requests: int
    wall_seconds: float
    requests_per_second: float
    audio_seconds_per_second: float
    ttfa: dict[str, float | None]
    latency: dict[str, float | None]
    real_time_factor: float | None
    """Median of (end-to-end time / audio duration): below 1 is faster than real time."""
    errors: dict[str, int] = field(default_factory=dict)
    stall: dict[str, float | None] = field(default_factory=dict)
    """Percentiles of Outcome.stall over the successful requests (p50, p90, max)."""
    stalled: float | None = None
    """The fraction of successful requests whose playback paused at all."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(outcomes: Sequence[Outcome], wall_seconds: float) -> Summary:
    ok = [o for o in outcomes if o.error is None]
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.error is not None:
            errors[o.error] = errors.get(o.error, 0) + 1
    ttfa = [o.first_audio for o in ok if o.first_audio is not None]
    totals = [o.total for o in ok]
    rtf = [o.total / o.audio_seconds for o in ok if o.audio_seconds > 0]
    stalls = [o.stall for o in ok]
    wall = max(wall_seconds, 1e-9)
    return Summary(
        requests=len(outcomes),
        wall_seconds=wall_seconds,
        requests_per_second=len(ok) / wall,
        audio_seconds_per_second=sum(o.audio_seconds for o in ok) / wall,
        ttfa={f"p{q}": percentile(ttfa, q) for q in (50, 90, 99)},
        latency={f"p{q}": percentile(totals, q) for q in (50, 90, 99)},
        real_time_factor=statistics.median(rtf) if rtf else None,
        errors=errors,
        stall={"p50": percentile(stalls, 50), "p90": percentile(stalls, 90), "max": max(stalls, default=None)},
        stalled=sum(1 for s in stalls if s > 0) / len(stalls) if stalls else None,
    )


def stop_if_cancelled() -> None:
    """Raise CancelledError when this task was asked to stop (Ctrl-C cancels the bench's main task) even though
    the await it was in returned normally.

    A grpc.aio call that completes just as the task awaiting it is cancelled swallows that cancellation and
    returns its response, so the request to stop would be lost and the bench would run to its end. Python 3.11
    and later count the request in Task.cancelling(); 3.10 cannot tell, and the bench stops as before.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


class SynthesisChannel(Protocol):
    """What GrpcClient uses of its channel (a grpc.aio.Channel): its state, waiting until it connects, closing it."""

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity: ...

    async def channel_ready(self) -> None: ...

    async def close(self, grace: float | None = None) -> None: ...


class SynthesisCalls(Protocol):
    """What GrpcClient calls on the daemon (the Synthesis service's stub on its channel)."""

    def Synthesize(  # noqa: N802 - the service's method name
        self, request: synthesis_pb2.SynthesizeRequest, timeout: float
    ) -> AsyncIterable[synthesis_pb2.AudioChunk]: ...


class GrpcClient:
    """Synthesize over gRPC (`stagevisor.v1.Synthesis`): one channel shared by every in-flight request.

    `security`: how to dial (TLS, the bearer token), as every CLI client does; default plaintext without a token.
    `voice`: who every request speaks as (default: the model's own voice).
    A call that fails UNAVAILABLE on a channel that is not connected raises Unreachable unless the channel connects
    again within `reconnect_wait` seconds: the daemon is gone, and every further request would fail at once. An
    UNAVAILABLE the daemon sends itself (it is starting, a worker was lost) leaves the channel connected and counts
    as a failed request.
    `channel` and `stub`: what it dials and calls instead of a channel to `address` and the Synthesis stub on it
    (tests pass fakes).
    """

    def __init__(
        self,
        address: str,
        options: dict[str, str],
        timeout: float = 300.0,
        security: ClientSecurity | None = None,
        reconnect_wait: float = RECONNECT_WAIT,
        voice: VoiceFields | None = None,
        *,
        channel: SynthesisChannel | None = None,
        stub: SynthesisCalls | None = None,
    ) -> None:
        import grpc

        from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc
        from stagevisor.supervisor.security.client import ClientSecurity

        self._grpc = grpc
        self._pb = synthesis_pb2
        self.address = address
        self._channel: SynthesisChannel = (
            channel if channel is not None else (security or ClientSecurity()).aio_channel(address)
        )
        self._stub: SynthesisCalls = stub if stub is not None else synthesis_pb2_grpc.SynthesisStub(self._channel)
        self._options = options
        self._voice = voice or VoiceFields()
        self._timeout = timeout
        self._reconnect_wait = reconnect_wait

    async def request(self, index: int, text: str, options: Mapping[str, str] | None = None) -> Outcome:
        """One request of `text` with the client's options (or `options` instead); `index` names it in the outcome.

        Unreachable when the address no longer answers (see the class)."""
        started = time.perf_counter()
        first: float | None = None
        samples = 0
        rate = 0
        digest = hashlib.sha256()
        playback = Playback()
        error: str | None = None
        detail = ""
        try:
            call = self._stub.Synthesize(
                self._pb.SynthesizeRequest(
                    text=text,
                    voice=self._voice.voice,
                    reference_audio=self._voice.reference_audio,
                    reference_transcript=self._voice.reference_transcript,
                    options=self._options if options is None else options,
                ),
                timeout=self._timeout,
            )
            async for chunk in call:
                now = time.perf_counter()
                if first is None:
                    first = now - started
                samples += len(chunk.pcm) // 2
                rate = chunk.sample_rate
                digest.update(chunk.pcm)
                if rate:
                    playback.arrived(now, len(chunk.pcm) / 2 / rate)
        except self._grpc.aio.AioRpcError as failed:
            error, detail = failed.code().name, failed.details() or ""
            if failed.code() == self._grpc.StatusCode.UNAVAILABLE:
                await self._reconnected(detail)
        stop_if_cancelled()
        total = time.perf_counter() - started
        # A failed request's audio is cut short: it carries no digest to compare.
        return Outcome(
            index,
            started,
            first,
            total,
            samples,
            rate,
            error,
            "" if error else digest.hexdigest(),
            playback.stall,
            detail,
        )

    async def _reconnected(self, detail: str) -> None:
        """Return once the channel is connected (at once when the daemon itself sent the UNAVAILABLE); Unreachable
        when it does not connect within reconnect_wait seconds. Waiting here, not failing the next request at once,
        is what keeps a dead address from being hit in a tight loop."""
        connectivity = self._grpc.ChannelConnectivity
        if self._channel.get_state(try_to_connect=True) == connectivity.READY:
            return
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self._reconnect_wait)
        except asyncio.TimeoutError:
            raise Unreachable(
                f"the daemon at {self.address} does not answer ({detail}; no connection within "
                f"{self._reconnect_wait:g} s); is `stagevisor serve` running there?"
            ) from None

    async def close(self) -> None:
        await self._channel.close()


async def _together(awaitables: Sequence[Awaitable[None]]) -> None:
    """Run them concurrently; the first that raises cancels the others, then its exception propagates
    (a plain gather would leave them sending requests)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def closed_loop(
    request: Callable[[int, str], Any],
    texts: Sequence[str],
    concurrency: int,
    *,
    requests: int | None = None,
    duration: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[Outcome], float]:
    """`concurrency` clients, each sending its next request when the last one ends. Returns (outcomes, wall)."""
    outcomes: list[Outcome] = []
    issued = 0
    started = time.perf_counter()
    deadline = started + duration if duration is not None else None

    def next_index() -> int | None:
        nonlocal issued
        if requests is not None and issued >= requests:
            return None
        if deadline is not None and time.perf_counter() >= deadline:
            return None
        issued += 1
        return issued - 1

    async def client() -> None:
        while (index := next_index()) is not None:
            outcome = await request(index % len(texts), texts[index % len(texts)])
            outcomes.append(outcome)
            if progress:
                progress(len(outcomes))

    await _together([client() for _ in range(concurrency)])
    return outcomes, time.perf_counter() - started


async def open_loop(
    request: Callable[[int, str], Any],
    texts: Sequence[str],
    rate: float,
    *,
    requests: int | None = None,
    duration: float | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[Outcome], float]:
    """Poisson arrivals at `rate` requests per second, whatever is in flight. Returns (outcomes, wall)."""
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    failed: list[BaseException] = []
    started = time.perf_counter()
    at = 0.0
    index = 0

    def note_failure(task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            failed.append(error)

    while (requests is None or index < requests) and (duration is None or at < duration) and not failed:
        now = time.perf_counter()
        if duration is not None and now - started >= duration:
            break  # a schedule behind the clock (a rate this host cannot issue) still ends with --duration
        # Also when behind schedule, yield: the requests already issued run meanwhile.
        await asyncio.sleep(max(0.0, started + at - now))

        async def one(i: int) -> None:
            outcomes.append(await request(i % len(texts), texts[i % len(texts)]))
            if progress:
                progress(len(outcomes))

        task = asyncio.create_task(one(index))
        task.add_done_callback(note_failure)  # a request that raised (Unreachable) ends the arrivals
        tasks.append(task)
        index += 1
        at += rng.expovariate(rate)
    await _together(tasks)
    return outcomes, time.perf_counter() - started
