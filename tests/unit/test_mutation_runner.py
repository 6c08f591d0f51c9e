"""The mutation runner's own rules: which source changes keep a session, and that its bug lists still apply."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sqlite3
import struct
import subprocess
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


def test_a_mutant_no_warm_server_answers_for_is_not_tested_cold_but_marked_lost(warm, tmp_path, capfd):
    path = str(tmp_path / "gone.sock")  # nothing listens here
    assert warm.run(path, ["-q", str(tmp_path / "test_never_collected.py")]) == warm.LOST_EXIT
    out = capfd.readouterr().out
    assert out.startswith(warm.LOST) and "not tested" in out
    assert "collected" not in out and "no tests ran" not in out  # no pytest ran in its place
    assert Path(warm.lost_marker(path)).exists()


def test_a_warm_server_that_closes_without_an_exit_status_marks_the_mutant_lost(warm, tmp_path, capfd):
    path = str(tmp_path / "warm.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def answer_badly() -> None:  # takes the request, says which run it started (none: 0), then hangs up
        conn, _ = listener.accept()
        with conn:
            _, fds = warm.receive_request(conn)
            for fd in fds:
                os.close(fd)
            conn.sendall(struct.pack("!i", 0))

    server = threading.Thread(target=answer_badly)
    server.start()
    try:
        assert warm.run(path, ["-q"]) == warm.LOST_EXIT
    finally:
        server.join(timeout=10)
        listener.close()
    assert "without an answer" in capfd.readouterr().out
    assert "without an answer" in Path(warm.lost_marker(path)).read_text()


class FakeRun:
    """A cosmic-ray run that ends after `polls` waits, or when interrupted."""

    def __init__(self, polls: int) -> None:
        self.polls, self.signals = polls, []

    def wait(self, timeout: float | None = None) -> int:
        if self.signals or timeout is None:
            return -2
        self.polls -= 1
        if self.polls > 0:
            raise subprocess.TimeoutExpired("cosmic-ray", timeout)
        return 0

    def send_signal(self, number: int) -> None:
        self.signals.append(number)


class FakeServer:
    """A warm server lost at the given polls (counted from 1)."""

    def __init__(self, lost_at: set[int]) -> None:
        self.lost_at, self.polls, self.restarts = lost_at, 0, 0

    def lost(self) -> str | None:
        self.polls += 1
        return "the server exited with status -9" if self.polls in self.lost_at else None

    def restart(self) -> None:
        self.restarts += 1


def test_a_lost_warm_server_is_restarted_and_the_run_goes_on(runner):
    server = FakeServer(lost_at={2})
    assert runner.supervise(FakeRun(polls=4), server, "streams", poll=0) == (0, 1)
    assert server.restarts == 1


def test_a_warm_server_lost_once_too_often_stops_the_run_saying_so(runner):
    run, server = FakeRun(polls=100), FakeServer(lost_at={1, 2, 3, 4})
    with pytest.raises(SystemExit, match=r"streams: the warm pytest server was lost again after 3 restarts"):
        runner.supervise(run, server, "streams", poll=0)
    assert server.restarts == runner.MAX_RESTARTS == 3
    assert run.signals == [signal.SIGINT]  # cosmic-ray puts the module's source back on SIGINT


def test_only_mutants_a_lost_server_did_not_test_are_forgotten(runner, warm, tmp_path):
    session = tmp_path / "m.sqlite"
    with sqlite3.connect(session) as db:
        db.execute("CREATE TABLE work_results (job_id TEXT, test_outcome TEXT, output TEXT)")
        db.executemany(
            "INSERT INTO work_results VALUES (?, ?, ?)",
            [
                ("a", "KILLED", "1 failed"),
                ("b", "KILLED", "timeout"),
                ("c", "KILLED", f"{warm.LOST} at x.sock (refused); this mutant was not tested\n"),
                ("d", "KILLED", f"....\n{warm.LOST} at x.sock (closed); this mutant was not tested\n"),
            ],
        )
    assert runner.forget_lost(session) == 2
    with sqlite3.connect(session) as db:
        assert [job for (job,) in db.execute("SELECT job_id FROM work_results ORDER BY job_id")] == ["a", "b"]


def test_the_report_counts_mutants_killed_by_a_timeout_apart(runner, tmp_path, capsys):
    (tmp_path / "streams.source").write_text((ROOT / runner.TARGETS["streams"].source).read_text())
    with sqlite3.connect(tmp_path / "streams.sqlite") as db:
        db.execute("CREATE TABLE mutation_specs (job_id TEXT, operator_name TEXT, start_pos_row INT)")
        db.execute(
            "CREATE TABLE work_results (job_id TEXT, worker_outcome TEXT, test_outcome TEXT, diff TEXT, output TEXT)"
        )
        operator = "core/ReplaceComparisonOperator_Lt_LtE"
        db.executemany("INSERT INTO mutation_specs VALUES (?, ?, 1)", [(job, operator) for job in "abc"])
        db.executemany(
            "INSERT INTO work_results VALUES (?, 'NORMAL', 'KILLED', '', ?)",
            [("a", "1 failed"), ("b", "timeout"), ("c", "timeout")],
        )
    assert runner.report(tmp_path, ["streams"], 90.0, False) == 0
    header, row = capsys.readouterr().out.strip().splitlines()[:2]
    assert dict(zip(header.split()[:5], row.split()[:5], strict=True)) == {
        "module": "streams",
        "mutants": "3",
        "killed": "3",
        "timeout": "2",
        "survived": "0",
    }


def test_a_second_run_on_the_same_workdir_is_refused_while_the_first_holds_it(runner, tmp_path):
    """Each run copies the tree afresh; a second one would delete the tree the first is testing, and every mutant
    the first tests after that would fail on missing files and count as killed."""
    first = runner.hold_workdir(tmp_path)
    try:
        with pytest.raises(SystemExit, match="another mutation run is using .*: wait for it to end"):
            runner.hold_workdir(tmp_path)
    finally:
        first.close()
    runner.hold_workdir(tmp_path).close()  # free again once the first has ended


def test_a_planted_bug_whose_tests_fail_unplanted_is_not_counted_killed(runner, tmp_path, monkeypatch):
    """Before: the daemon's tests failed in the planted run's temporary directory whatever was planted (a socket
    path too long), and every bug planted for them was reported killed, by the first test of the file."""
    tree = tmp_path / "tree"
    (tree / "tests" / "unit").mkdir(parents=True)
    (tree / "module.py").write_text("LIMIT = 1\n")
    (tree / "tests" / "unit" / "test_fails_anyway.py").write_text("def test_fails():\n    assert False\n")
    bug = runner.Planted(
        "module: the limit off by one", "module.py", (("LIMIT = 1", "LIMIT = 2"),), ("test_fails_anyway.py",)
    )
    monkeypatch.setattr(runner, "copy_tree", lambda work: tree)
    monkeypatch.setattr(runner, "load_planted", lambda: (bug,))
    with pytest.raises(SystemExit) as refused:
        runner.run_planted(tmp_path / "work")
    assert "fail with no bug planted" in str(refused.value) and "test_fails_anyway.py" in str(refused.value)


def test_a_planted_bug_is_reported_killed_by_the_failing_test_not_by_a_line_its_log_printed(
    runner, tmp_path, monkeypatch, capsys
):
    """The failing test's captured log has lines that begin `ERROR    stagevisor.daemon:runner.py:260 ...` (a
    worker that died at ERROR level): the report named such a line as the killer instead of the test. A test id
    with a space (a parametrized case) is named whole."""
    tree = tmp_path / "tree"
    (tree / "tests" / "unit").mkdir(parents=True)
    (tree / "module.py").write_text("LIMIT = 1\n")
    (tree / "tests" / "unit" / "test_logs_then_fails.py").write_text(
        "import logging\nfrom pathlib import Path\n\nimport pytest\n\n\n"
        "@pytest.mark.parametrize('case', ['one limit'])\n"
        "def test_the_limit(case):\n"
        "    logging.getLogger('stagevisor.daemon').error('worker pid 101 exited unexpectedly')\n"
        "    assert Path('module.py').read_text() == 'LIMIT = 1\\n'\n"
    )
    bug = runner.Planted(
        "module: the limit off by one", "module.py", (("LIMIT = 1", "LIMIT = 2"),), ("test_logs_then_fails.py",)
    )
    monkeypatch.setattr(runner, "copy_tree", lambda work: tree)
    monkeypatch.setattr(runner, "load_planted", lambda: (bug,))
    assert runner.run_planted(tmp_path / "work") == 0
    out = capsys.readouterr().out
    assert "by tests/unit/test_logs_then_fails.py::test_the_limit[one limit]\n" in out, out
