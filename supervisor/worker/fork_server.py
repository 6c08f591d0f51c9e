"""Imported first by the fork server that CPU workers fork from (daemon/launcher.py): it ignores SIGTERM there.

A SIGTERM sent to the daemon's whole process group or cgroup (`kill -- -PGID`,
`timeout`, systemd's default KillMode=control-group, `tini -g`) reaches the
fork server too. Its death would kill every worker forked from it at once
(they die with their parent, PR_SET_PDEATHSIG) and have multiprocessing report
each as exit code 255, failing in-flight requests while the daemon, and the
workers themselves, are still draining them. Ignoring SIGTERM, as
multiprocessing's own resource tracker does, the fork server lives until the
daemon is gone (it exits on EOF from the daemon, and dies with it).

multiprocessing offers no hook into that process but its preload imports, so
this is a side effect of importing the module, and only where the launcher
marked the environment (FORK_SERVER_ENV, removed here so that workers do not
inherit the mark). A forked worker inherits the ignored SIGTERM and restores
the default first thing (worker/boot.py), so the daemon can still stop it.
"""

from __future__ import annotations

import os
import signal

from stagevisor.supervisor import envs

FORK_SERVER_ENV = envs.FORK_SERVER.name

if os.environ.pop(FORK_SERVER_ENV, None) == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
