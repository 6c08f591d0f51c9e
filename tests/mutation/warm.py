"""A warm pytest for mutation runs: heavy imports once, a fresh forked process per mutant.

Each mutant's test run used to start a new interpreter that imported pytest,
its plugins, and torch, grpc, pydantic and numpy before running a single test
(seconds on a loaded 2-core machine, more than most test runs themselves).
`serve` imports those once, and every project module that does not import
the module under mutation (found by run.py from the import statements), and
waits on a unix socket; `run` (the test command
cosmic-ray starts per mutant) hands it its stdout/stderr and the pytest
arguments; the server forks, and the child runs pytest with them and exits.
The module under mutation, and every module that imports it, is never
imported by the server, so every child imports them afresh, from the mutated
source (no bytecode is written or trusted for it, see run.py).

If the client's process is killed (cosmic-ray's per-mutant timeout), the
server kills the child's process group. If the server cannot be reached, or
closes the connection without an exit status, `run` does not test the mutant
at all: it kills the test run the server started (if any), prints LOST, marks
the server lost (a file beside its socket, SOCKET.lost) and exits with
LOST_EXIT. run.py restarts the server and tests such mutants again; a cold
pytest instead (seconds of imports per mutant) could run past the timeout
and be counted as killed although no test failed.

Only the tests that execute the mutated statement run (as mutmut does): `map`
runs the unmutated tests once under coverage, one context per test, and
writes which tests execute each line of the module; `run --select` compares
the module with its unmutated copy and passes pytest those tests' ids. A test
that never executes a statement behaves the same whatever the statement says,
so this changes no outcome. The whole selection runs instead when the
mutated statement runs at import time (module and class bodies, signatures,
decorators) or when no test is recorded executing it (code run only in other
threads or processes may be unrecorded).

    python tests/mutation/warm.py serve SOCKET --without MODULE PRELOAD...   # serve until killed
    python tests/mutation/warm.py map MODULE-FILE OUT.json -- PYTEST-ARGS
    python tests/mutation/warm.py run SOCKET [--select OUT.json UNMUTATED-COPY MODULE-FILE] -- PYTEST-ARGS
"""

from __future__ import annotations

import ast
import difflib
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

_REPLY = struct.Struct("!i")  # the test run's process id as soon as it is forked, then its exit status
LOST = "warm.py: the warm pytest server is lost"
"""The first words of what `run` prints when the mutant was not tested; run.py looks for them."""
LOST_EXIT = 75  # EX_TEMPFAIL: nothing was tested, try again
_LENGTH = struct.Struct("!I")  # a request is its length, then that many bytes of JSON


def send_request(conn: socket.socket, request: bytes, fds: list[int]) -> None:
    """One request, framed by its length: a stream socket may deliver a long one in several pieces."""
    framed = _LENGTH.pack(len(request)) + request
    sent = socket.send_fds(conn, [framed], fds)
    if sent < len(framed):  # not an empty send: the server may have answered and hung up already (EPIPE)
        conn.sendall(framed[sent:])


def receive_request(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The request send_request sent and the file descriptors that came with its first piece."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    try:
        while len(data) < _LENGTH.size or len(data) < _LENGTH.size + _LENGTH.unpack_from(data)[0]:
            chunk = conn.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the client went away before its request was complete")
            data += chunk
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return data[_LENGTH.size :], fds


def serve(path: str, preload: list[str], without: str) -> None:
    sys.dont_write_bytecode = True  # the module under mutation must always be compiled from source
    import threading

    import pytest  # noqa: F401  (imported here so that every child finds it loaded)

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this environment cannot import: the children try it themselves
            pass
    # The module under mutation (and so everything importing it) must be imported afresh in each
    # child, and fork() is only safe without other threads: exit 3 (the caller preloads less).
    if without in sys.modules or any(m.startswith("tests.") for m in sys.modules):
        print(f"warm.py: preloading imported {without}", file=sys.stderr, flush=True)
        sys.exit(3)
    if threading.active_count() > 1:
        print(f"warm.py: preloading started threads: {threading.enumerate()}", file=sys.stderr, flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, _stop)
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


_running: list[int] = []  # the test run in progress, if any


def _stop(signum, frame) -> None:
    """SIGTERM: the test run in progress goes too."""
    for pid in _running:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(0)


def _serve_one(listener: socket.socket, conn: socket.socket) -> None:
    message, fds = receive_request(conn)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:  # the child: the client's stdout/stderr, its working directory, a process group of its own
        code = 70
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
    try:
        os.setpgid(pid, pid)  # as the child does: whichever runs first, killpg(pid) reaches the whole run
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    _running[:] = [pid]
    try:
        try:
            conn.sendall(_REPLY.pack(pid))  # so that a client who loses this server can stop the run itself
        except OSError:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        _wait(pid, conn)
    finally:
        _running.clear()


def _wait(pid: int, conn: socket.socket) -> None:
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


def lost_marker(path: str) -> str:
    """The file `run` creates when it finds the server at `path` gone or answering badly."""
    return path + ".lost"


def _receive_int(conn: socket.socket) -> int:
    reply = b""
    while len(reply) < _REPLY.size:
        chunk = conn.recv(_REPLY.size - len(reply))
        if not chunk:
            raise ConnectionError("the warm server closed the connection without an answer")
        reply += chunk
    return _REPLY.unpack(reply)[0]


def run(path: str, args: list[str]) -> int:
    """The test run's exit status from the warm server at `path`; LOST_EXIT, having tested nothing, without it."""
    request = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    pid = None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(path)
            send_request(conn, request, [1, 2])
            pid = _receive_int(conn)
            return _receive_int(conn)
    except OSError as error:
        if pid is not None and pid > 0:  # the server went away mid-run: its test run must not outlive this mutant
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        with open(lost_marker(path), "a") as marker:
            marker.write(f"{error}\n")
        print(f"{LOST} at {path} ({error}); this mutant was not tested", flush=True)
        return LOST_EXIT


def line_map(module: str, out: str) -> object:
    """A pytest plugin: which tests (node ids) execute which lines of one file, by coverage contexts."""
    import pytest

    class LineMap(_LineMap):
        @pytest.hookimpl(tryfirst=True)  # before any fixture of the test runs
        def pytest_runtest_setup(self, item) -> None:
            self.cov.switch_context(item.nodeid)

    return LineMap(module, out)


class _LineMap:
    def __init__(self, module: str, out: str) -> None:
        self.module, self.out = os.path.realpath(module), out
        self.order: list[str] = []

    def pytest_sessionstart(self, session) -> None:
        import coverage

        self.cov = coverage.Coverage(data_file=None, config_file=False)
        self.cov.start()

    def pytest_collection_finish(self, session) -> None:
        self.order = [item.nodeid for item in session.items]

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.cov.switch_context("")

    def pytest_sessionfinish(self, session) -> None:
        self.cov.stop()
        data = self.cov.get_data()
        files = [f for f in data.measured_files() if os.path.realpath(f) == self.module]
        lines: dict[int, set[str]] = {}
        for measured in files:
            for line, contexts in data.contexts_by_lineno(measured).items():
                lines.setdefault(line, set()).update(contexts)
        with open(self.out, "w") as out:
            json.dump({"tests": self.order, "lines": {str(k): sorted(v) for k, v in lines.items()}}, out)


def _changed_lines(old: list[str], new: list[str]) -> set[int]:
    changed: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            changed.update(range(i1 + 1, max(i2, i1 + 1) + 1))
    return changed


def _statement_lines(source: str, line: int) -> range | None:
    """The lines of the innermost statement holding `line` (its header only, for a compound one)."""
    best = None
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.lineno <= line <= node.end_lineno:
            if best is None or node.end_lineno - node.lineno < best.end_lineno - best.lineno:
                best = node
    if best is None:
        return None
    body = getattr(best, "body", None)
    if isinstance(body, list) and body and line < body[0].lineno:
        return range(best.lineno, body[0].lineno)
    return range(best.lineno, best.end_lineno + 1)


def select_tests(args: list[str], linemap: str, unmutated: str, module: str) -> tuple[list[str], str]:
    """`args` with its test files replaced by the ids of the tests that execute the mutated statements."""
    with open(unmutated) as f:
        old = f.read()
    with open(module) as f:
        new = f.read()
    with open(linemap) as f:
        recorded = json.load(f)
    executed = recorded["lines"]
    tests: set[str] = set()
    changed = _changed_lines(old.splitlines(), new.splitlines())
    if not changed:
        return args, "the module is unmutated: all tests"
    for line in changed:
        span = _statement_lines(old, line)
        if span is None:
            return args, "the mutated line is outside any statement: all tests"
        for number in span:
            contexts = executed.get(str(number), [])
            if "" in contexts:
                return args, f"line {number} runs at import time: all tests"
            tests.update(contexts)
    if not tests:
        return args, "no test is recorded executing the mutated statement: all tests"
    options = [a for a in args if not a.endswith(".py")]
    chosen = [t for t in recorded["tests"] if t in tests]
    return options + chosen, f"{len(chosen)} of {len(recorded['tests'])} tests execute the mutated statement"


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) >= 4 and argv[0] == "serve" and argv[2] == "--without":
        serve(argv[1], argv[4:], argv[3])
        return 0
    if len(argv) >= 4 and argv[0] == "map" and argv[3] == "--":
        import pytest

        return int(pytest.main(argv[4:], plugins=[line_map(argv[1], argv[2])]))
    if len(argv) >= 3 and argv[0] == "run" and "--" in argv:
        split = argv.index("--")
        options, args = argv[2:split], argv[split + 1 :]
        if options[:1] == ["--select"] and len(options) == 4:
            args, why = select_tests(args, *options[1:])
            print(f"warm.py: {why}", file=sys.stderr, flush=True)
        elif options:
            print(__doc__, file=sys.stderr)
            return 2
        return run(argv[1], args)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
