"""`stagevisor top`: a live terminal view of a running daemon, over its admin API only.

Per process group: state, pid, CPU %, memory against its budget, requests in
flight; per stage: calls and p50/p99 processing time over the last minute.
Redraws in place every --interval seconds; `q` or Ctrl-C exits.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import sys
import time
from typing import TYPE_CHECKING

from stagevisor.supervisor.addresses import default_admin_address, dial_address
from stagevisor.supervisor.numbers import counted, seconds_problem
from stagevisor.supervisor.security.client import add_client_options, client_security

if TYPE_CHECKING:  # the reports import protobuf, which the CLI's other commands do without
    from stagevisor.supervisor.reports import SummaryReport


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of the daemon: CPU, memory against budget, in flight, stage latency",
        description="Show, refreshed in place, each process group's state, pid, CPU %, resident and GPU "
        "memory against its budget and requests in flight, and each stage's p50/p99 processing "
        "time over the last minute. Press q or Ctrl-C to quit. Without a terminal (or with "
        "--once) it prints one view and exits.",
        epilog="example: stagevisor top --interval 0.5",
    )
    parser.add_argument(
        "--admin-address",
        metavar="ADDRESS",
        type=dial_address,
        default=default_admin_address(),
        help="the daemon's admin endpoint (default %(default)s)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between refreshes (default %(default)s)"
    )
    parser.add_argument("--once", action="store_true", help="print one view and exit")
    add_client_options(parser)
    parser.set_defaults(handler=run)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def render(summary: SummaryReport, clock: str = "") -> list[str]:
    """The view as lines (no terminal control codes)."""
    from stagevisor.supervisor.commands.report_text import format_bytes

    lines = [
        f"stagevisor top - daemon {summary.state}, {counted(summary.in_flight, 'request')} in flight, "
        f"stage latency over the last {summary.window_seconds:.0f} s   {clock}".rstrip(),
        "",
    ]
    groups = summary.groups
    gw = max([len("GROUP")] + [len(g.name) for g in groups])
    lines.append(
        f"{'GROUP':<{gw}}  {'STATE':<8} {'PID':>7} {'CPU%':>6}  {'RSS':>10}  {'GPU MEM':>10}  "
        f"{'BUDGET':<20} {'IN FLIGHT':>9}"
    )
    for g in groups:
        res = g.resources
        budget = "-"
        if res is not None and res.memory_budget_bytes is not None:
            budget = f"{format_bytes(res.memory_budget_bytes)} ({res.budget_kind})"
        measured = res if g.pid else None  # no process: its last sample would read as 0 bytes used
        cpu = f"{measured.cpu_percent:.1f}" if measured else "-"
        rss = format_bytes(measured.rss_bytes) if measured else "-"
        gpu = format_bytes(measured.gpu_memory_bytes) if measured else "-"
        over = "  OVER BUDGET" if measured is not None and measured.over_budget else ""
        lines.append(
            f"{g.name:<{gw}}  {g.state:<8} {g.pid or '-':>7} {cpu:>6}  {rss:>10}  {gpu:>10}  "
            f"{budget:<20} {g.in_flight:>9}{over}"
        )
    lines.append("")
    stages = summary.stages
    sw = max([len("STAGE")] + [len(s.name) for s in stages])
    lines.append(f"{'STAGE':<{sw}}  {'GROUP':<{gw}} {'IN FLIGHT':>9} {'CALLS':>7} {'P50*':>10} {'P99*':>10}")
    for s in stages:
        lines.append(
            f"{s.name:<{sw}}  {s.group:<{gw}} {s.in_flight:>9} {s.count:>7} "
            f"{_ms(s.p50_seconds):>10} {_ms(s.p99_seconds):>10}"
        )
    if stages:
        lines.append(BUCKETS_NOTE)
    lines.extend(f"warning: {w}" for w in summary.warnings)
    return lines


BUCKETS_NOTE = (
    "* estimated from histogram buckets, as Prometheus' histogram_quantile does on /metrics (within a bucket, "
    "e.g. 1-2.5 s, the value is interpolated); `stagevisor synthesize --timings` measures one request exactly"
)


def _fetch(args: argparse.Namespace) -> SummaryReport:
    from stagevisor.supervisor._proto import admin_pb2
    from stagevisor.supervisor.commands.admin import call
    from stagevisor.supervisor.reports import SummaryReport

    msg = call(args, lambda stub: stub.GetMetricsSummary(admin_pb2.GetMetricsSummaryRequest(), timeout=5))
    return SummaryReport.from_proto(msg)


def run(args: argparse.Namespace) -> int:
    import grpc

    from stagevisor.supervisor.commands.admin import Unreachable, report_unreachable

    problem = seconds_problem("--interval", args.interval, zero=False)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    client_security(args)  # a missing or bad --api-key-file / --tls-ca is a usage error, not "unreachable"
    try:
        if args.once or not (sys.stdin.isatty() and sys.stdout.isatty()):
            print("\n".join(render(_fetch(args), time.strftime("%H:%M:%S"))))
            return 0
        return _live(args)
    except Unreachable as unreachable:
        return report_unreachable(args, unreachable)
    except grpc.RpcError as error:
        print(f"error: {error.details()}", file=sys.stderr)
        return 1


def _live(args: argparse.Namespace) -> int:
    """Redraw in place on the alternate screen until q or Ctrl-C; the terminal is restored on any exit."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    out = sys.stdout
    try:
        tty.setcbreak(fd)  # keys arrive one by one, unechoed; Ctrl-C still raises KeyboardInterrupt
        out.write("\x1b[?1049h\x1b[?25l")
        while True:
            size = shutil.get_terminal_size()  # COLUMNS/LINES, else the terminal's, else 80x24
            lines = render(_fetch(args), time.strftime("%H:%M:%S"))
            lines.append("")
            lines.append("q or Ctrl-C: quit")
            shown = [line[: size.columns] for line in lines[: max(1, size.lines)]]
            out.write("\x1b[H" + "".join(f"{line}\x1b[K\r\n" for line in shown[:-1]) + shown[-1] + "\x1b[K\x1b[J")
            out.flush()
            deadline = time.monotonic() + args.interval
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([fd], [], [], left)
                if ready:
                    key = os.read(fd, 1)
                    if key in (b"q", b"Q", b""):
                        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
