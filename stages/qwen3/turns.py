"""Requests take turns on the talker: one step each, round robin, on one thread.

A talker step draws from torch's global generator (the talker's token and, in
the code predictor, the other 15 codebooks) and reads the talker module's
`rope_deltas`, both per process. So requests cannot step at once, but they can
take turns: before a request's step its own generator state and rope offset
are put back, after it they are kept, and its draws are the ones it would make
alone. Each request's codes are then what `generate()` gives it with its seed,
however many requests share the talker; each gets 1/N of the talker's steps.

Up to `max_streams` requests step in turn; later ones wait in arrival order. A
request that fails fails alone: the others go on stepping.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from stagevisor.stages.qwen3.prompt import Prompt
from stagevisor.stages.qwen3.request import Sampling
from stagevisor.stages.qwen3.steps import Outcome, Talker, frames

log = logging.getLogger(__name__)

Deliver = Callable[[np.ndarray], None]
"""Takes each codec frame, a (16,) int64 array, on the talker's thread; must not block."""
End = Callable[[BaseException | None], None]
"""Called once when the request's generation ends (with its error, if it failed): on the talker's thread, or on
the stopping caller's for a request stopped while it waited for a turn."""


@dataclass(eq=False)
class _Stream:
    prompt: Prompt
    sampling: Sampling
    seed: int
    outcome: Outcome
    deliver: Deliver
    end: End
    stop: threading.Event = field(default_factory=threading.Event)
    steps: Iterator[torch.Tensor] | None = None
    rng: torch.Tensor | None = None
    device_rng: torch.Tensor | None = None
    rope_deltas: Any = None


class Turns:
    """The talker's one stepping thread and the requests it serves in turn."""

    def __init__(self, talker: Talker, device: torch.device, max_streams: int) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.talker = talker
        self.device = device
        self.max_streams = max_streams
        self._condition = threading.Condition()
        self._waiting: deque[_Stream] = deque()
        self._active: list[_Stream] = []
        self._holder: _Stream | None = None
        """The request whose generator state and rope offset are in torch and the talker now."""
        self._thread: threading.Thread | None = None

    @property
    def streams(self) -> int:
        """Requests stepping or waiting for a turn."""
        with self._condition:
            return len(self._active) + len(self._waiting)

    def start(
        self, prompt: Prompt, sampling: Sampling, seed: int, outcome: Outcome, deliver: Deliver, end: End
    ) -> Callable[[], None]:
        """Queue a request; returns what stops it (call it when its client goes or its stage ends).

        A request stopped while it waits for a turn ends at once; one stepping ends after its current step.
        """
        stream = _Stream(prompt, sampling, seed, outcome, deliver, end)
        with self._condition:
            if self._thread is None or not self._thread.is_alive():
                if self._thread is not None:
                    log.error("the Qwen3-TTS talker's thread had stopped; starting it again")
                thread = threading.Thread(target=self._run, name="qwen3-talker", daemon=True)
                thread.start()  # raises (no thread to be had): this request fails, nothing is queued
                self._thread = thread
            self._waiting.append(stream)
            self._condition.notify()
        return lambda: self._stop(stream)

    def _stop(self, stream: _Stream) -> None:
        stream.stop.set()
        with self._condition:
            if stream not in self._waiting:
                return
            self._waiting.remove(stream)
        stream.outcome.stopped = "cancelled"
        self._end(stream, None)

    def _run(self) -> None:
        while True:
            self._take_turns(self._next_round())

    def _next_round(self) -> list[_Stream]:
        """The requests that step this round, once there is one: those stepping, then newcomers up to the limit."""
        with self._condition:
            while not self._active and not self._waiting:
                self._condition.wait()
            while self._waiting and len(self._active) < self.max_streams:
                self._active.append(self._waiting.popleft())
            return list(self._active)

    def _take_turns(self, turn: list[_Stream]) -> None:
        # A method of its own: the round's requests (prompts on the device, their callers' closures) are let go
        # when it returns, not held by the idle thread until the next request arrives.
        for stream in turn:
            self._step(stream)

    def _step(self, stream: _Stream) -> None:
        if stream.stop.is_set():  # its client went or its stage ended since its last step: no step more
            stream.outcome.stopped = "cancelled"
            self._finish(stream, None)
            return
        try:
            self._hold(stream)
            frame = next(stream.steps)  # type: ignore[arg-type]  # set by _hold
            stream.deliver(frame.cpu().numpy())
        except StopIteration:
            self._finish(stream, None)
        except BaseException as error:  # noqa: BLE001 - a request's failure ends it alone; the talker serves on
            self._finish(stream, error)

    def _hold(self, stream: _Stream) -> None:
        """Put `stream`'s generator state and rope offset in place, keeping those of the request that had them."""
        if self._holder is stream:
            return
        held = self._holder
        if held is not None:
            held.rng = torch.get_rng_state()
            held.device_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
            held.rope_deltas = self.talker.model.talker.rope_deltas
        self._holder = stream
        if stream.steps is None:
            torch.manual_seed(stream.seed)  # the prefill sets the rope offset
            stream.steps = frames(self.talker, stream.prompt, stream.sampling, stream.stop.is_set, stream.outcome)
            return
        torch.set_rng_state(stream.rng)  # type: ignore[arg-type]  # kept when it lost the talker
        if stream.device_rng is not None:
            torch.cuda.set_rng_state(stream.device_rng, self.device)
        self.talker.model.talker.rope_deltas = stream.rope_deltas

    def _finish(self, stream: _Stream, error: BaseException | None) -> None:
        with self._condition:
            if stream in self._active:
                self._active.remove(stream)
        if self._holder is stream:
            self._holder = None
        if stream.steps is not None:
            try:
                stream.steps.close()  # type: ignore[attr-defined]  # a generator: frees its cache now
            except Exception as closing:  # noqa: BLE001 - the talker's thread must outlive any one request
                if error is not None:
                    log.warning("a Qwen3-TTS step loop failed, then failed again as it was closed", exc_info=closing)
                error = error or closing
        self._end(stream, error)

    @staticmethod
    def _end(stream: _Stream, error: BaseException | None) -> None:
        try:
            stream.end(error)
        except Exception:  # noqa: BLE001 - the talker's thread must outlive a caller that is gone
            log.exception("the Qwen3-TTS talker could not hand a request its end")
