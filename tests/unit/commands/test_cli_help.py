"""Help texts an operator copies from: examples keep their line breaks, and the playground asks for no favicon."""

from __future__ import annotations

from importlib import resources

import pytest

from stagevisor.supervisor.cli import main


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return capsys.readouterr().out


def test_the_serve_examples_keep_their_line_continuations(capsys):
    lines = help_of(capsys, "serve").splitlines()
    [curl] = [i for i, line in enumerate(lines) if line.lstrip().startswith("curl ")]
    assert lines[curl].endswith("'Content-Type: application/json' \\")
    assert lines[curl + 1].lstrip().startswith("-d '{")


def test_status_help_has_an_example(capsys):
    out = help_of(capsys, "status")
    assert "examples: stagevisor status" in out and "--format json" in out


def test_the_playground_declares_an_inline_icon_so_browsers_ask_for_no_favicon():
    page = resources.files("stagevisor.supervisor.http").joinpath("playground.html").read_text(encoding="utf-8")
    assert '<link rel="icon" href="data:,">' in page


def test_every_option_of_every_command_says_what_it_does():
    """topology, status, events and apply listed --format with an empty meaning in --help and docs/reference/cli.md."""
    from stagevisor.supervisor.cli import build_parser

    silent = [
        f"{name} {action.option_strings or action.dest}"
        for name, command in build_parser().commands.items()
        for action in command._actions
        if not action.help
    ]
    assert silent == []
