"""Admin commands with no daemon at --admin-address: one error line, exit 1, and with --format json the error object;
one answering in another protocol than the one dialled is a TLS mismatch (exit 2), told apart by admin.probe."""

import contextlib
import json
import os
import socket
import ssl
import threading
from pathlib import Path

import pytest

from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands.admin import probe
from stagevisor.supervisor.commands.unanswered import Answer
from tests.certificates import make_certificates


@pytest.fixture(autouse=True)
def short_connect_wait(monkeypatch):
    """Every command here waits out the CLI's connect timeout against an address that never answers as gRPC:
    0.5 s instead of 2 s tells the same (no message here names the wait)."""
    from stagevisor.supervisor.commands import admin

    monkeypatch.setattr(admin, "CONNECT_TIMEOUT", 0.5)


@pytest.mark.parametrize("command", [["topology"], ["status"], ["events"], ["apply", "--dry-run"]])
def test_with_format_json_no_daemon_prints_the_error_object_on_stdout(capsys, tmp_path, command):
    """`stagevisor status --format json | jq .state` read an empty stdout: the JSON error contract was not kept."""
    address = f"unix:{tmp_path}/admin.sock"
    code = main([*command, "--format", "json", "--admin-address", address])
    assert code == 1
    out, err = capsys.readouterr()
    message = f"no stagevisor daemon at {address}; start one with stagevisor serve"
    assert err == f"error: {message}\n"
    assert json.loads(out) == {"error": {"code": "DAEMON_UNREACHABLE", "message": message}}


def test_in_table_form_no_daemon_prints_only_the_error_line(capsys, tmp_path):
    address = f"unix:{tmp_path}/admin.sock"
    assert main(["status", "--admin-address", address]) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: no stagevisor daemon at {address}; start one with stagevisor serve\n")


@pytest.mark.parametrize("command", [["stop"], ["status", "--format", "json"], ["top", "--once"]])
def test_a_daemon_that_holds_the_socket_but_does_not_answer_is_named_not_called_absent(capsys, tmp_path, command):
    """A wedged or SIGSTOPped daemon: `stop` said "no stagevisor daemon ...; start one", and `serve` then
    refused with DAEMON_RUNNING. The socket's lock file names the holder; the error names it and how to end it.

    1. a live process (this one) claims the socket, as a daemon does, and listens without ever answering
    2. each command gives up connecting and names that pid, with `kill`, not `serve`
    """
    from stagevisor.supervisor.daemon.runtime_files import SocketClaim

    path = tmp_path / "admin.sock"
    claim = SocketClaim.acquire(path, "--admin-address")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        silent.bind(str(path))
        silent.listen(8)
        address = f"unix:{path}"
        assert main([*command, "--admin-address", address]) == 1
    finally:
        silent.close()
        path.unlink()
        claim.release()
    out, err = capsys.readouterr()
    pid = os.getpid()
    message = (
        f"the stagevisor daemon (pid {pid}) that holds {address} does not answer: it is still starting, "
        f"wedged or stopped (SIGSTOP); wait for it, or end it with `kill {pid}` "
        f"(`kill -KILL {pid}` if it stays; its workers exit with it)"
    )
    assert err == f"error: {message}\n"
    if "json" in command:
        assert json.loads(out) == {"error": {"code": "DAEMON_UNREACHABLE", "message": message}}


# -- a daemon that answers, in another protocol than the one dialled --------------------------------------

SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""An empty HTTP/2 SETTINGS frame: what a plaintext gRPC server sends first on every connection."""


def plaintext_grpc(conn: socket.socket, certs) -> None:
    conn.sendall(SETTINGS_FRAME)
    conn.recv(1024)  # the client's first bytes (a TLS ClientHello is no HTTP/2 preface: a server hangs up)


def tls_server(conn: socket.socket, certs) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
        pass


def hang_up(conn: socket.socket, certs) -> None:
    pass


class Endpoint:
    """A unix socket at `path` that answers each connection with `answer(conn, certs)`, in a thread."""

    def __init__(self, path: Path, answer, certs=None) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.listener.settimeout(0.05)
        self.answer, self.certs = answer, certs
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "Endpoint":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.listener.close()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.answer(conn, self.certs)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize(
    "answer, expected",
    [(plaintext_grpc, Answer.PLAINTEXT), (tls_server, Answer.TLS), (hang_up, Answer.CLOSED)],
)
def test_the_probe_tells_a_plaintext_endpoint_from_a_tls_one_and_from_one_that_hangs_up(
    tmp_path, certs, answer, expected
):
    path = tmp_path / "admin.sock"
    with Endpoint(path, answer, certs):
        assert probe(f"unix:{path}", timeout=5) is expected


def test_the_probe_calls_a_socket_that_sends_nothing_back_silent_and_a_missing_one_nothing(tmp_path):
    path = tmp_path / "admin.sock"
    assert probe(f"unix:{path}", timeout=5) is Answer.NOTHING_LISTENS
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        silent.bind(str(path))
        silent.listen(8)
        assert probe(f"unix:{path}", timeout=0.2) is Answer.SILENT
    finally:
        silent.close()


@pytest.mark.parametrize("address", ["dns:///localhost:50552", "ipv4:127.0.0.1:50552", "localhost"])
def test_the_probe_leaves_address_forms_it_does_not_dial_unknown(address):
    assert probe(address, timeout=0.2) is Answer.UNKNOWN


@pytest.mark.parametrize("command", [["status"], ["topology"], ["top", "--once"], ["stop"]])
def test_a_daemon_answering_in_plaintext_to_a_tls_dial_is_a_tls_mismatch_not_a_wedged_daemon(capsys, tmp_path, command):
    """`status --tls` on a healthy daemon's unix socket said it did not answer, and to `kill -KILL` it.

    1. a live process (this one) claims the socket, as a daemon does, and answers every connection in plaintext
    2. each command dials it with TLS, and says the daemon serves plaintext and to drop --tls; nothing of kill
    """
    from stagevisor.supervisor.daemon.runtime_files import SocketClaim

    path = tmp_path / "admin.sock"
    address = f"unix:{path}"
    claim = SocketClaim.acquire(path, "--admin-address")
    try:
        with Endpoint(path, plaintext_grpc):
            code = main([*command, "--tls", "--admin-address", address])
    finally:
        path.unlink()
        claim.release()
    out, err = capsys.readouterr()
    pid = os.getpid()
    message = (
        f"the stagevisor daemon (pid {pid}) at {address} serves its admin API in plaintext (on a unix socket it "
        "always does: the socket's private directory and peer-credential check protect it), and this command "
        "dialled it with TLS (--tls): drop --tls. The daemon is up; its log says "
        f"`admin API listening on {address} (plaintext, ...)`"
    )
    assert (code, err.splitlines()[-1]) == (2, f"error: {message}")


def test_with_format_json_a_tls_mismatch_is_its_own_error_code(capsys, tmp_path, certs):
    path = tmp_path / "admin.sock"
    address = f"unix:{path}"
    with Endpoint(path, plaintext_grpc):
        code = main(["status", "--format", "json", "--tls-ca", str(certs.ca), "--admin-address", address])
    out, _ = capsys.readouterr()
    assert code == 2
    assert json.loads(out)["error"]["code"] == "TLS_MISMATCH"
    assert "dialled it with TLS (--tls-ca): drop --tls-ca." in json.loads(out)["error"]["message"]


@pytest.fixture
def other_grpc_server(tmp_path):
    """A gRPC server at a unix socket that serves none of stagevisor's services (as an admin address given the
    public endpoint's, or the reverse, sees it)."""
    from concurrent import futures

    import grpc

    address = f"unix:{tmp_path}/other.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(address)
    server.start()
    yield address
    server.stop(None)


def test_an_admin_command_at_a_grpc_server_without_the_admin_api_says_it_is_another_endpoint(capsys, other_grpc_server):
    """`status --admin-address` given the public endpoint printed gRPC's bare `error: Method not found!`."""
    assert main(["status", "--admin-address", other_grpc_server]) == 1
    _, err = capsys.readouterr()
    assert err == (
        f"error: {other_grpc_server} answers gRPC but serves no stagevisor admin API (UNIMPLEMENTED: Method not "
        "found!): it is another endpoint, such as a daemon's public endpoint (--listen); give --admin-address the "
        "address the daemon's log shows as `admin API listening on ...`\n"
    )


def test_synthesize_at_a_grpc_server_without_the_synthesis_api_says_it_is_another_endpoint(
    capsys, tmp_path, other_grpc_server
):
    """`synthesize --address` given the admin socket printed `synthesis failed (UNIMPLEMENTED): Method not found!`;
    then it exited 2 where `status --admin-address` given the public endpoint exits 1 (DAEMON_UNREACHABLE: nothing
    serves the API asked for there), the same mistake the other way round."""
    assert main(["synthesize", "Hi.", "--address", other_grpc_server, "-o", str(tmp_path / "out.wav")]) == 1
    _, err = capsys.readouterr()
    assert err == (
        f"error: {other_grpc_server} answers gRPC but serves no stagevisor public endpoint (UNIMPLEMENTED: Method "
        "not found!): it is another endpoint, such as a daemon's admin API (--admin-address); give --address the "
        "address the daemon's log shows as `public endpoint listening on ...`\n"
    )


def test_an_admin_command_at_an_http_server_says_it_speaks_http_not_grpc(capsys):
    """`status --admin-address` given the HTTP API's address said the daemon "may be overloaded; try again"."""
    import http.server

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # not on the stderr the test reads
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        assert main(["status", "--admin-address", address]) == 1
    finally:
        server.shutdown()
        server.server_close()
    _, err = capsys.readouterr()
    assert err == (
        f"error: {address} answers, but not with gRPC (it does not speak HTTP/2): an HTTP/1.x server, such as a "
        "daemon's HTTP API (--http); give --admin-address the address the daemon's log shows as `admin API "
        "listening on ...`\n"
    )


def test_a_daemon_that_goes_away_under_a_call_is_a_lost_connection_not_no_daemon(tmp_path, monkeypatch):
    """`events` following a daemon that was then SIGKILLed said "no stagevisor daemon at ...; start one with
    stagevisor serve", as if it had never reached one."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from stagevisor.supervisor.cli import build_parser
    from stagevisor.supervisor.commands.admin import Unreachable, call, unreachable_error

    class Dropped(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "Socket closed"

    def dropped(stub):
        raise Dropped()

    monkeypatch.delenv("STAGEVISOR_API_KEY", raising=False)
    address = f"unix:{tmp_path}/admin.sock"
    server = grpc.server(ThreadPoolExecutor(1))  # answers HTTP/2 on the socket: the call connects
    server.add_insecure_port(address)
    server.start()
    try:
        args = build_parser().parse_args(["events", "--admin-address", address])
        with pytest.raises(Unreachable) as raised:
            call(args, dropped)
    finally:
        server.stop(0)
    assert raised.value.lost
    assert unreachable_error(args, raised.value).to_json() == {
        "error": {
            "code": "DAEMON_UNREACHABLE",
            "message": f"lost the connection to the daemon at {address} (Socket closed): it stopped or restarted; "
            "`stagevisor status` says whether one serves there now",
        }
    }


def test_synthesize_at_a_plaintext_endpoint_dialled_with_tls_says_so_in_the_admin_commands_line(
    capsys, tmp_path, other_grpc_server
):
    """synthesize printed `error: TLS_MISMATCH: the stagevisor daemon ...` where `status` prints `error: the
    stagevisor daemon ...`: every command's error line is `error: <message>`. Both exit 2."""
    code = main(["synthesize", "Hi.", "--address", other_grpc_server, "--tls", "-o", str(tmp_path / "out.wav")])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"error: the stagevisor daemon at {other_grpc_server} serves its public endpoint in "), err
