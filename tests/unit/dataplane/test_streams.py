"""Stream state: the bounded chunk queue, the credit it returns per chunk, and the sender's credit window."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.dataplane.streams import STREAM_WINDOW, ChunkQueue, CreditWindow, empty_chunks
from tests.fakes import settle


class Credits:
    """Counts the credits a queue hands back to its remote sender."""

    def __init__(self) -> None:
        self.returned = 0

    def __call__(self) -> None:
        self.returned += 1


async def take(queue: ChunkQueue, count: int) -> list:
    taken = []
    async for item in queue:
        taken.append(item)
        if len(taken) == count:
            break
    return taken


def test_every_chunk_a_stage_reads_returns_exactly_one_credit():
    async def scenario():
        credits = Credits()
        queue = ChunkQueue(on_consumed=credits)
        for i in range(5):
            queue.push(i)
        queue.end()
        assert [c async for c in queue] == [0, 1, 2, 3, 4]
        assert credits.returned == 5

    asyncio.run(scenario())


def test_a_stage_that_abandons_its_stream_returns_one_credit_per_chunk_received():
    """
    1. a remote sender pushes 6 chunks (6 credits spent);
    2. the stage reads 2 and returns: abandoning gives back the 4 it never read;
    3. 3 chunks already in flight arrive afterwards: each gives its credit back at once.
    """

    async def scenario():
        credits = Credits()
        queue = ChunkQueue(on_consumed=credits)
        for i in range(6):
            queue.push(i)
        assert await take(queue, 2) == [0, 1]
        assert credits.returned == 2
        queue.abandon()
        assert credits.returned == 6 and len(queue) == 0
        for i in range(3):
            queue.push(i)
        assert credits.returned == 9 and len(queue) == 0

    asyncio.run(scenario())


def test_abandoning_an_empty_stream_returns_no_credit():
    credits = Credits()
    queue = ChunkQueue(on_consumed=credits)
    queue.abandon()
    assert credits.returned == 0


def test_a_dropped_stream_forgets_its_chunks_ends_and_returns_credits_for_late_ones():
    async def scenario():
        credits = Credits()
        queue = ChunkQueue(on_consumed=credits)
        queue.push("a")
        queue.drop()
        assert queue.ended and len(queue) == 0 and [c async for c in queue] == []
        queue.push("late")
        assert credits.returned == 1 and len(queue) == 0

    asyncio.run(scenario())


def test_an_in_process_producer_waits_while_the_queue_is_full_and_resumes_when_a_chunk_is_read():
    async def scenario():
        queue = ChunkQueue(capacity=2)
        await queue.put(0)
        await queue.put(1)
        blocked = asyncio.create_task(queue.put(2))
        await settle(lambda: queue._writable.is_set() is False)
        assert not blocked.done() and len(queue) == 2
        assert await take(queue, 1) == [0]
        await asyncio.wait_for(blocked, 5)
        assert len(queue) == 2
        queue.end()
        assert [c async for c in queue] == [1, 2]

    asyncio.run(scenario())


def test_dropping_a_stream_releases_a_waiting_producer_without_queueing_its_chunk():
    async def scenario():
        queue = ChunkQueue(capacity=1)
        await queue.put(0)
        blocked = asyncio.create_task(queue.put(1))
        await settle(lambda: queue._writable.is_set() is False)
        queue.drop()
        await asyncio.wait_for(blocked, 5)
        assert len(queue) == 0

    asyncio.run(scenario())


def test_abandoning_releases_a_waiting_producer():
    async def scenario():
        queue = ChunkQueue(capacity=1)
        await queue.put(0)
        blocked = asyncio.create_task(queue.put(1))
        await settle(lambda: queue._writable.is_set() is False)
        queue.abandon()
        await asyncio.wait_for(blocked, 5)
        assert len(queue) == 0

    asyncio.run(scenario())


def test_a_stream_is_ended_only_once_its_sender_says_so():
    queue = ChunkQueue()
    queue.push("a")
    assert queue.ended is False
    queue.end()
    assert queue.ended is True


def test_an_in_process_producer_waits_while_remote_pushes_overfilled_the_queue():
    """Remote chunks are pushed without waiting (their sender holds credits), so the queue can hold more
    than its capacity; an in-process put must still wait until it is below capacity again."""

    async def scenario():
        queue = ChunkQueue(capacity=2)
        for i in range(3):
            queue.push(i)
        blocked = asyncio.create_task(queue.put(3))
        await settle(lambda: queue._writable.is_set() is False)
        assert not blocked.done()
        assert await take(queue, 2) == [0, 1]
        await asyncio.wait_for(blocked, 5)
        queue.end()
        assert [c async for c in queue] == [2, 3]

    asyncio.run(scenario())


def test_a_new_credit_window_is_not_yet_opened():
    """The first chunk sent on a window carries the stream's opening; `opened` records that it went."""
    assert CreditWindow().opened is False


def test_a_reader_waits_for_the_next_chunk_and_stops_at_the_end():
    async def scenario():
        queue = ChunkQueue()
        reader = asyncio.create_task(take(queue, 3))
        await settle(lambda: queue._readable.is_set() is False)
        queue.push("a")
        queue.push("b")
        queue.end()
        assert await asyncio.wait_for(reader, 5) == ["a", "b"]
        assert queue.ended

    asyncio.run(scenario())


def test_the_window_defaults_to_stream_window_credits_and_waits_when_spent():
    async def scenario():
        window = CreditWindow()
        for _ in range(STREAM_WINDOW):
            await window.acquire()
        assert window.credits == 0
        waiting = asyncio.create_task(window.acquire())
        await settle(lambda: window._available.is_set() is False)
        assert not waiting.done()
        window.release(3)
        await asyncio.wait_for(waiting, 5)
        assert window.credits == 2

    asyncio.run(scenario())


def test_closing_the_window_releases_a_waiting_sender():
    async def scenario():
        window = CreditWindow(credits=0)
        waiting = asyncio.create_task(window.acquire())
        await settle(lambda: window._available.is_set() is False)
        window.close()
        await asyncio.wait_for(waiting, 5)
        assert window.credits == -1

    asyncio.run(scenario())


def test_a_stage_that_is_not_a_stream_target_gets_no_chunks():
    async def scenario():
        return [c async for c in empty_chunks()]

    assert asyncio.run(scenario()) == []
