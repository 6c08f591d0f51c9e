"""The HTTP listener at the daemon's descriptor limit: one failed accept() per wake, then serving again."""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

from stagevisor.supervisor.http.server import HttpServer


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return answer


def test_out_of_descriptors_fails_one_accept_per_wake_and_serves_once_they_are_back(monkeypatch):
    """accept() fails with EMFILE while a client waits: asyncio's accept loop went on to uvicorn's backlog, 2048
    failures (each an ERROR log) and 2048 retries per wake, which grew into tens of thousands a second against a
    daemon at its limit (measured: 57,328 in 10 s). Now one, and the client is served once accept() works."""

    async def scenario() -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        failures: list[str] = []
        loop.set_exception_handler(lambda _loop, context: failures.append(context["message"]))
        server = HttpServer(_ok, "127.0.0.1", 0, log_level="WARNING")
        await server.start()
        real_accept = socket.socket.accept
        short = True

        def accept(sock: socket.socket) -> tuple[socket.socket, Any]:
            if short and sock.getsockname()[1] == server.port:
                raise OSError(errno.EMFILE, "Too many open files")
            return real_accept(sock)

        monkeypatch.setattr(socket.socket, "accept", accept)
        try:
            client = asyncio.create_task(_get(server.port))
            await asyncio.sleep(0.5)  # asyncio tries again 1 s after a failure: this is one wake
            during = len(failures)
            short = False
            answer = await asyncio.wait_for(client, timeout=10)
        finally:
            await server.stop()
        return during, answer

    during, answer = asyncio.run(scenario())
    assert during == 1, f"{during} accept failures in one wake"
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), answer
