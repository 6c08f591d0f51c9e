"""A warm pytest for mutation runs: heavy imports once, a fresh forked process per mutant.

Each mutant's test run used to start a new interpreter that imported pytest,
its plugins, and torch, grpc, pydantic and numpy before running a single test
(seconds on a loaded 2-core machine, more than most test runs themselves).
`serve` imports those once and waits on a unix socket; `run` (the test command
cosmic-ray starts per mutant) hands it its stdout/stderr and the pytest
arguments; the server forks, and the child runs pytest with them and exits.
stagevisor itself is never imported by the server, so every child imports the
(mutated) sources afresh, from source (no bytecode is written or trusted for
them, see run.py).

If the client's process is killed (cosmic-ray's per-mutant timeout), the
server kills the child's process group. If the server cannot be reached,
`run` runs pytest itself, in-process: slower, never a different result.

    python tests/mutation/warm.py serve SOCKET MODULE...   # preload MODULEs, serve until killed
    python tests/mutation/warm.py run SOCKET -- PYTEST-ARGS
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

_REPLY = struct.Struct("!i")


def serve(path: str, preload: list[str]) -> None:
    sys.dont_write_bytecode = True  # the module under mutation must always be compiled from source
    import pytest  # noqa: F401  (imported here so that every child finds it loaded)

    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a library this environment lacks: the tests that need it skip or fail as they would anyway
    loaded = [m for m in sys.modules if m == "stagevisor" or m.startswith(("stagevisor.", "supervisor", "tests."))]
    if loaded:
        raise SystemExit(f"warm.py: preloading imported {loaded[0]}; the server must not hold project code")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        try:
            _serve_one(listener, conn)
        except OSError:
            pass  # the client went away before its request was complete
        finally:
            conn.close()


def _serve_one(listener: socket.socket, conn: socket.socket) -> None:
    message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:  # the child: the client's stdout/stderr, its working directory, a process group of its own
        code = 70
        try:
            os.setpgid(0, 0)
            listener.close()
            conn.close()
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = ["pytest", *request["args"]]
            import pytest

            code = int(pytest.main(request["args"]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn.sendall(_REPLY.pack(os.waitstatus_to_exitcode(status)))
            return
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1):  # the client is gone (timed out and killed): so is its test run
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return


def run(path: str, args: list[str]) -> int:
    request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        socket.send_fds(conn, [request], [1, 2])
        reply = b""
        while len(reply) < _REPLY.size:
            chunk = conn.recv(_REPLY.size - len(reply))
            if not chunk:
                raise ConnectionError("the warm server closed the connection")
            reply += chunk
        return _REPLY.unpack(reply)[0]
    except OSError as error:
        print(f"warm.py: no warm server at {path} ({error}); running pytest here", file=sys.stderr, flush=True)
        import pytest

        return int(pytest.main(args))


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3:])
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "run" and sys.argv[3] == "--":
        return run(sys.argv[2], sys.argv[4:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
