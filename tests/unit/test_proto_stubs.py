"""The committed gRPC stubs are exactly what proto/generate.py makes from proto/."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools not installed")
def test_generated_stubs_do_not_drift_from_proto_sources():
    result = subprocess.run(
        [sys.executable, "proto/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _requirement(name: str) -> "Requirement":
    """pyproject.toml's requirement of `name` (its core dependencies and its extras, one entry a line)."""
    from packaging.requirements import Requirement

    text = (ROOT / "pyproject.toml").read_text()
    found = [
        Requirement(quoted)
        for quoted in re.findall(r'"([A-Za-z0-9_.-]+[<>=!~][^"]*)"', text)
        if Requirement(quoted).name == name
    ]
    assert len(found) == 1, f"pyproject.toml names {name} {len(found)} times"
    return found[0]


def test_the_declared_grpc_and_protobuf_versions_are_the_ones_the_committed_stubs_check_at_import():
    """The stubs raise at import under a grpcio older than the grpcio-tools that generated them, or a protobuf of
    another major version or older than their gencode: pyproject.toml said grpcio>=1.66 and protobuf>=5.27, which
    installs stubs that cannot import; and an unpinned grpcio-tools generated other stubs whenever it was released
    anew (the drift test failed on a fresh install)."""
    pytest.importorskip("packaging")
    stubs = ROOT / "supervisor" / "_proto"
    grpc_generated = {
        re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", path.read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]
        for path in stubs.glob("*_pb2_grpc.py")
    }
    protobuf_gencode = {
        re.search(r"^# Protobuf Python Version: ([0-9.]+)$", path.read_text(), re.MULTILINE).group(1)  # type: ignore[union-attr]
        for path in stubs.glob("*_pb2.py")
    }
    assert len(grpc_generated) == 1 and len(protobuf_gencode) == 1, (grpc_generated, protobuf_gencode)
    (tools,), (gencode,) = grpc_generated, protobuf_gencode
    assert str(_requirement("grpcio-tools").specifier) == f"=={tools}"
    assert str(_requirement("grpcio").specifier) == f">={tools}"
    major = int(gencode.split(".")[0])
    assert set(str(_requirement("protobuf").specifier).split(",")) == {f">={gencode}", f"<{major + 1}"}
