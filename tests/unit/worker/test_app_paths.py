"""Workers find factories where users keep them; an unimportable factory is named before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stagevisor.supervisor.worker.app_paths import (
    close_module,
    import_failure,
    import_paths,
    module_findable,
    unimportable_factories,
)


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
    assert found[0].code.value == "MODULE_NOT_FOUND" and found[0].line() == f"MODULE_NOT_FOUND: {message}"


def test_a_module_in_nested_namespace_packages_is_found(tmp_path):
    """Before: `a.b.mod` with no __init__.py in `a` or `a/b` raised KeyError('a') out of `serve`."""
    (tmp_path / "nsouter" / "nsinner").mkdir(parents=True)
    (tmp_path / "nsouter" / "nsinner" / "stages_here.py").write_text("raise SystemExit('must not run')\n")
    assert module_findable("nsouter.nsinner.stages_here", [str(tmp_path)])
    assert not module_findable("nsouter.nsinner.missing", [str(tmp_path)])
    assert not module_findable("nsouter.elsewhere.stages_here", [str(tmp_path)])


def import_error(factory: str) -> BaseException:
    import importlib

    try:
        importlib.import_module(factory.partition(":")[0])
    except ImportError as error:
        return error
    raise AssertionError(f"{factory} imported")


def test_a_typo_in_the_module_path_is_module_not_found_suggesting_the_module_meant(tmp_path, monkeypatch):
    (tmp_path / "typo_tts").mkdir()
    (tmp_path / "typo_tts" / "__init__.py").write_text("")
    (tmp_path / "typo_tts" / "stages.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    problem = import_failure("vocoder", "typo_tts.stagez:make", import_error("typo_tts.stagez:make"), [str(tmp_path)])
    assert problem is not None and problem.code.value == "MODULE_NOT_FOUND"
    assert problem.message().startswith(
        "stage 'vocoder': factory 'typo_tts.stagez:make' cannot be imported: no module 'typo_tts.stagez' "
        f"on the import path (searched: {tmp_path}); did you mean 'typo_tts.stages'?; check the module name"
    )


def test_a_module_found_that_imports_a_missing_package_is_missing_dependency_naming_the_import(tmp_path, monkeypatch):
    """Before: `check` showed `ModuleNotFoundError: No module named 'not_installed_dep'`, as if the stage's own
    module were missing; nothing said that the module was found, nor where the failing import is."""
    (tmp_path / "dep_tts.py").write_text("import json\nimport not_installed_dep.sub\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problem = import_failure("engine", "dep_tts:make", import_error("dep_tts:make"), [str(tmp_path)])
    assert problem is not None and problem.code.value == "MISSING_DEPENDENCY"
    assert (problem.missing, problem.location) == ("not_installed_dep", f"{tmp_path / 'dep_tts.py'}:2")
    assert problem.reason() == (
        "module 'dep_tts' was found, but an import failed: No module named 'not_installed_dep' "
        f"(at {tmp_path / 'dep_tts.py'}:2); install the package that provides 'not_installed_dep' in the "
        "environment the workers run in, or fix that import"
    )


def test_a_missing_module_of_the_stages_own_package_is_a_dependency_to_fix_not_to_install(tmp_path, monkeypatch):
    (tmp_path / "own_tts").mkdir()
    (tmp_path / "own_tts" / "__init__.py").write_text("")
    (tmp_path / "own_tts" / "stages.py").write_text("from own_tts import helperz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problem = import_failure("engine", "own_tts.stages:make", import_error("own_tts.stages:make"), [])
    assert problem is not None and problem.code.value == "MISSING_DEPENDENCY"
    assert "cannot import name 'helperz' from 'own_tts'" in problem.reason()
    assert "'own_tts' is in the stage's own package: fix that import, or add the module" in problem.reason()


def test_an_error_that_is_not_an_import_error_is_left_to_the_build_report():
    assert import_failure("engine", "x:make", RuntimeError("weights not found"), []) is None


def test_a_close_module_is_found_without_running_any_package_code(tmp_path):
    package(tmp_path, "close_tts.stages.vocoder")
    assert close_module("close_tts.stagse.vocoder", [str(tmp_path)]) == "close_tts.stages.vocoder"
    assert close_module("clsoe_tts.stages", [str(tmp_path)]) == "close_tts.stages"
    assert close_module("close_tts.stages.vocoder.deeper", [str(tmp_path)]) is None
    assert close_module("entirely_else", [str(tmp_path)]) is None
    assert "close_tts" not in sys.modules


@pytest.mark.parametrize("command", ["serve", "plan", "check"])
def test_an_app_dir_that_is_not_a_directory_is_a_usage_error_naming_it(tmp_path, capsys, command):
    """Before: accepted silently; a factory meant to come from it then could not be found, with no word of why."""
    from stagevisor.supervisor.cli import main

    a_file = tmp_path / "stages.py"
    a_file.write_text("")
    for given, why in ((tmp_path / "missing", "is not there"), (a_file, "is not a directory")):
        assert main([command, "--app-dir", str(given)]) == 2
        assert f"argument --app-dir: '{given}' {why}" in capsys.readouterr().err
