"""How a request ends for its client (RequestHandle): its branches, its failure, its idle timeout, its credits."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.errors import RequestFailed
from tests.fakes import outcome


class Owner:
    """The gateway, as a handle sees it."""

    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []
        self.closed: list[str] = []

    def close_request(self, handle: RequestHandle) -> None:
        self.closed.append(handle.request_id)

    def cancel_everywhere(self, request_id: str, reason: str) -> None:
        self.cancelled.append((request_id, reason))

    def retry_after_unavailable(self) -> int:
        return 3


def test_a_request_that_fans_out_ends_when_its_last_branch_is_done():
    handle = RequestHandle(Owner(), "r1", expected_done=2)
    assert handle.finish_branch((("a", "b", "grpc"),)) is False and not handle.ended
    assert handle.finish_branch((("a", "c", "in_process"),)) is True and handle.ended
    assert handle.finish_branch(()) is False  # a late branch ends nothing again
    assert handle.hops == {("a", "b", "grpc"), ("a", "c", "in_process")}
    assert asyncio.run(outcome(handle)) == []


def test_a_request_ends_once_whichever_comes_first():
    failed_first = RequestHandle(Owner(), "r1", expected_done=1)
    assert failed_first.fail("UNAVAILABLE", "gone", "vocoder") is True
    assert failed_first.fail("INTERNAL", "later") is False and failed_first.finish_branch(()) is False
    error = asyncio.run(outcome(failed_first))
    assert isinstance(error, RequestFailed) and (error.status, error.message, error.stage) == (
        "UNAVAILABLE",
        "gone",
        "vocoder",
    )
    done_first = RequestHandle(Owner(), "r2", expected_done=1)
    assert done_first.finish_branch(()) is True and done_first.fail("INTERNAL", "late") is False
    assert asyncio.run(outcome(done_first)) == []


def test_a_request_the_pipeline_leaves_idle_fails_once_and_is_cancelled_where_it_may_still_run():
    owner = Owner()
    handle = RequestHandle(owner, "r1", expected_done=1, idle_timeout=0.1)
    handle.keep_alive()  # before anyone waits: nothing to restart
    error = asyncio.run(outcome(handle))
    assert isinstance(error, RequestFailed) and error.status == "UNAVAILABLE" and "for 0.1 s" in error.message
    assert [request_id for request_id, _ in owner.cancelled] == ["r1"]


def test_chunks_that_keep_coming_hold_off_the_idle_timeout_however_long_the_request():
    async def scenario():
        handle = RequestHandle(Owner(), "r1", expected_done=1, idle_timeout=1.0)
        reading = asyncio.ensure_future(outcome(handle))
        for i in range(10):  # 1.5 s in all, past the idle timeout, a chunk every 0.15 s
            await asyncio.sleep(0.15)
            handle.push({"i": i}, lambda: None)
        handle.finish_branch(())
        return await reading

    assert asyncio.run(scenario()) == [{"i": i} for i in range(10)]


def test_closing_a_request_returns_the_credits_of_chunks_its_client_never_read():
    owner = Owner()
    handle = RequestHandle(owner, "r1", expected_done=1)
    credits = []
    handle.push({"i": 0}, lambda: credits.append(0))
    handle.push({"i": 1}, lambda: credits.append(1))
    handle.finish_branch(())
    handle.close()
    assert credits == [0, 1] and owner.closed == ["r1"]


def test_an_unavailable_failure_says_when_to_retry_and_no_other_does():
    """Before: a request failed because its worker went down carried no retry time (HTTP: no Retry-After)."""
    unavailable, internal = RequestHandle(Owner(), "r1", expected_done=1), RequestHandle(Owner(), "r2", 1)
    unavailable.fail("UNAVAILABLE", "its worker went down")
    internal.fail("INTERNAL", "the stage crashed")
    assert asyncio.run(outcome(unavailable)).retry_after == 3
    assert asyncio.run(outcome(internal)).retry_after is None
