"""Every `stagevisor serve|check|bench` command the docs, the deploy files and the CLI's own help show for a model
that runs stand-ins says `--stand-ins`: without it the command stops before any worker starts (exit 2).

The doc-command test skips these (each serves until stopped, or measures for minutes), so a seed model named
without the flag went unseen: deploy/README.md's first command and `serve --help`'s first example exited 2.
A line followed within three lines by the refusal it shows (models.md's example) is that refusal, not an advice.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("README.md", "docs", "deploy", "supervisor/commands")
COMMAND = re.compile(r"stagevisor (?:serve|check|bench)\b(.*)|docker run .*? stagevisor (.*)")
REFUSAL = "has no real executors here"


def lines_naming_a_model() -> list[tuple[str, list[str], list[str]]]:
    """(file:line, the command's arguments, the three lines after it) of every such command."""
    found = []
    for source in SOURCES:
        root = ROOT / source
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if path.suffix not in ("", ".md", ".py", ".yaml", ".service") and path.name != "Dockerfile":
                continue
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()
            for number, line in enumerate(text):
                match = COMMAND.search(line)
                if match is None:
                    continue
                rest = (match.group(1) or match.group(2) or "").split("#")[0].replace("`", " ").rstrip(" \\")
                try:
                    arguments = [argument.rstrip(").,;") for argument in shlex.split(rest)]
                except ValueError:
                    continue
                if "--model-path" in arguments or "--config" in arguments:
                    where = f"{path.relative_to(ROOT)}:{number + 1}"
                    found.append((where, arguments, text[number + 1 : number + 4]))
    return found


def value_of(arguments: list[str], option: str) -> str | None:
    return arguments[arguments.index(option) + 1] if option in arguments[:-1] else None


def test_every_shown_command_for_a_stand_in_model_says_stand_ins():
    from stagevisor.models.requirements import standin_stages
    from stagevisor.supervisor.errors import StagevisorError
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    found = lines_naming_a_model()
    assert len(found) > 20  # the scan reads what it should
    missing = []
    for where, arguments, after in found:
        wrapped = bool(after) and after[0].lstrip().startswith("--stand-ins")  # prose broken across lines
        if "--stand-ins" in arguments or wrapped or any(REFUSAL in line for line in after):
            continue
        config = value_of(arguments, "--config")
        if config is not None and not (ROOT / config).is_file():
            continue  # a file of the reader's own (my-tts.yaml)
        try:
            plan = plan_placement(PlacementRequest(value_of(arguments, "--model-path"), config and str(ROOT / config)))
        except StagevisorError:
            continue  # a checkpoint directory of the reader's own
        if standin_stages(plan):
            missing.append(where)
    assert missing == []
