"""Admin commands with no daemon at --admin-address: one error line, exit 1, and with --format json the error object."""

import json
import os
import socket

import pytest

from stagevisor.supervisor.cli import main


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
