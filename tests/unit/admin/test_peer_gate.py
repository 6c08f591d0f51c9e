"""The admin API's peer gate: stopping it with a spliced connection open ends that connection quietly; out of
descriptors, it fails one accept per wake."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import tempfile
from pathlib import Path

from stagevisor.supervisor.admin.peer_gate import PeerGate, bind_path_listener


async def stop_with_a_connection_open(directory: Path) -> list[dict]:
    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    spliced = asyncio.Event()

    async def behind(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        spliced.set()
        await reader.read()  # the admin API's side: holds the connection until the gate cuts it
        writer.close()

    target = directory / "behind.sock"
    server = await asyncio.start_unix_server(behind, path=str(target))
    uids = frozenset({os.getuid()})
    gate = PeerGate(bind_path_listener(directory / "gate.sock", uids), target, uids)
    await gate.start()
    _, writer = await asyncio.open_unix_connection(str(directory / "gate.sock"))
    await asyncio.wait_for(spliced.wait(), 10)
    await asyncio.wait_for(gate.stop(), 10)  # as the daemon's shutdown does, an Apply call still waiting
    for _ in range(3):  # the accepted connection's done callback runs on a later turn of the loop
        await asyncio.sleep(0)
    writer.close()
    server.close()
    await server.wait_closed()
    return errors


def test_stopping_the_gate_with_a_connection_open_logs_no_error():
    # Before, the connection's task ended cancelled and asyncio's stream callback (Python 3.11) logged an ERROR
    # with a CancelledError traceback on every shutdown that found an admin call open (an apply waiting, a watcher).
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        errors = asyncio.run(stop_with_a_connection_open(Path(directory)))
    assert errors == []


async def out_of_descriptors(directory: Path, monkeypatch) -> tuple[int, bytes]:
    loop = asyncio.get_running_loop()
    failures: list[str] = []
    loop.set_exception_handler(lambda _, context: failures.append(context["message"]))

    async def behind(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"admin")
        await writer.drain()
        writer.close()

    target = directory / "behind.sock"
    server = await asyncio.start_unix_server(behind, path=str(target))
    uids = frozenset({os.getuid()})
    listener = bind_path_listener(directory / "gate.sock", uids)
    gate = PeerGate(listener, target, uids)
    await gate.start()
    real_accept = socket.socket.accept
    short = True

    def accept(sock: socket.socket) -> tuple[socket.socket, object]:
        if short and sock is listener:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(sock)

    monkeypatch.setattr(socket.socket, "accept", accept)
    try:
        reader, writer = await asyncio.open_unix_connection(str(directory / "gate.sock"))
        await asyncio.sleep(0.5)  # asyncio tries again 1 s after a failure: this is one wake
        during = len(failures)
        short = False
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await asyncio.wait_for(gate.stop(), 10)
        server.close()
        await server.wait_closed()
    return during, answer


def test_out_of_descriptors_the_gate_fails_one_accept_per_wake_and_admits_once_they_are_back(monkeypatch):
    # asyncio's accept loop went on to the listen backlog (100 calls) after an EMFILE, each an ERROR log and a
    # retry of its own (addresses.Listener).
    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        during, answer = asyncio.run(out_of_descriptors(Path(directory), monkeypatch))
    assert during == 1, f"{during} accept failures in one wake"
    assert answer == b"admin"
