"""Workers find factories where users keep them; an unimportable factory is named before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

from stagevisor.supervisor.worker.app_paths import import_paths, module_findable, unimportable_factories


def package(root: Path, dotted: str, body: str = "") -> None:
    parts = dotted.split(".")
    for depth in range(1, len(parts)):
        directory = root.joinpath(*parts[:depth])
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "__init__.py").write_text("raise RuntimeError('package code ran')\n")
    root.joinpath(*parts[:-1], parts[-1] + ".py").write_text(body)


def test_app_dirs_come_first_then_the_configs_directory_then_the_working_directory(tmp_path):
    config = tmp_path / "conf" / "my.yaml"
    assert import_paths(["apps", tmp_path / "conf"], config, cwd=tmp_path) == (
        str(Path("apps").resolve()),
        str(tmp_path / "conf"),
        str(tmp_path),
    )


def test_a_module_in_a_package_is_found_without_running_the_packages_code(tmp_path):
    package(tmp_path, "my_tts.stages.vocoder")
    assert module_findable("my_tts.stages.vocoder", [str(tmp_path)])
    assert not module_findable("my_tts.stages.missing", [str(tmp_path)])
    assert not module_findable("my_tts.stages.vocoder.deeper", [str(tmp_path)])
    assert "my_tts" not in sys.modules


def test_installed_and_builtin_modules_are_found():
    assert module_findable("stagevisor.stages.piper.executors", [])
    assert module_findable("json.decoder", [])
    assert module_findable("sys", [])
    assert not module_findable("no_such_module_anywhere", [])
    assert not module_findable("not-an-identifier", [])


def test_an_unimportable_factory_names_the_stage_the_factory_and_the_path_searched(tmp_path):
    package(tmp_path, "my_tts.stages")
    found = unimportable_factories(
        [("frontend", "my_tts.stages:make_frontend"), ("engine", "my_ttz.stages:make_engine"), ("vocoder", None)],
        [str(tmp_path)],
    )
    assert [(item.stage, item.module) for item in found] == [("engine", "my_ttz.stages")]
    message = found[0].message()
    assert "stage 'engine': factory 'my_ttz.stages:make_engine' cannot be imported" in message
    assert str(tmp_path) in message and "--app-dir" in message


def test_a_module_in_nested_namespace_packages_is_found(tmp_path):
    """Before: `a.b.mod` with no __init__.py in `a` or `a/b` raised KeyError('a') out of `serve`."""
    (tmp_path / "nsouter" / "nsinner").mkdir(parents=True)
    (tmp_path / "nsouter" / "nsinner" / "stages_here.py").write_text("raise SystemExit('must not run')\n")
    assert module_findable("nsouter.nsinner.stages_here", [str(tmp_path)])
    assert not module_findable("nsouter.nsinner.missing", [str(tmp_path)])
    assert not module_findable("nsouter.elsewhere.stages_here", [str(tmp_path)])
