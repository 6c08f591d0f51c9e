"""`serve` keeps gRPC core's own stderr lines out of the operator's way unless asked for."""

from __future__ import annotations

import os

from stagevisor.supervisor.commands.serve import _quiet_libraries


def test_grpc_core_is_silenced_at_info_and_speaks_at_debug(monkeypatch):
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    _quiet_libraries("DEBUG")
    assert "GRPC_VERBOSITY" not in os.environ
    _quiet_libraries("INFO")
    assert os.environ["GRPC_VERBOSITY"] == "NONE"


def test_an_operators_own_grpc_verbosity_is_kept(monkeypatch):
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    _quiet_libraries("INFO")
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


def test_uvicorn_logs_its_own_lines_only_at_debug():
    from stagevisor.supervisor.http.server import uvicorn_config

    quiet, loud = uvicorn_config(object(), log_level="INFO"), uvicorn_config(object(), log_level="DEBUG")
    assert (quiet.log_level, quiet.access_log) == ("warning", False)
    assert (loud.log_level, loud.access_log) == ("debug", True)
    assert uvicorn_config(object(), log_level="ERROR").log_level == "error"
