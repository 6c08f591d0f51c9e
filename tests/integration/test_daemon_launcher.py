"""The launcher seam on real spawned processes: handshake, exit status, and the lifeline watchdog."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import alive, make_plan, poll_until
from stagevisor.supervisor.daemon.specs import worker_specs
from stagevisor.supervisor.daemon.launcher import Launcher


@pytest.fixture
def spec():
    plan = make_plan("one", [("only", "solo", None, None)])
    run_dir = Path(tempfile.mkdtemp())
    specs, _ = worker_specs(plan, run_dir, parent_pid=os.getpid(), log_level="WARNING")
    yield specs["solo"]
    shutil.rmtree(run_dir, ignore_errors=True)


def test_a_worker_exits_when_its_lifeline_from_the_daemon_closes(spec):
    """PDEATHSIG cannot fire here (this process lives on), so only the watchdog can end the worker."""

    async def scenario():
        worker = Launcher("spawn").start(spec)  # no fork server inside the test process
        handshake = await worker.handshake(60)
        worker._lifeline.close()
        code = await asyncio.wait_for(worker.wait_exit(), 30)
        return handshake, worker.pid, code

    handshake, pid, code = asyncio.run(scenario())
    assert handshake.pid == pid and handshake.fraction_enforced is False
    assert code == 1
    poll_until(lambda: not alive(pid), timeout=10, message="worker reaped")


def test_sigterm_stops_a_worker_cleanly(spec):
    async def scenario():
        worker = Launcher("spawn").start(spec)  # no fork server inside the test process
        await worker.handshake(60)
        worker.terminate()
        code = await asyncio.wait_for(worker.wait_exit(), 30)
        worker.close()
        return code

    assert asyncio.run(scenario()) == 0


def test_every_waiter_on_a_worker_sees_its_exit(spec):
    """The monitor and a restart wait on the same worker at once; neither may be left hanging."""

    async def scenario():
        worker = Launcher("spawn").start(spec)  # no fork server inside the test process
        await worker.handshake(60)
        waiters = [asyncio.ensure_future(worker.wait_exit()) for _ in range(3)]
        await asyncio.sleep(0)  # every waiter is registered before the worker goes
        worker.kill()
        codes = await asyncio.wait_for(asyncio.gather(*waiters), 30)
        worker.close()
        return codes

    assert asyncio.run(scenario()) == [-9, -9, -9]


def test_the_fork_server_imports_the_installed_package_not_a_stagevisor_in_the_working_directory(tmp_path):
    """multiprocessing starts the fork server with `python -c`, which put the working directory first on sys.path:
    a `stagevisor/` there (the runtime directory under XDG_RUNTIME_DIR=$PWD) was imported instead of the package,
    and every forked worker failed on `from stagevisor import __version__`. The fork server's environment makes it
    import the package, take the daemon's sys.path, and leave no trace of either for the workers."""
    import json
    import subprocess
    import sys

    from stagevisor.supervisor.worker.fork_server import FORK_SERVER_ENV, start_environment

    (tmp_path / "stagevisor").mkdir()  # what XDG_RUNTIME_DIR=$PWD makes
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    daemon_path = [str(tmp_path / "app"), *sys.path]
    probe = (
        "import json, os, sys\n"
        "import stagevisor.supervisor.worker.fork_server\n"  # what the fork server preloads first
        "from stagevisor import __version__\n"
        f"print(json.dumps([sys.path, 'PYTHONSAFEPATH' in os.environ, {FORK_SERVER_ENV!r} in os.environ]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**environ, **start_environment(environ, daemon_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [daemon_path, False, False]
