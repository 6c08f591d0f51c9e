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

multiprocessing starts the fork server with `python -c`, which puts the
directory the daemon runs in first on sys.path, and Python 3.11 ignores the
daemon's sys.path it hands over. A `stagevisor` there (the runtime directory
under XDG_RUNTIME_DIR=$PWD, or a checkout) was then imported instead of the
installed package, and every forked worker failed. So the launcher starts it
with PYTHONSAFEPATH (Python 3.11 and later: no such first entry), and the
mark carries the daemon's sys.path, which this module applies, as spawned
workers get it, before any other preload module is imported.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Mapping, Sequence

from stagevisor.supervisor import envs

FORK_SERVER_ENV = envs.FORK_SERVER.name
SAFE_PATH_ENV = "PYTHONSAFEPATH"


def start_environment(environ: Mapping[str, str], sys_path: Sequence[str]) -> dict[str, str]:
    """What the fork server starts with besides `environ`: the mark (carrying `sys_path`, the daemon's) and
    PYTHONSAFEPATH unless the operator set it; this module takes both out again, so workers see `environ`."""
    unset = [] if SAFE_PATH_ENV in environ else [SAFE_PATH_ENV]
    env = {FORK_SERVER_ENV: json.dumps({"sys_path": list(sys_path), "unset": unset})}
    env.update(dict.fromkeys(unset, "1"))
    return env


def _apply(mark: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    start = json.loads(mark)
    for name in start["unset"]:
        os.environ.pop(name, None)
    sys.path[:] = start["sys_path"]


if (_mark := os.environ.pop(FORK_SERVER_ENV, None)) is not None:
    _apply(_mark)
