"""pid_alive: running processes count, reaped ones do not."""

import os

from stagevisor.supervisor.pids import pid_alive


def test_this_process_is_alive():
    assert pid_alive(os.getpid())


def test_a_pid_beyond_the_kernel_limit_is_not_alive():
    with open("/proc/sys/kernel/pid_max") as limit:
        assert not pid_alive(int(limit.read()) + 1)
