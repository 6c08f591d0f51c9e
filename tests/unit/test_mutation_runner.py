"""The mutation runner's own rules: which source changes keep a session, and that its bug lists still apply."""

from __future__ import annotations

import importlib.util
import os
import socket
import struct
import sys
import threading
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("mutation_run", ROOT / "tests" / "mutation" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def warm():
    spec = importlib.util.spec_from_file_location("mutation_warm", ROOT / "tests" / "mutation" / "warm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_request_longer_than_one_read_reaches_the_warm_server_whole_with_its_descriptors(warm):
    # A selection of many long test ids plus the environment: far more than one read of the socket.
    request = b'{"args": ["' + b"x" * 500_000 + b'"]}'
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    sender = threading.Thread(target=warm.send_request, args=(client, request, [read_end, write_end]))
    try:
        sender.start()
        received, fds = warm.receive_request(server)
        sender.join(timeout=10)
        assert received == request and len(fds) == 2
        os.write(fds[1], b"!")  # the descriptors are the sender's pipe
        assert os.read(read_end, 1) == b"!"
        for fd in fds:
            os.close(fd)
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        client.close()
        server.close()


def test_a_client_gone_before_its_request_is_complete_is_an_os_error(warm):
    client, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.sendall(struct.pack("!I", 100) + b"{")  # the length of a request, then only its first byte
        client.close()
        with pytest.raises(OSError):
            warm.receive_request(server)
    finally:
        server.close()


BASE = "LIMIT: int = 8\n\n\ndef f(a: int = 2) -> int:\n    return a + LIMIT  # one\n"


@pytest.mark.parametrize(
    "changed",
    [
        "LIMIT: int = 8\n\n\ndef f(a: int = 2) -> list[int]:\n    return a + LIMIT  # one\n",  # a longer return type
        "LIMIT: int = 8\n\n\ndef f(a: int = 2) -> int:\n    return a + LIMIT  # another comment\n",
        "LIMIT: int = 8\n\n\ndef f(a: str = 2) -> int:\n    return a + LIMIT  # one\n",  # same length
    ],
)
def test_a_change_only_inside_annotations_or_comments_keeps_the_session(runner, changed):
    assert runner.same_mutants(BASE, changed)


@pytest.mark.parametrize(
    "changed",
    [
        "LIMIT: int = 9\n\n\ndef f(a: int = 2) -> int:\n    return a + LIMIT  # one\n",  # a value
        "LIMIT: int = 8\n\n\ndef f(a: int = 2) -> int:\n    return a - LIMIT  # one\n",  # an operator
        "LIMIT: list[int] = 8\n\n\ndef f(a: int = 2) -> int:\n    return a + LIMIT  # one\n",  # 8 moved along its line
        "LIMIT: int = 8\n\n\n\ndef f(a: int = 2) -> int:\n    return a + LIMIT  # one\n",  # every line after moved
        "LIMIT: int = 8\n\n\ndef f(a: int = 2) -> int:\n    return a + LIMIT +\n",  # no longer parses
    ],
)
def test_a_change_to_code_or_its_position_starts_a_new_session(runner, changed):
    assert not runner.same_mutants(BASE, changed)


def test_every_planted_bug_can_still_be_planted_exactly_once(runner):
    bugs = runner.load_planted()
    assert len(bugs) >= 44
    for bug in bugs:
        source = (ROOT / bug.source).read_text()
        for old, _ in bug.edits:
            assert source.count(old) == 1, f"{bug.what}: {old!r} is not in {bug.source} exactly once"
        assert all((ROOT / "tests" / "unit" / test).exists() for test in bug.tests), bug.what


def test_every_equivalent_mutant_names_a_module_the_runner_knows_and_gives_a_reason(runner):
    entries = tomllib.loads((ROOT / "tests" / "mutation" / "equivalent.toml").read_text())["equivalent"]
    for entry in entries:
        assert entry["module"] in runner.TARGETS, entry
        assert entry["operator"] and entry["line"].strip() and len(entry["reason"]) > 20, entry


def test_every_module_s_listed_tests_exist(runner):
    for name, target in runner.TARGETS.items():
        assert (ROOT / target.source).exists(), name
        for test in target.tests:
            assert (ROOT / "tests" / "unit" / test).exists(), f"{name}: {test}"
