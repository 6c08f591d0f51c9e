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
from typing import Any, Mapping, NoReturn, Sequence

from stagevisor.supervisor import package_version
from stagevisor.supervisor.errors import ErrorCode, StagevisorError

# Each module defines register(subparsers), adding parsers whose `handler`
# default takes the parsed args and returns an exit status.
_COMMAND_MODULES = (
    "stagevisor.supervisor.commands.plan",
    "stagevisor.supervisor.commands.models",
    "stagevisor.supervisor.commands.serve",
    "stagevisor.supervisor.commands.views",
    "stagevisor.supervisor.commands.workers",
    "stagevisor.supervisor.commands.apply",
    "stagevisor.supervisor.commands.stop",
    "stagevisor.supervisor.commands.synthesize",
    "stagevisor.supervisor.commands.top",
    "stagevisor.supervisor.commands.check",
    "stagevisor.supervisor.commands.bench",
)

EXIT_USAGE = 2

# Usage errors about these options are placement requests the operator mistyped.
_ASSIGNMENT_OPTIONS = ("--isolate-stage", "--stage-process", "--process-replicas")


class UsageError(StagevisorError):
    """A command line argparse rejects, reported like every other error (one line, exit 2)."""

    def __init__(self, message: str, prog: str) -> None:
        code = (
            ErrorCode.MALFORMED_ASSIGNMENT
            if any(message.startswith(f"argument {o}") for o in _ASSIGNMENT_OPTIONS)
            else ErrorCode.INVALID_CONFIG
        )
        super().__init__(code, message)
        self.detail = message
        self.prog = prog


class StagevisorArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors follow the error contract instead of printing usage.

    Subparsers inherit the class (argparse builds them with type(parent)), so
    every subcommand gets it; `--help` is untouched.
    """

    commands: Mapping[str, argparse.ArgumentParser] = {}
    """The top-level parser's subcommands by name (build_parser sets them), for the help hint of a usage error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message.replace("\n", " "), self.prog)


def _usage_error(error: UsageError, parser: StagevisorArgumentParser, argv: Sequence[str]) -> StagevisorError:
    # An unrecognized argument is reported by the top-level parser even when a
    # command was named; point the hint at that command's help.
    prog = error.prog
    commands = parser.commands
    named = next((a for a in argv if not a.startswith("-")), None)
    if prog == parser.prog and named is not None and named in commands:
        prog = commands[named].prog
    return StagevisorError(error.code, f"{error.detail}; run `{prog} --help`")


def _format_in(argv: Sequence[str]) -> str | None:
    """The --format value as typed, read from the raw argv (the parse itself failed)."""
    for index, arg in enumerate(argv):
        if arg == "--format" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--format="):
            return arg.split("=", 1)[1]
    return None


class _VersionAction(argparse.Action):
    """--version, read from the package metadata only when asked: every other command starts without it.

    Printed on stdout, as `python --version` does, so `v=$(stagevisor --version)` captures it.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        print(f"stagevisor {package_version()}")
        parser.exit()


def build_parser() -> StagevisorArgumentParser:
    parser = StagevisorArgumentParser(
        prog="stagevisor",
        description=(
            "Supervise a text-to-speech pipeline as a chain of stages, placed into "
            "worker processes you choose, validated before anything starts."
        ),
        epilog="Run `stagevisor COMMAND --help` for the options and examples of each command.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the installed version and exit")
    # What main reads of every command, whatever options it has: `--format` (table or json; synthesize's names an
    # audio format), serve's `grpc_verbosity` (a callable), and the command line typed (set by main). A command's own
    # option or default wins over these (argparse copies the subcommand's namespace over the top-level one).
    parser.set_defaults(format=None, grpc_verbosity=None, command_line=None)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    parser.commands = subparsers.choices
    return parser


def report_error(error: StagevisorError, fmt: str | None) -> int:
    """Print an operator-facing error: one line on stderr, the JSON object with --format json."""
    print(f"error: {error.message}", file=sys.stderr)
    if fmt == "json":
        print(json.dumps(error.to_json()))
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        return report_error(_usage_error(error, parser, argv), _format_in(argv))
    args.command_line = argv  # what the operator typed, for errors that show the command to run instead
    # gRPC core logs routine connection events (GOAWAY on every clean stop) at
    # INFO; operators get errors only unless they ask, and a command may ask for
    # less (serve: none, see commands/serve.py). Set before grpc loads (parsing
    # imports no grpc); spawned workers inherit it. An operator's own value wins.
    os.environ.setdefault("GRPC_VERBOSITY", args.grpc_verbosity(args) if args.grpc_verbosity else "ERROR")
    try:
        return int(args.handler(args) or 0)
    except StagevisorError as error:
        return report_error(error, args.format)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`stagevisor models | head`): not an error worth a traceback.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
