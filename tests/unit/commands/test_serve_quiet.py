"""`serve` keeps gRPC core's and uvicorn's own lines out of the operator's way unless asked for."""

from __future__ import annotations

import os

import pytest

from stagevisor.supervisor import cli


@pytest.fixture
def chosen(monkeypatch):
    """The GRPC_VERBOSITY the CLI sets for a command line (the handler is not run)."""
    monkeypatch.setattr(cli, "build_parser", _parser_without_handlers(cli.build_parser))

    def choose(*argv: str) -> str | None:
        monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
        cli.main(list(argv))
        return os.environ.get("GRPC_VERBOSITY")

    return choose


def _parser_without_handlers(build):
    def parser():
        built = build()
        real = built.parse_args

        def parse_args(argv):
            args = real(argv)
            args.handler = lambda _args: 0
            return args

        built.parse_args = parse_args
        return built

    return parser


def test_serve_silences_grpc_core_unless_debug_and_other_commands_keep_its_errors(chosen):
    assert chosen("serve") == "NONE"
    assert chosen("serve", "--log-level", "debug") == "ERROR"
    assert chosen("plan") == "ERROR"


def test_an_operators_own_grpc_verbosity_is_kept(monkeypatch):
    monkeypatch.setattr(cli, "build_parser", _parser_without_handlers(cli.build_parser))
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    cli.main(["serve"])
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


def test_uvicorn_logs_its_own_lines_only_at_debug():
    from stagevisor.supervisor.http.server import uvicorn_config

    quiet, loud = uvicorn_config(object(), log_level="INFO"), uvicorn_config(object(), log_level="DEBUG")
    assert (quiet.log_level, quiet.access_log) == ("warning", False)
    assert (loud.log_level, loud.access_log) == ("debug", True)
    assert uvicorn_config(object(), log_level="ERROR").log_level == "error"
