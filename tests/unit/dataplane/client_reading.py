"""A request read as its client reads it: the RequestFailed that iterating its handle raises, as the public endpoints
read a failed request."""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.errors import RequestFailed


def read_failure(handle: RequestHandle) -> RequestFailed:
    """What reading the ended, failed request `handle` to its end raises (the test fails where it raises nothing)."""

    async def read() -> RequestFailed:
        with pytest.raises(RequestFailed) as raised:
            async for _ in handle:
                pass
        return raised.value

    return asyncio.run(read())
