"""No code of the project or its tests starts a child process with `preexec_fn`.

With `preexec_fn`, `subprocess` forks with fork() rather than vfork(), which runs gRPC's fork handlers: with
gRPC live in the parent they restart its poller thread in the child, and the child's closing of descriptors
before exec kills it about one time in six (tests/integration/test_exec_as.py). Children start through
multiprocessing's spawn and fork server, or subprocess without `preexec_fn` (`start_new_session` keeps vfork);
a test child that needs a limit or a signal disposition set first starts through tests/integration/exec_as.py.
(A few tests fork on purpose and never exec: the child runs on in this interpreter, descriptors kept.)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("supervisor", "stages", "models", "tests", "deploy")


def preexec_calls(source: str, name: str) -> list[str]:
    """The calls in `source` that pass `preexec_fn`, as `name:line`."""
    tree = ast.parse(source, name)
    return [
        f"{name}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and any(keyword.arg == "preexec_fn" for keyword in node.keywords)
    ]


def test_no_child_process_starts_with_preexec_fn():
    paths = [path for top in TREES for path in sorted((ROOT / top).rglob("*.py"))]
    found = [hit for path in paths for hit in preexec_calls(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, f"start these through tests/integration/exec_as.py (or without preexec_fn): {found}"


def test_the_check_finds_a_preexec_fn_anywhere_in_a_call():
    sample = "import os, subprocess\nsubprocess.run(['true'], text=True, preexec_fn=os.setsid)\nos.setsid()\n"
    assert preexec_calls(sample, "sample.py") == ["sample.py:2"]
