"""FrameReceiver: the frames a worker's links deliver, checked and turned into stage calls and stream chunks.

What peers send is checked, not trusted: a frame that does not parse or
decode, or names a stage this worker does not serve, fails only its own
request (a Failure to the sink). A Submit starts its stage; the first Chunk or
End of a stream from another process starts the receiving stage, later ones
feed its queue. The daemon's control frames (replicas, peers) and a client's
Cancel pass through to the runtime. With metrics on, each handoff received is
accounted on its edge: transport, bytes, chunks and latency.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Container, Protocol

from stagevisor.stages.base import StagePayload
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.out_of_line import discard_shared
from stagevisor.supervisor.dataplane.decoding import inline_bytes_received, shared_bytes_received
from stagevisor.supervisor.dataplane.link.frames import BadFrame, bad_frames_log
from stagevisor.supervisor.dataplane.link.server import InboundLink
from stagevisor.supervisor.dataplane.peers import PeerDirectory
from stagevisor.supervisor.dataplane.request_state import RequestState, RequestTable
from stagevisor.supervisor.dataplane.stage_calls import StageCalls
from stagevisor.supervisor.dataplane.streams import STREAM_WINDOW, ChunkQueue, CreditWindow
from stagevisor.supervisor.dataplane.trace import (
    GRPC,
    GRPC_TCP,
    Trace,
    close_stages,
    from_hops,
    from_timings,
    running_stages,
    sent_at,
)
from stagevisor.supervisor.metrics.recorder import SHARED_MEMORY, Recorder

# The runtime's logger: what it logs of frames keeps the logger name it was always logged under.
log = logging.getLogger("stagevisor.supervisor.dataplane.runtime")

_now = time.monotonic


def _received() -> tuple[int, int]:
    """(bytes mapped from shared memory, bytes taken from inline pieces) by this process so far."""
    return shared_bytes_received(), inline_bytes_received()


class Control(Protocol):
    """What the receiver hands the runtime: cancels, the daemon's replica sets, and requests to fail."""

    def cancel(self, request_id: str) -> None: ...

    def apply_replicas(self, message: pb.Replicas) -> None: ...

    def reject(self, request_id: str, stage: str, code: pb.FailureCode, message: str) -> None: ...


class FrameReceiver:
    """Dispatches the frames of a worker's inbound links (`on_frame`) and the replies on its outbound ones."""

    def __init__(
        self,
        peer_name: str,
        served: Container[str],
        codec: Codec,
        recorder: Recorder | None,
        directory: PeerDirectory | None,
        requests: RequestTable,
        calls: StageCalls,
        control: Control,
    ) -> None:
        self.peer_name = peer_name
        self._served = served
        self.codec = codec
        self.recorder = recorder
        self.directory = directory
        self._requests = requests
        self._admit = requests.admit
        self._start = calls.start
        self._control = control

    def on_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        """A frame from a peer's link to this worker; a bad one fails only its own request."""
        try:
            self._on_frame(frame, link)
        except Exception as error:  # noqa: BLE001 - one bad frame must not hurt other requests
            bad_frames_log.warning(
                "refusing a %s frame for request %s: %s", frame.WhichOneof("body"), frame.request_id, error
            )
            self._drop(frame, link)
            self._control.reject(
                frame.request_id,
                frame.dst,
                pb.FAILURE_CODE_INTERNAL,
                f"worker {self.peer_name!r} could not read a frame of this request: {error}",
            )

    def on_bad_frame(self, bad: BadFrame, link: InboundLink) -> None:
        """A frame that did not parse, or a piece that did not fit: fail its request, if it can be told."""
        bad_frames_log.warning("data-plane peer %s sent %s", link.peer or "?", bad.error)
        if bad.request_id:
            self._control.reject(
                bad.request_id, "", pb.FAILURE_CODE_INTERNAL, f"worker {self.peer_name!r} received {bad.error}"
            )

    def _on_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        body = frame.WhichOneof("body")
        if body == "cancel":
            self._control.cancel(frame.request_id)
            return
        if body == "replicas":
            self._control.apply_replicas(frame.replicas)
            # The daemon waits on the answer before it stops a replica taken out of rotation.
            link.reply(pb.Frame(src=self.peer_name, replicas=pb.Replicas(version=frame.replicas.version)))
            return
        if body == "peers":  # where peers listen, by node (--launcher ray)
            if self.directory is not None:
                self.directory.update(frame.peers.version, ((p.address, p.node_id, p.tcp) for p in frame.peers.peers))
            return
        if body in ("submit", "chunk", "end") and frame.dst not in self._served:
            self._drop(frame, link)
            self._control.reject(
                frame.request_id,
                frame.dst,
                pb.FAILURE_CODE_INTERNAL,
                f"stage {frame.dst[:80]!r} is not served by worker {self.peer_name!r}",
            )
            return
        if body not in ("submit", "chunk", "end"):
            log.debug("ignoring %s frame for %s", body, frame.request_id)
            return
        if body != "submit" and not _opens(frame) and self._requests.get(frame.request_id) is None:
            # A stream's later chunk or its end, for a request this worker no longer holds: its stage returned
            # before the stream ended, or it was cancelled. Dropped, never refused as a new request would be
            # (while this worker drains or is full), which would fail a request that is going on elsewhere.
            self._drop(frame, link)
            return
        state = self._admit(frame.request_id, link)
        if state is None or state.cancelled or state.failed:
            self._drop(frame, link)
            return
        state.touched = time.monotonic()
        rec = self.recorder
        before = _received() if rec is not None else (0, 0)
        if body == "submit":
            payload = StagePayload(
                frame.request_id,
                self.codec.decode(frame.submit.request, link),
                self.codec.decode(frame.submit.data, link),
            )
            trace = from_hops(frame.submit.trace)
            if rec is not None and frame.submit.HasField("timings"):
                timed = from_timings(frame.submit.timings)
                self._remote_arrival(rec, frame, timed, before, stream=False, link=link)
                if payload.request.get("timings") is True:  # the full timings; else only the sender's end
                    trace = timed
            self._start(state, frame.dst, payload, trace)
            return
        message = frame.chunk if body == "chunk" else frame.end
        queue = state.inbound.get((frame.src, frame.dst))
        opened: Trace | None = None
        if queue is None:
            if not message.HasField("opening"):
                self._drop(frame, link)  # its stage already returned; keep the sender's credits flowing
                self._requests.forget_if_idle(state)
                return
            queue, opened = self._open_remote_stream(state, frame, message.opening, link)
        if body == "chunk":
            queue.push(self.codec.decode(frame.chunk.value, link))
        else:
            if frame.end.has_data:
                target = state.stream_payload(frame.src, frame.dst)
                if target is not None:
                    target.data.update(self.codec.decode(frame.end.data, link))
            if state.stream_sources:  # before queue.end(): the receiver's Done must carry the ends
                self._close_sources(state, frame)
            queue.end()
        if rec is not None:
            self._remote_arrival(rec, frame, opened, before, stream=body == "chunk", link=link)

    def _open_remote_stream(
        self, state: RequestState, frame: pb.Frame, opening: pb.Opening, link: InboundLink
    ) -> tuple[ChunkQueue, Trace]:
        """Start the receiving stage of a stream; return its queue and its trace."""
        queue = ChunkQueue(STREAM_WINDOW, on_consumed=partial(link.credit, (frame.request_id, frame.src, frame.dst)))
        state.inbound[(frame.src, frame.dst)] = queue
        state.remote_streams.add((frame.src, frame.dst))
        payload = StagePayload(frame.request_id, self.codec.decode(opening.request, link), {})
        state.stream_payloads[(frame.src, frame.dst)] = payload
        if self.recorder is not None and opening.HasField("timings"):
            trace = from_timings(opening.timings)
            running = running_stages(trace)
            # The sender and the stages streaming to it in its process, still running: the end marker says when
            # they returned.
            if running:
                if state.stream_sources is None:
                    state.stream_sources = {}
                state.stream_sources[(frame.src, frame.dst)] = running
        else:
            trace = from_hops(opening.trace)
        self._start(state, frame.dst, payload, trace, queue)
        return queue, trace

    @staticmethod
    def _close_sources(state: RequestState, frame: pb.Frame) -> None:
        """Close the spans a stream's opening carried open, with the ends its end marker carries."""
        running = state.stream_sources.pop((frame.src, frame.dst), None) if state.stream_sources else None
        if not running:
            return
        end = frame.end
        if end.src_end:
            for span in running:
                if span[0] == frame.src and not span[2]:
                    span[2] = end.src_end
        if end.HasField("timings"):
            close_stages(running, end.timings)

    def _drop(self, frame: pb.Frame, link: InboundLink) -> None:
        # Also after a decode of this frame, whole or partial: only buffers no decode took are released
        # (Codec.decode marks the rest, which its mappings release).
        body = frame.WhichOneof("body")
        if body == "submit":
            discard_shared(frame.submit.request, link)
            discard_shared(frame.submit.data, link)
        elif body == "chunk":
            discard_shared(frame.chunk.value, link)
            if frame.chunk.HasField("opening"):  # the request it opens with (reference audio can be in shm)
                discard_shared(frame.chunk.opening.request, link)
            link.reply(pb.Frame(request_id=frame.request_id, src=frame.src, dst=frame.dst, credit=pb.Credit(chunks=1)))
        elif body == "end":
            discard_shared(frame.end.data, link)
            if frame.end.HasField("opening"):
                discard_shared(frame.end.opening.request, link)

    def on_reply(self, frame: pb.Frame) -> None:
        """A frame answered on one of this worker's outbound links: stream credits (links take releases)."""
        body = frame.WhichOneof("body")
        if body != "credit":
            return
        state = self._requests.get(frame.request_id)
        out = state.outbound.get((frame.src, frame.dst)) if state else None
        if isinstance(out, CreditWindow):
            out.release(frame.credit.chunks)

    def _remote_arrival(
        self,
        rec: Recorder,
        frame: pb.Frame,
        trace: Trace | None,
        before: tuple[int, int],
        stream: bool,
        link: InboundLink | None = None,
    ) -> None:
        """Account a handoff received over a link: its transport, bytes (with its inline pieces) and latency."""
        mapped, inline = (now - then for now, then in zip(_received(), before, strict=True))
        transport = GRPC_TCP if link is not None and link.tcp else SHARED_MEMORY if mapped else GRPC
        edge = rec.edge(frame.src, frame.dst, transport)
        edge.bytes += frame.ByteSize() + mapped + inline
        if stream:
            edge.chunks += 1
        if trace is not None:
            edge.handoffs += 1
            sent = sent_at(trace)
            if sent:
                edge.latencies.append(_now() - sent)


def _opens(frame: pb.Frame) -> bool:
    """Whether a chunk or end frame opens its stream (carries the request for the receiving stage)."""
    message: pb.Chunk | pb.StreamEnd = frame.chunk if frame.WhichOneof("body") == "chunk" else frame.end
    return bool(message.HasField("opening"))
