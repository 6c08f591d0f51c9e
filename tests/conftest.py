"""Suite-wide checks: every test has a time limit by tier (tests/timeouts.py), and leaves nothing behind.

The session gets a private temp directory (TMPDIR, inherited by every daemon
and worker the tests start), so what a test leaves there is this suite's and
nobody else's on a shared machine. /dev/shm cannot be made private, so there
the check counts only stagevisor's own entries (`stagevisor-...`) whose name
carries the pid of this session's process or of one of its descendants
(sampled while the tests run): a concurrent run's files are not ours.
After each test the new entries are noted with the test's id; at the end,
whatever is still there fails the run and is listed with the test that
created it. pytest's own `tmp_path` directories are pytest's to manage and
are not counted.

Under pytest-xdist (`-n 2`) each worker is such a session, with its own temp
directory and process tree; the controller, which runs no test, lists what
every worker found and fails the run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from tests.timeouts import TierTimeouts

pytest_plugins = ("tests.markers",)

SHM = Path("/dev/shm")
PYTEST_OWN = "pytest-of-"
# Not ours: onnxruntime (1.32) writes a session-id file `$TMPDIR/.ses` when imported.
THIRD_PARTY = {".ses"}
SHM_OURS = "stagevisor-"


class ProcessTree:
    """The pids of this process and of every descendant seen so far (sampled 10 times a second)."""

    def __init__(self) -> None:
        self.pids = {os.getpid()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="leftover-check-pids", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            self.sample(me)

    def sample(self, me: psutil.Process | None = None) -> None:
        found = _descendants(os.getpid())
        if found is None:  # a kernel without /proc/PID/task/TID/children
            try:
                found = {child.pid for child in (me or psutil.Process()).children(recursive=True)}
            except psutil.Error:
                return
        self.pids.update(found)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def owns(self, name: str) -> bool:
        return any(field.isdigit() and int(field) in self.pids for field in name.split("-"))


def _descendants(root: int) -> set[int] | None:
    """The pids below `root`, read from /proc/PID/task/TID/children; None where the kernel lacks those files.

    Reads only this process tree's entries: psutil's `children(recursive=True)` reads every
    process's stat on the machine, which ten times a second cost several percent of a core.
    """
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return None
    found: set[int] = set()
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as children:
                    kids = [int(kid) for kid in children.read().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    stack.append(kid)
    return found


def _held_by_libraries() -> set[str]:
    """Temporary directories a third-party module holds for the process's life and removes at exit.

    torch.distributed.nn.jit.instantiator makes one when imported (transformers imports it: the qwen3 tests).
    """
    instantiator = sys.modules.get("torch.distributed.nn.jit.instantiator")
    held = getattr(getattr(instantiator, "_TEMP_DIR", None), "name", None)
    return {os.path.basename(held)} if isinstance(held, str) else set()


def _listing(directory: Path) -> set[str]:
    try:
        skipped = THIRD_PARTY | _held_by_libraries()
        return {name for name in os.listdir(directory) if not name.startswith(PYTEST_OWN) and name not in skipped}
    except FileNotFoundError:
        return set()


def _holding(path: str) -> str:
    """What a leftover directory holds, a few names, for the report: which process's files kept it."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return ""
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
    return f" holding [{shown}]"


class LeftoverCheck:
    def __init__(self) -> None:
        self.original_tmp = os.environ.get("TMPDIR")
        self.tmp = Path(tempfile.mkdtemp(prefix="svt-"))
        os.environ["TMPDIR"] = str(self.tmp)
        tempfile.tempdir = str(self.tmp)
        self.shm_before = _listing(SHM)
        self.tree = ProcessTree()
        self.created_by: dict[str, str] = {}
        self.leftovers: list[str] = []

    def note(self, nodeid: str, before_tmp: set[str], before_shm: set[str]) -> None:
        for name in _listing(self.tmp) - before_tmp:
            self.created_by.setdefault(f"{self.tmp}/{name}", nodeid)
        self.tree.sample()
        for name in _listing(SHM) - before_shm:
            self.created_by.setdefault(f"{SHM}/{name}", nodeid)

    def ours_in_shm(self) -> set[str]:
        return {n for n in _listing(SHM) if n.startswith(SHM_OURS) and self.tree.owns(n)}

    def finish(self) -> None:
        self.tree.stop()
        left = [f"{self.tmp}/{n}" for n in sorted(_listing(self.tmp))]
        left += [f"{SHM}/{n}" for n in sorted(self.ours_in_shm() - self.shm_before)]
        self.leftovers = [
            f"{path}{_holding(path)}  (created during {self.created_by.get(path, 'session setup or teardown')})"
            for path in left
        ]
        shutil.rmtree(self.tmp, ignore_errors=True)
        for name in self.ours_in_shm() - self.shm_before:  # listed in the report; not left to the next run
            path = SHM / name
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        tempfile.tempdir = None
        if self.original_tmp is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self.original_tmp


_check: LeftoverCheck | None = None
_from_workers: list[str] = []
"""Under pytest-xdist, in the controller: what the workers' own checks found left behind."""


def _controller(config: pytest.Config) -> bool:
    """pytest-xdist's controller (`-n N`): it runs no test; each worker runs its own check."""
    return (
        not hasattr(config, "workerinput")
        and bool(getattr(config.option, "numprocesses", None))
        and getattr(config.option, "dist", "no") != "no"
    )


def pytest_configure(config: pytest.Config) -> None:
    global _check
    if not config.pluginmanager.has_plugin("tier-timeouts"):
        config.pluginmanager.register(TierTimeouts(config), "tier-timeouts")
    if _check is None and not _controller(config):
        _check = LeftoverCheck()  # in each xdist worker: its own temp directory and process tree


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _check is None:
        yield
        return
    before_tmp, before_shm = _listing(_check.tmp), _listing(SHM)
    yield
    _check.note(item.nodeid, before_tmp, before_shm)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, in the controller: a worker is done; keep what its check found."""
    _from_workers.extend(getattr(node, "workeroutput", {}).get("leftovers", []))


@pytest.fixture(scope="session", autouse=True)
def _graph_cache():
    """The session's optimized voice graphs (daemon_helpers.graph_cache()) go when the session ends,
    whichever directory's tests started the daemons that wrote them (integration, docs)."""
    yield
    from tests.integration import daemon_helpers

    shutil.rmtree(daemon_helpers.graph_cache(), ignore_errors=True)


def _leftovers() -> list[str]:
    return [*(_check.leftovers if _check is not None else []), *_from_workers]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _check is not None:
        _check.finish()
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: its controller reports and fails the run
            workeroutput["leftovers"] = list(_check.leftovers)
    if _leftovers() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _leftovers():
        terminalreporter.section("files left behind", sep="=", red=True)
        terminalreporter.line("Tests must remove what they create (use tmp_path, or clean up in a fixture):")
        for line in _leftovers():
            terminalreporter.line(f"  {line}")
