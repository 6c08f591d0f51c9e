"""Start a test's child process with a descriptor limit or a default SIGINT, without `preexec_fn`.

`subprocess` with a `preexec_fn` forks with fork() instead of vfork(), and fork() runs gRPC's fork handlers in
the child: with gRPC live in the test process (a channel, a server), they restart gRPC's poller thread in the
child, which then closes every descriptor but its own before exec, the poller's epoll descriptor among them.
About one child in six died there, before exec (SIGABRT after `Epoll1Poller ... epoll_wait error: Bad file
descriptor`, or SIGSEGV): a daemon that "exited while starting" with that one line in its log. This script is
the child's first program instead: it sets what it is told, then execs the command (the pid stays the same).
Resource limits, signal dispositions and the signal mask all survive exec.

    command(argv, nofile=256, default_sigint=True) -> the argv that runs `argv` so
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
from collections.abc import Sequence


def command(argv: Sequence[str], *, nofile: int | None = None, default_sigint: bool = False) -> list[str]:
    """The argv that runs `argv` with its open files capped at `nofile` and/or SIGINT handled by default and
    unblocked (as a terminal's Ctrl-C finds it), whatever the test process inherited."""
    options = [f"--nofile={nofile}"] if nofile is not None else []
    if default_sigint:
        options.append("--default-sigint")
    # -I -S: the shim's own interpreter reads no site or environment settings; os.environ, which the command
    # gets, is untouched.
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *options, "--", *argv]


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nofile", type=int, help="soft and hard limit on open files")
    parser.add_argument("--default-sigint", action="store_true", help="SIGINT handled by default, not blocked")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        parser.error("no command to run")
    if options.nofile is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (options.nofile, options.nofile))
    if options.default_sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
