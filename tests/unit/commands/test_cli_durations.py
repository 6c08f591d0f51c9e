"""Durations in seconds: nan, infinity or a value out of range is a usage error (exit 2) naming the option.

`value < 0` is false for nan, so `--drain-timeout nan` started a daemon, `--start-timeout nan` failed
every worker after it started (`did not report READY within nans`), `stop --grace nan` was sent to the
daemon, and `synthesize --timeout -1` was sent and came back as DEADLINE_EXCEEDED (exit 1).
"""

import logging

import pytest

from stagevisor.supervisor.cli import main


@pytest.fixture
def root_logging(monkeypatch):
    """`serve` configures the root logger before it checks these options: leave it as it was. And a daemon
    that would start anyway (the options accepted) returns at once instead."""
    from stagevisor.supervisor import service

    async def started(plan, options, **http_api):  # service.run's signature: the HTTP API's settings by keyword
        return 0

    monkeypatch.setattr(service, "run", started)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("option", ["--drain-timeout", "--stop-timeout", "--start-timeout", "--heartbeat-timeout"])
def test_serve_refuses_a_duration_that_is_not_a_finite_number_before_starting(
    capsys, tmp_path, root_logging, option, value
):
    sockets = ["--listen", f"unix:{tmp_path}/pub.sock", "--admin-address", f"unix:{tmp_path}/admin.sock"]
    assert main(["serve", *sockets, "--http", "none", option, value]) == 2
    assert f"error: {option} must be a finite number of seconds >= 0, got {value}\n" in capsys.readouterr().err
    assert not (tmp_path / "admin.sock").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stop", "--grace", "nan"], "--grace must be a finite number of seconds >= 0, got nan"),
        (["top", "--once", "--interval", "nan"], "--interval must be a finite number of seconds > 0, got nan"),
        (["synthesize", "Hi", "--timeout", "-1"], "--timeout must be a finite number of seconds > 0, got -1.0"),
        (["synthesize", "Hi", "--timeout", "nan"], "--timeout must be a finite number of seconds > 0, got nan"),
    ],
)
def test_client_commands_refuse_such_a_duration_before_dialling(capsys, tmp_path, argv, message):
    address = "--address" if argv[0] == "synthesize" else "--admin-address"
    assert main([*argv, address, f"unix:{tmp_path}/none.sock"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--rate", "--rate must be a finite number > 0 of requests per second, got nan"),
        # It said "--requests must be >= 1 and --duration > 0", not the seconds wording of the other commands.
        ("--duration", "--duration must be a finite number of seconds > 0, got nan"),
    ],
)
def test_bench_refuses_a_rate_or_duration_of_nan_before_starting_a_daemon(capsys, option, message):
    assert main(["bench", option, "nan"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("uid", ["-5", "99999999999", "4294967295", "abc"])
def test_serve_refuses_an_admin_uid_that_no_user_can_have(capsys, tmp_path, root_logging, uid):
    """Before: the daemon started, logged the uid, and opened its admin socket's mode to others (0666) for it."""
    sockets = ["--listen", f"unix:{tmp_path}/pub.sock", "--admin-address", f"unix:{tmp_path}/admin.sock"]
    assert main(["serve", *sockets, "--http", "none", "--admin-allow-uid", uid]) == 2
    err = capsys.readouterr().err
    assert "argument --admin-allow-uid" in err and "is not a user id" in err


@pytest.mark.parametrize("seconds", ["3", "10"])
def test_serve_refuses_a_pipeline_idle_timeout_a_worker_cannot_keep_a_request_alive_within(
    capsys, tmp_path, root_logging, seconds
):
    """Workers say which requests they hold every 5 s: `--pipeline-idle-timeout 3` failed a request whose stage was
    still running after 3 s, "a worker on its route cannot answer"."""
    sockets = ["--listen", f"unix:{tmp_path}/pub.sock", "--admin-address", f"unix:{tmp_path}/admin.sock"]
    assert main(["serve", *sockets, "--http", "none", "--pipeline-idle-timeout", seconds]) == 2
    assert "give more than 10 s" in capsys.readouterr().err
    assert main(["serve", *sockets, "--http", "none", "--pipeline-idle-timeout", "10.5"]) == 0
