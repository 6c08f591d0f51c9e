"""The admin API's peer gate: stopping it with a spliced connection open ends that connection quietly."""

from __future__ import annotations

import asyncio
import os
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
