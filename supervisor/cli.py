"""The `stagevisor` operator CLI: one subcommand module each under supervisor/commands/.

Command modules keep their heavy imports (grpc, numpy) inside their handlers so
`stagevisor plan` starts fast and never loads grpc or torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Sequence

from supervisor.errors import StagevisorError

# Each module defines register(subparsers), adding parsers whose `handler`
# default takes the parsed args and returns an exit status.
_COMMAND_MODULES = (
    "supervisor.commands.plan",
    "supervisor.commands.serve",
    "supervisor.commands.admin",
    "supervisor.commands.synthesize",
)

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stagevisor",
        description=(
            "Supervise a text-to-speech pipeline as a chain of stages, placed into "
            "worker processes you choose, validated before anything starts."
        ),
        epilog="Run `stagevisor COMMAND --help` for the options and examples of each command.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    return parser


def report_error(error: StagevisorError, fmt: str | None) -> int:
    """Print an operator-facing error: one line on stderr, the JSON object with --format json."""
    print(f"error: {error.message}", file=sys.stderr)
    if fmt == "json":
        print(json.dumps(error.to_json()))
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC core logs routine connection events (GOAWAY on every clean stop) at
    # INFO; operators get errors only unless they ask. Set before grpc loads;
    # spawned workers inherit it.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except StagevisorError as error:
        return report_error(error, getattr(args, "format", None))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
