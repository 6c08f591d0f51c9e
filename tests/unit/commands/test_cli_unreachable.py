"""Admin commands with no daemon at --admin-address: one error line, exit 1, and with --format json the error object."""

import json

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
