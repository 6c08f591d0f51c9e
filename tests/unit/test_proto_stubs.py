"""The committed gRPC stubs are exactly what proto/generate.py makes from proto/."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_stubs_do_not_drift_from_proto_sources():
    result = subprocess.run(
        [sys.executable, "proto/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
