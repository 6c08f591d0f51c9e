"""`stagevisor models` says which extra each model's executors need and whether it is installed here."""

from __future__ import annotations

import json

from stagevisor.models.registry import builtin_models
from stagevisor.supervisor.install import install_command
from stagevisor.supervisor.commands.models import model_facts, render_models


def by_key(installed):
    return {d.key: model_facts(d, "builtin", installed) for d in builtin_models()}


def test_a_real_model_whose_extra_is_missing_names_the_extra_and_its_install_command():
    facts = by_key(lambda module: module not in ("qwen_tts", "torchaudio"))
    [extra] = facts["qwen3-tts"]["extras"]
    assert extra == {
        "name": "qwen3",
        "installed": False,
        "missing": ["qwen_tts", "torchaudio"],
        "install": install_command("qwen3"),
    }
    text = render_models([facts["qwen3-tts"]])
    assert f"extras:                qwen3 (not installed here: {install_command('qwen3')})" in text
    assert "executors:             real: the model's own weights" in text
    assert "about:                 real executors (qwen-tts" in text


def test_installed_extras_say_so_and_stand_ins_need_the_default_voice():
    facts = by_key(lambda module: True)
    assert facts["demo"]["extras"] == [
        {"name": "demo", "installed": True, "missing": [], "install": install_command("demo")}
    ]
    assert [e["name"] for e in facts["piper"]["extras"]] == ["piper"]
    assert "extras:                demo (installed)" in render_models([facts["zonos2"]])
    assert [e["name"] for e in facts["zonos2"]["extras"]] == ["demo"]
    json.dumps(facts)  # what --format json prints
