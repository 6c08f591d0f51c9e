"""Each command's parsed arguments hold every attribute the CLI reads of them, so it reads them as `args.x`,
never as `getattr(args, "x", default)` (a default that hides a typo, or an option a command lost)."""

from __future__ import annotations

import re

import pytest

from stagevisor.supervisor.cli import build_parser
from tests.unit.source_tree import ROOT

READ_OF_EVERY_COMMAND = ("format", "grpc_verbosity", "command_line")
"""What cli.main and the admin commands' error reports read, whatever options a command has."""


def _parsed(name: str):
    parser = build_parser()
    command = parser.commands[name]
    positionals = [
        "vocoder=2" if "=" in str(a.metavar) else "vocoder" for a in command._actions if not a.option_strings
    ]
    return parser.parse_args([name, *positionals])


@pytest.mark.parametrize("name", sorted(build_parser().commands))
def test_every_command_has_what_main_reads_of_it(name):
    """`stop` had no `format` (admin.report_unreachable read it with getattr), no command but serve had
    `grpc_verbosity`, and none had `command_line` until main set it."""
    args = _parsed(name)
    assert [attribute for attribute in READ_OF_EVERY_COMMAND if not hasattr(args, attribute)] == []


@pytest.mark.parametrize("name", ["plan", "serve", "check"])
def test_every_command_that_plans_has_the_launcher_plan_from_args_reads(name):
    """check, which takes no --launcher, relied on getattr(args, "launcher", "local")."""
    assert _parsed(name).launcher == "local"


def test_no_command_reads_its_arguments_with_a_getattr_default():
    pattern = re.compile(r"getattr\(\s*args\s*,[^()]*,")
    sources = [ROOT / "supervisor" / "cli.py", *sorted((ROOT / "supervisor" / "commands").glob("*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
