"""The launcher seam on real spawned processes: handshake, exit status, and the lifeline watchdog."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import alive, make_plan, poll_until
from stagevisor.supervisor.daemon.core import worker_specs
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
