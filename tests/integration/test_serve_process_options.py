"""The ServeProcess helper's own options are defaults: a test's `--stop-timeout` or `--http` is the one in force.

It appended `--stop-timeout 5` after the test's options, so argparse kept 5 and a test passing `--stop-timeout 2`
(test_apply_daemon's shutdown during an apply) ran under 5 s while it said "past --stop-timeout"."""

import shutil

from stagevisor.supervisor.cli import build_parser
from tests.integration.daemon_helpers import ServeProcess


def parsed(daemon: ServeProcess):
    try:
        return build_parser().parse_args(daemon.argv[3:])  # after `python -m stagevisor`
    finally:
        shutil.rmtree(daemon.tmp, ignore_errors=True)


def test_a_test_s_own_stop_timeout_and_http_win_over_the_helper_s_defaults():
    args = parsed(ServeProcess("--model-path", "demo", "--stop-timeout", "2", "--http", "127.0.0.1:0"))
    assert (args.stop_timeout, args.http) == (2.0, "127.0.0.1:0")


def test_without_options_of_its_own_a_test_gets_the_helper_s_defaults_and_its_sockets():
    daemon = ServeProcess("--model-path", "demo")
    admin, listen = daemon.admin_address, daemon.listen
    args = parsed(daemon)
    assert (args.stop_timeout, args.http, args.admin_address, args.listen) == (5.0, "none", admin, listen)
