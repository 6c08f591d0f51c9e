"""supervisor/envs.py lists every STAGEVISOR_* variable the code names, and reads them one way."""

from __future__ import annotations

import re
from pathlib import Path

from stagevisor.supervisor import envs

ROOT = Path(__file__).resolve().parents[2]


def test_every_variable_the_code_names_is_listed_once_with_a_meaning():
    named = set()
    for top in ("supervisor", "stages", "models"):
        for path in (ROOT / top).rglob("*.py"):
            named |= set(re.findall(r"STAGEVISOR_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    listed = [var.name for var in envs.ALL]
    assert len(set(listed)) == len(listed)
    assert named - {"STAGEVISOR_"} <= set(listed), "add the variable to supervisor/envs.py"
    assert all(var.name.startswith(envs.PREFIX) and var.meaning for var in envs.ALL)


def test_names_are_written_only_in_envs():
    """Outside envs.py a module refers to a variable through envs, not by a string literal of its name."""
    offenders = []
    for top in ("supervisor", "stages", "models"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "envs.py":
                continue
            for var in envs.ALL:
                if f'"{var.name}"' in path.read_text():
                    offenders.append(f"{path.relative_to(ROOT)}: {var.name}")
    assert offenders == []


def test_a_variable_reads_its_default_when_unset_and_a_switch_turns_off_in_words():
    environ = {"STAGEVISOR_CUDA_IPC": " Off "}
    assert envs.CUDA_IPC.switched_off(environ) and not envs.GPU_ISOLATION.switched_off(environ)
    assert envs.GPU_ISOLATION.get(environ) == "1" and not envs.GPU_ISOLATION.is_set(environ)
    assert envs.SHM_DIR.is_set({"STAGEVISOR_SHM_DIR": ""}) and envs.SHM_DIR.get({}) == ""
