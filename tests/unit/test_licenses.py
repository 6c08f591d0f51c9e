"""Neither `pip install stagevisor` nor its `demo` extra (the default voice) pulls a GPL-licensed distribution.

The `piper` extra is where Piper's GPL lives.

Reads the installed distributions' metadata: the core requirements of
stagevisor, followed transitively with environment markers evaluated and no
extras, must not declare a GPL license (LGPL is not GPL).
"""

from __future__ import annotations

import importlib.metadata as metadata
import re

from packaging.requirements import Requirement

GPL = re.compile(r"(?<!L)GPL|GNU General Public", re.IGNORECASE)


def licenses(dist: metadata.Distribution) -> list[str]:
    meta = dist.metadata
    found = [meta.get("License-Expression") or "", meta.get("License") or ""]
    found += [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return [text.splitlines()[0] if text else "" for text in found if text]


def closure(name: str, extras: frozenset[str] = frozenset()) -> dict[str, metadata.Distribution]:
    """The installed distributions `name[extras]` requires, transitively (itself included)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [(name, extras)]
    while todo:
        current, wanted = todo.pop()
        dist = metadata.distribution(current)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen and not wanted:
            continue
        seen[key] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in wanted] or [{"extra": ""}]
            if requirement.marker and not any(requirement.marker.evaluate(env) for env in environments):
                continue
            todo.append((requirement.name, frozenset(requirement.extras)))
    return seen


def gpl_distributions(dists: dict[str, metadata.Distribution]) -> dict[str, list[str]]:
    return {name: licenses(dist) for name, dist in dists.items() if any(GPL.search(t) for t in licenses(dist))}


def test_the_core_install_pulls_no_gpl_distribution():
    core = closure("stagevisor")
    assert {"grpcio", "protobuf", "pydantic", "pyyaml", "psutil", "numpy"} <= set(core)
    assert gpl_distributions(core) == {}


def test_the_demo_extra_brings_the_default_voice_and_no_gpl_distribution():
    demo = closure("stagevisor", frozenset({"demo"}))
    assert {"hibari-tts", "onnxruntime"} <= set(demo) and "piper-tts" not in demo
    assert gpl_distributions(demo) == {}


def test_the_piper_extra_is_where_piper_and_its_gpl_license_are():
    piper = closure("stagevisor", frozenset({"piper"}))
    assert "piper-tts" in piper and "piper-tts" not in closure("stagevisor")
    assert "piper-tts" in gpl_distributions(piper)


def test_the_license_pattern_tells_gpl_from_lgpl_and_agpl_is_still_copyleft():
    assert GPL.search("GPL-3.0-or-later") and GPL.search("License :: OSI Approved :: GNU General Public License v3")
    assert GPL.search("AGPL-3.0-only")
    assert not GPL.search("LGPL-2.1-or-later") and not GPL.search("MIT") and not GPL.search("Apache-2.0")
