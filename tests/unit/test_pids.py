"""pid_alive: running processes count, reaped ones do not; pid_stopped: the state /proc gives."""

import io
import os

import pytest

from stagevisor.supervisor import pids
from stagevisor.supervisor.pids import pid_alive, pid_stopped


def test_this_process_is_alive():
    assert pid_alive(os.getpid())


def test_a_pid_beyond_the_kernel_limit_is_not_alive():
    with open("/proc/sys/kernel/pid_max") as limit:
        assert not pid_alive(int(limit.read()) + 1)


def test_this_process_is_not_stopped_and_a_pid_that_is_gone_is_not_either():
    with open("/proc/sys/kernel/pid_max") as limit:
        assert not pid_stopped(int(limit.read()) + 1)
    assert not pid_stopped(os.getpid())


@pytest.mark.parametrize(("state", "stopped"), [("T", True), ("t", True), ("S", False), ("R", False), ("Z", False)])
def test_a_stopped_or_traced_state_is_stopped_whatever_the_command_name_holds(monkeypatch, state, stopped):
    line = f"4242 (sv:vocoder) T (x) {state} 1 4242 4242 0 -1 4194560 ..."
    monkeypatch.setattr(pids, "open", lambda path: io.StringIO(line), raising=False)
    assert pid_stopped(4242) is stopped
