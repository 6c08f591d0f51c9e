"""Requests taking turns on the talker (stages/qwen3/turns.py), with the talker's step loop replaced by a fake.

The fake draws each "frame" from torch's global generator and checks that the
talker's `rope_deltas` is the one its own prefill set, as the real step loop
depends on both. Needs torch and transformers (the qwen3 extra).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import pytest

pytestmark = pytest.mark.qwen3

WAIT_S = 30.0
"""Bound on a fake generation (a few microseconds of work a step)."""


class Generation:
    """What one request's caller sees: its frames and how it ended."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.ended = threading.Event()

    def deliver(self, frame: np.ndarray) -> None:
        self.frames.append(frame)

    def end(self, error: BaseException | None) -> None:
        self.error = error
        self.ended.set()


def fake_frames(talker: Any, prompt: Any, sampling: Any, cancelled: Any, outcome: Any) -> Iterator[Any]:
    """`prompt` is (rope offset, frames, step that raises or None); sets the offset at "prefill", as the talker does."""
    import torch

    offset, count, failing = prompt
    talker.model.talker.rope_deltas = offset
    for step in range(count):
        if cancelled():
            outcome.stopped = "cancelled"
            return
        assert talker.model.talker.rope_deltas == offset, "another request's rope offset at this one's step"
        if step == failing:
            raise RuntimeError("CUDA out of memory (fake)")
        outcome.frames += 1
        yield torch.rand(16)
    outcome.stopped = "eos"


@pytest.fixture
def turns(monkeypatch):
    import torch

    from stagevisor.stages.qwen3 import turns as module

    monkeypatch.setattr(module, "frames", fake_frames)
    talker = SimpleNamespace(model=SimpleNamespace(talker=SimpleNamespace(rope_deltas=None)))
    return lambda max_streams: module.Turns(talker, torch.device("cpu"), max_streams)  # type: ignore[arg-type]


def start(turns: Any, seed: int, frames: int = 20, failing: int | None = None) -> tuple[Generation, Any]:
    from stagevisor.stages.qwen3.steps import Outcome

    generation = Generation()
    stop = turns.start((seed * 10, frames, failing), None, seed, Outcome(), generation.deliver, generation.end)
    return generation, stop


def alone(seed: int, frames: int = 20) -> list[np.ndarray]:
    import torch

    torch.manual_seed(seed)
    return [torch.rand(16).numpy() for _ in range(frames)]


def test_interleaved_requests_each_draw_what_their_seed_draws_alone(turns):
    served = turns(3)
    generations = [start(served, seed)[0] for seed in (1, 2, 3)]
    assert all(generation.ended.wait(WAIT_S) for generation in generations)
    for seed, generation in zip((1, 2, 3), generations, strict=True):
        assert generation.error is None
        assert np.array_equal(np.stack(generation.frames), np.stack(alone(seed)))
    assert served.streams == 0


def test_a_request_that_fails_fails_alone_and_the_others_finish(turns):
    served = turns(2)
    failed, _ = start(served, 1, failing=3)
    others = [start(served, seed)[0] for seed in (2, 3)]
    assert failed.ended.wait(WAIT_S) and all(generation.ended.wait(WAIT_S) for generation in others)
    assert isinstance(failed.error, RuntimeError) and len(failed.frames) == 3
    for seed, generation in zip((2, 3), others, strict=True):
        assert generation.error is None and np.array_equal(np.stack(generation.frames), np.stack(alone(seed)))


def test_a_caller_that_cannot_take_a_frame_ends_its_request_and_the_talker_serves_on(turns):
    served = turns(2)
    gone = Generation()

    def deliver(frame: np.ndarray) -> None:
        raise RuntimeError("Event loop is closed")

    from stagevisor.stages.qwen3.steps import Outcome

    served.start((10, 20, None), None, 1, Outcome(), deliver, gone.end)
    after, _ = start(served, 2)
    assert gone.ended.wait(WAIT_S) and isinstance(gone.error, RuntimeError)
    assert after.ended.wait(WAIT_S) and np.array_equal(np.stack(after.frames), np.stack(alone(2)))


def test_a_request_stopped_while_waiting_ends_at_once_without_a_step(turns):
    served = turns(1)
    blocking = threading.Event()

    def deliver(frame: np.ndarray) -> None:
        blocking.wait(WAIT_S)  # holds the talker's thread inside the first request's first step

    from stagevisor.stages.qwen3.steps import Outcome

    first = Generation()
    served.start((10, 5, None), None, 1, Outcome(), deliver, first.end)
    waiting, stop = start(served, 2)
    stop()
    assert waiting.ended.is_set() and waiting.error is None and not waiting.frames
    blocking.set()
    assert first.ended.wait(WAIT_S) and served.streams == 0


def test_max_streams_must_be_positive(turns):
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        turns(0)
