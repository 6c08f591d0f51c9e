"""Help texts an operator copies from: examples keep their line breaks, and the playground asks for no favicon."""

from __future__ import annotations

import re
import shlex
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


def test_version_is_printed_on_stdout(capsys):
    """`stagevisor --version` wrote to stderr (argparse's exit message), so `v=$(stagevisor --version)`, as
    docs/api/http.md compares it with GET /version, captured nothing."""
    from stagevisor.supervisor import package_version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    printed = capsys.readouterr()
    assert exited.value.code == 0
    assert (printed.out, printed.err) == (f"stagevisor {package_version()}\n", "")


def test_version_and_get_version_agree_when_the_package_is_not_installed(capsys, monkeypatch):
    """Run from a checkout (no distribution metadata), `stagevisor --version` said `unknown` while GET /version
    and the OpenAPI document said `0`, though docs/api/http.md says the two print the same version."""
    import importlib.metadata

    from starlette.testclient import TestClient

    from stagevisor.supervisor.http.app import create_app
    from tests.fakes import FakeSpeechDaemon

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit):
        main(["--version"])
    printed = capsys.readouterr().out.split()[-1]
    client = TestClient(create_app(FakeSpeechDaemon()))
    assert printed == "unknown"
    assert client.get("/version").json()["version"] == printed
    assert client.get("/openapi.json").json()["info"]["version"] == printed


def test_status_help_has_an_example(capsys):
    out = help_of(capsys, "status")
    assert "examples:\n  stagevisor status\n" in out and "--format json" in out


def _example_commands(text: str) -> list[list[str]]:
    """The arguments of each `stagevisor ...` line under a help text's examples, up to a pipe or `&`."""
    start = re.search(r"^examples?:", text, re.M)
    found = []
    for line in text[start.start() if start else len(text) :].replace("\\\n", " ").splitlines():
        command = re.match(r"^\s*(?:examples?:\s*)?(?:[A-Z_]+=(?:\$\([^)]*\)|\S*)\s+)*stagevisor\s(.*)$", line)
        if command is None:
            continue
        lexer = shlex.shlex(command.group(1), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        arguments = []
        for token in lexer:
            if token in ("|", "||", "&", "&&", ";", ">"):
                break
            arguments.append(token)
        found.append(arguments)
    return found


def test_every_example_in_every_command_s_help_is_one_command_the_parser_takes():
    """restart's and status's examples were one line of three commands that argparse reflowed into a run-on
    line (`stagevisor restart vocoder stagevisor restart vocoder/1 stagevisor`); copied, it was refused."""
    from stagevisor.supervisor.cli import UsageError, build_parser

    parser = build_parser()
    refused, checked = [], 0
    for name, command in parser.commands.items():
        for arguments in _example_commands(command.format_help()):
            checked += 1
            try:
                parser.parse_args(arguments)
            except (UsageError, SystemExit) as error:
                refused.append(f"{name}: stagevisor {' '.join(arguments)}: {error}")
    assert checked >= len(parser.commands) and refused == []


@pytest.mark.parametrize("command", ["restart", "scale", "events"])
def test_the_group_examples_name_the_groups_the_quickstart_daemon_runs(capsys, command):
    """restart's, scale's and events' examples named a `vocoder` group: on the README's quickstart daemon (the
    default voice, as declared: one group, `pipeline`) each was refused, exit status 2. A replica index must be
    one a `scale` earlier on the same line started."""
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    groups = {group.name for group in plan_placement(PlacementRequest()).groups}
    text = help_of(capsys, command)
    examples = text[re.search(r"^examples?:", text, re.M).end() :].split("\n\n")[0]
    named = []
    for line in examples.splitlines():
        replicas: dict[str, int] = {}
        for part in re.split(r"&&|&|;", line):
            words = shlex.split(part)
            if words[:1] != ["stagevisor"] or words[1] not in ("restart", "scale"):
                continue
            target = words[2]
            if words[1] == "scale":
                group, _, count = target.partition("=")
                replicas[group] = int(count)
            else:
                group, _, index = target.partition("/")
                assert not index or int(index) < replicas.get(group, 1), f"{line.strip()}: no replica {target}"
            named.append(group)
    assert named and set(named) <= groups, (named, groups)


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


def test_every_option_that_names_a_process_group_calls_it_group():
    """--stage-process and --process-replicas wrote STAGE=PROCESS and PROCESS=N where restart, scale,
    --standby-worker and --rss-budget write GROUP for the same thing, a process group."""
    from stagevisor.supervisor.cli import build_parser

    metavars = {
        f"{name} {'/'.join(action.option_strings) or action.dest}": str(action.metavar)
        for name, command in build_parser().commands.items()
        for action in command._actions
        if action.metavar is not None
    }
    assert [f"{option} {metavar}" for option, metavar in metavars.items() if "PROCESS" in metavar] == []
    assert metavars["plan --stage-process"] == "STAGE=GROUP" and metavars["serve --process-replicas"] == "GROUP=N"
    assert metavars["serve --standby-worker"] == "GROUP" and metavars["scale assignment"] == "GROUP=N"


def test_app_dir_reads_the_same_in_every_command_that_takes_it():
    """plan, check and serve each declared --app-dir with its own help (\"to look for ... (as with serve)\", \"to
    import stage factories from (as with serve)\", \"ahead of the config's directory ...\")."""
    from stagevisor.supervisor.cli import build_parser

    declared = {
        name: (action.help, action.metavar, action.type, tuple(action.default))
        for name, command in build_parser().commands.items()
        for action in command._actions
        if "--app-dir" in action.option_strings
    }
    assert sorted(declared) == ["check", "plan", "serve"]
    assert len(set(declared.values())) == 1, declared


def test_format_table_or_json_reads_the_same_in_every_command_that_takes_it():
    """Five commands declared --format table|json apiece; bench's help said only "output format", not its default."""
    from stagevisor.supervisor.cli import build_parser

    declared = {
        name: (action.help, tuple(action.choices or ()), action.default)
        for name, command in build_parser().commands.items()
        for action in command._actions
        if "--format" in action.option_strings and "json" in (action.choices or ())
    }
    assert len(declared) >= 10 and "bench" in declared, sorted(declared)
    assert set(declared.values()) == {("output format (default: table)", ("table", "json"), "table")}, declared


def test_serve_help_generates_a_token_the_way_the_key_file_hint_does(capsys):
    """`serve --help` told how to make api.key with a recipe of its own that left the file readable by others,
    which the same `serve` then warned about; it now shows the hint's recipe, naming api.key."""
    from stagevisor.supervisor.security.files import GENERATE_KEY

    text = " ".join(help_of(capsys, "serve").split())
    assert f"Generate a token with `{GENERATE_KEY.replace('FILE', 'api.key')}`" in text
