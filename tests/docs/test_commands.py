"""Every shell command README.md and docs/ show runs as written, or says why it cannot.

A fenced `bash` or `console` block runs on its own unless the line before it is a marker:

    <!-- doc-test: daemon -->          run against a demo daemon this test starts (vocoder in its own process)
    <!-- doc-test: skip: REASON -->    not run; REASON says why (a cluster, a GPU, minutes of benchmark...)

A fenced `yaml` block is a config file: `stagevisor plan --config` must accept it as shown (a factory's module
that cannot be found is only plan's warning), unless a skip marker says why not (a fragment of a config).

Blocks run with bash (`set -euo pipefail`) in a temporary directory that links the repository's top-level
entries, so relative paths (`deploy/examples/...`, `tests/...`) resolve and written files (`out.wav`) land in
the temporary directory. In a `console` block, lines starting with `$ ` are commands and the lines after them
the expected output (none shown: not checked): each must match a line of the real output in order, where `...`
alone stands for any lines and `...` inside a line for any text. Against the test daemon, the documented
default addresses are rewritten to its own: `localhost:8000` and `127.0.0.1:8000` to its HTTP port, and
`stagevisor synthesize` gets `--address` of its public socket; admin commands find it through
`STAGEVISOR_RUNTIME_DIR`, as they find an operator's daemon through its default runtime directory.
`. .venv/bin/activate` is a no-op here: the test's own environment is the active one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>bash|console|sh|shell)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M
)
CONFIG_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>yaml)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<mode>daemon|skip)(?::\s*(?P<reason>.*?))?\s*-->\s*$")
TIMEOUT = 240.0
"""Seconds one block may take: the slowest (a pytest file, a synthesis on a loaded machine) take far less."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    mode: str  # "run", "daemon" or "skip"
    reason: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _blocks(fence: re.Pattern[str] = BLOCK) -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in fence.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = MARKER.search(before)
            body = "\n".join(row[len(match["indent"]) :] for row in match["body"].splitlines())
            mode = marker["mode"] if marker else "run"
            found.append(Block(page, line, match["lang"], body, mode, (marker["reason"] or "") if marker else ""))
    return found


BLOCKS = _blocks()
CONFIG_BLOCKS = _blocks(CONFIG_BLOCK)


def _commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) in order; a bash block is one command with no expected output."""
    if block.lang != "console":
        return [(block.body, [])]
    steps: list[tuple[str, list[str]]] = []
    lines = block.body.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ "):
            raise AssertionError(f"{block.id}: console output before any `$ ` command: {line!r}")
        command = line[2:]
        while command.endswith("\\") and index + 1 < len(lines):
            index += 1
            command = command[:-1] + " " + lines[index].strip()
        index += 1
        expected = []
        while index < len(lines) and not lines[index].startswith("$ "):
            expected.append(lines[index])
            index += 1
        steps.append((command, expected))
    return steps


def _matches(expected: list[str], actual: list[str]) -> bool:
    """Each expected line matches an actual line in order; `...` alone skips any lines."""
    patterns = [None if e.strip() == "..." else re.compile(".*".join(map(re.escape, e.split("...")))) for e in expected]

    def match(p: int, a: int) -> bool:
        if p == len(patterns):
            return a == len(actual) or (p > 0 and patterns[p - 1] is None)
        if patterns[p] is None:
            return any(match(p + 1, k) for k in range(a, len(actual) + 1))
        return a < len(actual) and patterns[p].fullmatch(actual[a].rstrip()) is not None and match(p + 1, a + 1)

    return match(0, 0)


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".venv", ".ci"} and not entry.name.endswith(".egg-info"):
            (work / entry.name).symlink_to(entry)
    (work / ".venv" / "bin").mkdir(parents=True)
    (work / ".venv" / "bin" / "activate").write_text("# the test's environment is already active\n")
    return work


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _env(tmp_path: Path, runtime_dir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["STAGEVISOR_RUNTIME_DIR"] = str(runtime_dir or tmp_path / "run")
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def _check(block: Block, cwd: Path, env: dict[str, str], rewrite=lambda command: command) -> None:
    for command, expected in _commands(block):
        command = rewrite(command)
        done = _run(command, cwd, env)
        output = (done.stdout + done.stderr).splitlines()
        # A console example may show a failing command (its `error:` line is the point); a bash block may not.
        failing_shown = block.lang == "console" and any(line.startswith("error:") for line in expected)
        if not failing_shown:
            assert done.returncode == 0, f"{block.id}: `{command}` exited {done.returncode}:\n" + "\n".join(output)
        assert not expected or _matches(expected, output), (
            f"{block.id}: `{command}` printed\n" + "\n".join(output) + "\nbut the page shows\n" + "\n".join(expected)
        )


def _assert_audio_written(block: Block, work: Path) -> None:
    """A WAV a block wrote (`-o hello.wav`) holds audio: a RIFF header and samples after it."""
    for wav in work.glob("*.wav"):
        data = wav.read_bytes()
        assert data[:4] == b"RIFF" and len(data) > 44 + 1000, f"{block.id}: {wav.name} is not audio: {data[:200]!r}"


def test_every_block_is_run_or_says_why_not():
    unexplained = [b.id for b in BLOCKS + CONFIG_BLOCKS if b.mode == "skip" and len(b.reason) < 10]
    assert not unexplained, f"skipped without a reason: {unexplained}"
    assert any(b.mode == "run" for b in BLOCKS) and any(b.mode == "daemon" for b in BLOCKS)
    assert [b.id for b in CONFIG_BLOCKS if b.mode == "daemon"] == [], "a config block is planned, not served"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mode == "run"], ids=lambda b: b.id)
def test_command_runs_as_shown(block, tmp_path):
    _check(block, _workdir(tmp_path), _env(tmp_path))


@pytest.mark.parametrize("block", [b for b in BLOCKS + CONFIG_BLOCKS if b.mode == "skip"], ids=lambda b: b.id)
def test_command_not_run(block):
    pytest.skip(block.reason)


@pytest.mark.parametrize("block", [b for b in CONFIG_BLOCKS if b.mode == "run"], ids=lambda b: b.id)
def test_config_plans_as_shown(block, tmp_path, capsys):
    """docs/guides/topology.md's first config isolated FishAudio's vocoder without the fraction the engine then
    needs on the shared GPU: `plan` refused it (MISSING_FRACTION), and no test planned the page's YAML."""
    from stagevisor.supervisor.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(block.body)
    status = main(["plan", "--config", str(config)])
    assert status == 0, f"{block.id}: `stagevisor plan --config` refused it:\n{capsys.readouterr().err}"


class DocDaemon:
    """The demo on a daemon of this test, its admin socket where the CLI looks by default."""

    def __init__(self, tmp: Path) -> None:
        from tests.integration.daemon_helpers import ServeProcess

        self.process = ServeProcess("--model-path", "demo", "--isolate-stage", "vocoder", "--http", "127.0.0.1:0")
        self.runtime_dir = self.process.tmp / "run"
        default_admin = f"unix:{self.runtime_dir / 'admin.sock'}"
        argv = self.process.argv
        argv[argv.index("--admin-address") + 1] = default_admin
        self.process.admin_address = default_admin

    def __enter__(self) -> "DocDaemon":
        self.process.__enter__()
        self.process.wait_serving()
        self.http = self.process.http_url().split("://", 1)[1]
        return self

    def __exit__(self, *exc) -> None:
        self.process.__exit__(*exc)

    def rewrite(self, command: str) -> str:
        command = command.replace("localhost:8000", self.http).replace("127.0.0.1:8000", self.http)
        listen = shlex.quote(self.process.listen)
        synthesize = re.compile(r"\bstagevisor synthesize\b(?![^\n]*--address)")
        return synthesize.sub(f"stagevisor synthesize --address {listen}", command)


@pytest.fixture(scope="module")
def doc_daemon(tmp_path_factory):
    with DocDaemon(tmp_path_factory.mktemp("daemon")) as daemon:
        yield daemon


DAEMON_BLOCKS = [b for b in BLOCKS if b.mode == "daemon"]


@pytest.mark.parametrize("block", [b for b in DAEMON_BLOCKS if "stagevisor stop" not in b.body], ids=lambda b: b.id)
def test_command_runs_against_a_daemon(block, doc_daemon, tmp_path):
    work = _workdir(tmp_path)
    _check(block, work, _env(tmp_path, doc_daemon.runtime_dir), doc_daemon.rewrite)
    _assert_audio_written(block, work)


@pytest.mark.parametrize("block", [b for b in DAEMON_BLOCKS if "stagevisor stop" in b.body], ids=lambda b: b.id)
def test_command_that_stops_the_daemon_runs_against_its_own(block, tmp_path):
    """A block ending with `stagevisor stop` gets a daemon of its own, which must then have exited."""
    with DocDaemon(tmp_path) as daemon:
        work = _workdir(tmp_path)
        _check(block, work, _env(tmp_path, daemon.runtime_dir), daemon.rewrite)
        assert daemon.process.wait_exit(timeout=60) == 0
        _assert_audio_written(block, work)
