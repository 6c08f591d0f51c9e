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

    def __init__(self, order: list[int] | None = None, seed: int = 0) -> None:
        self.prompt: FakePrompt | None = None
        self.order, self.seed = order, seed
        self.frames: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.ended = threading.Event()

    def deliver(self, frame: np.ndarray) -> None:
        self.frames.append(frame)
        if self.order is not None:
            self.order.append(self.seed)

    def end(self, error: BaseException | None) -> None:
        self.error = error
        self.ended.set()


class FakePrompt:
    """What the fake step loop makes: `count` frames, failing at step `failing`; its rope offset is `offset`.

    Like a real Prompt (which holds tensors), it cannot be compared: the talker must tell requests apart by identity.
    """

    def __init__(self, offset: int, count: int, failing: int | None, close_fails: bool = False) -> None:
        self.offset, self.count, self.failing, self.close_fails = offset, count, failing, close_fails
        self.closed = False
        """Whether the step loop was closed (its generator's cleanup ran)."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("a prompt's tensors cannot be compared")

    __hash__ = object.__hash__


def fake_frames(talker: Any, prompt: FakePrompt, sampling: Any, cancelled: Any, outcome: Any) -> Iterator[Any]:
    """Draws each "frame" from torch's generator; sets the rope offset at "prefill", as the talker does."""
    import torch

    talker.model.talker.rope_deltas = prompt.offset
    try:
        for step in range(prompt.count):
            if cancelled():
                outcome.stopped = "cancelled"
                return
            assert talker.model.talker.rope_deltas == prompt.offset, "another request's rope offset at this step"
            if step == prompt.failing:
                raise RuntimeError("CUDA out of memory (fake)")
            outcome.frames += 1
            yield torch.rand(16)
        outcome.stopped = "eos"
    except GeneratorExit:  # closed while suspended at a frame
        if prompt.close_fails:
            raise RuntimeError("the step loop's cleanup failed (fake)") from None
        raise
    finally:
        prompt.closed = True


@pytest.fixture
def turns(monkeypatch):
    import torch

    from stagevisor.stages.qwen3 import turns as module

    monkeypatch.setattr(module, "frames", fake_frames)
    talker = SimpleNamespace(model=SimpleNamespace(talker=SimpleNamespace(rope_deltas=None)))
    return lambda max_streams: module.Turns(talker, torch.device("cpu"), max_streams)  # type: ignore[arg-type]


def start(
    turns: Any, seed: int, frames: int = 20, failing: int | None = None, generation: Generation | None = None
) -> tuple[Generation, Any]:
    from stagevisor.stages.qwen3.steps import Outcome

    generation = generation or Generation()
    generation.prompt = FakePrompt(seed * 10, frames, failing)
    stop = turns.start(generation.prompt, None, seed, Outcome(), generation.deliver, generation.end)
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

    served.start(FakePrompt(10, 20, None), None, 1, Outcome(), deliver, gone.end)
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
    served.start(FakePrompt(10, 5, None), None, 1, Outcome(), deliver, first.end)
    waiting, stop = start(served, 2)
    assert served.streams == 2
    stop()
    assert waiting.ended.is_set() and waiting.error is None and not waiting.frames
    blocking.set()
    assert first.ended.wait(WAIT_S) and served.streams == 0


def test_max_streams_must_be_positive(turns):
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        turns(0)


def test_the_talkers_thread_does_not_keep_the_process_alive(turns):
    served = turns(1)
    generation, _ = start(served, 1)
    assert generation.ended.wait(WAIT_S)
    assert all(thread.daemon for thread in threading.enumerate() if thread.name == "qwen3-talker")


def test_requests_beyond_max_streams_wait_in_arrival_order_and_do_not_step(turns):
    """max_streams=1: while a first request holds the talker, two more arrive; once it ends, the second makes all
    of its frames before the third makes any."""
    from stagevisor.stages.qwen3.steps import Outcome

    served, release, order = turns(1), threading.Event(), []
    first = Generation()

    def deliver(frame: np.ndarray) -> None:
        release.wait(WAIT_S)

    served.start(FakePrompt(10, 1, None), None, 1, Outcome(), deliver, first.end)
    second, _ = start(served, 2, frames=5, generation=Generation(order, 2))
    third, _ = start(served, 3, frames=5, generation=Generation(order, 3))
    release.set()
    assert all(generation.ended.wait(WAIT_S) for generation in (first, second, third))
    assert order == [2] * 5 + [3] * 5


def test_a_request_stopped_mid_generation_ends_at_its_turn_and_the_others_draw_on_as_alone(turns):
    """Two requests in turn; the second is stopped after its third frame, while the first holds the talker's state:
    it takes no step more, its step loop is closed before its end is reported, and the first draws what it draws
    alone."""
    served = turns(2)
    first, _ = start(served, 1)
    stopping = Generation()
    closed_at_end: list[bool] = []
    stop: list[Any] = []

    def deliver(frame: np.ndarray) -> None:
        stopping.frames.append(frame)
        if len(stopping.frames) == 3:
            stop[0]()

    def end(error: BaseException | None) -> None:
        closed_at_end.append(prompt.closed)
        stopping.end(error)

    from stagevisor.stages.qwen3.steps import Outcome

    prompt, outcome = FakePrompt(20, 20, None), Outcome()
    stop.append(served.start(prompt, None, 2, outcome, deliver, end))
    assert first.ended.wait(WAIT_S) and stopping.ended.wait(WAIT_S)
    assert len(stopping.frames) == 3 and outcome.stopped == "cancelled" and closed_at_end == [True]
    assert np.array_equal(np.stack(first.frames), np.stack(alone(1)))


def test_a_caller_whose_end_fails_costs_the_talker_nothing(turns):
    from stagevisor.stages.qwen3.steps import Outcome

    served = turns(1)

    def end(error: BaseException | None) -> None:
        raise RuntimeError("Event loop is closed")

    served.start(FakePrompt(10, 3, None), None, 1, Outcome(), lambda frame: None, end)
    after, _ = start(served, 2)
    assert after.ended.wait(WAIT_S) and np.array_equal(np.stack(after.frames), np.stack(alone(2)))


def test_a_step_loop_whose_cleanup_fails_fails_its_request_alone(turns):
    """A request stopped mid-generation whose step loop raises as it is closed ends with that error; the talker
    serves the next request."""
    from stagevisor.stages.qwen3.steps import Outcome

    served, failing = turns(1), Generation()
    stop: list[Any] = []

    def deliver(frame: np.ndarray) -> None:
        stop[0]()

    stop.append(served.start(FakePrompt(10, 20, None, close_fails=True), None, 1, Outcome(), deliver, failing.end))
    after, _ = start(served, 2)
    assert failing.ended.wait(WAIT_S) and isinstance(failing.error, RuntimeError)
    assert after.ended.wait(WAIT_S) and np.array_equal(np.stack(after.frames), np.stack(alone(2)))


def test_a_talker_thread_that_cannot_start_fails_its_request_alone_and_the_next_request_starts_one(turns, monkeypatch):
    """Before: the unstarted thread was kept, and every later request waited for ever."""
    served = turns(2)
    real_start = threading.Thread.start

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        start(served, 1)
    assert served.streams == 0
    monkeypatch.setattr(threading.Thread, "start", real_start)
    after, _ = start(served, 2)
    assert after.ended.wait(WAIT_S) and np.array_equal(np.stack(after.frames), np.stack(alone(2)))


def test_an_idle_talker_keeps_no_ended_request(turns):
    """Before: the idle thread's last round kept its requests (their prompts, on the device for real ones)."""
    import gc
    import time
    import weakref

    from stagevisor.stages.qwen3.steps import Outcome

    served, generation = turns(2), Generation()
    prompt = FakePrompt(10, 3, None)
    kept = weakref.ref(prompt)
    served.start(prompt, None, 1, Outcome(), generation.deliver, generation.end)
    del prompt
    assert generation.ended.wait(WAIT_S)
    deadline = time.monotonic() + 5.0
    while kept() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert kept() is None


def test_a_request_that_fails_and_whose_step_loop_then_fails_to_close_ends_with_the_first_error_and_logs_the_second(
    turns, caplog
):
    import logging

    from stagevisor.stages.qwen3.steps import Outcome

    served, failing = turns(1), Generation()

    def deliver(frame: np.ndarray) -> None:
        raise RuntimeError("Event loop is closed")

    with caplog.at_level(logging.WARNING, logger="stagevisor.stages.qwen3.turns"):
        served.start(FakePrompt(10, 20, None, close_fails=True), None, 1, Outcome(), deliver, failing.end)
        assert failing.ended.wait(WAIT_S)
    assert str(failing.error) == "Event loop is closed"
    assert "failed again as it was closed" in caplog.text and "the step loop's cleanup failed (fake)" in caplog.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the SystemExit, on purpose
def test_a_talker_thread_that_died_is_started_again_by_the_next_request_and_says_so(turns, caplog):
    """A SystemExit from a caller's `end` is not caught (it is not an Exception): it ends the thread, as it would
    any. Before: the next requests queued behind the dead thread for ever."""
    import logging

    from stagevisor.stages.qwen3.steps import Outcome

    served = turns(1)

    found = threading.Event()

    def end(error: BaseException | None) -> None:
        found.wait(WAIT_S)  # the test has found the thread: it may end now
        raise SystemExit

    before = set(threading.enumerate())
    served.start(FakePrompt(10, 2, None), None, 1, Outcome(), lambda frame: None, end)
    (talker,) = [thread for thread in threading.enumerate() if thread not in before and thread.name == "qwen3-talker"]
    found.set()
    talker.join(WAIT_S)
    assert not talker.is_alive()
    assert "had stopped" not in caplog.text  # the first thread is no restart
    with caplog.at_level(logging.ERROR, logger="stagevisor.stages.qwen3.turns"):
        after, _ = start(served, 2)
        assert after.ended.wait(WAIT_S) and np.array_equal(np.stack(after.frames), np.stack(alone(2)))
    assert "the Qwen3-TTS talker's thread had stopped; starting it again" in caplog.text
