"""`stagevisor apply` before it dials: what it says of a config whose settings only a start reads."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.cli import main


@pytest.fixture(autouse=True)
def short_connect_wait(monkeypatch):
    """No daemon answers here: 0.5 s of the CLI's connect timeout tells the same as 2 s."""
    from stagevisor.supervisor.commands import admin

    monkeypatch.setattr(admin, "CONNECT_TIMEOUT", 0.5)


@pytest.mark.parametrize("voices, warned", [("voices:\n  narrator: heart\n", True), ("", False)])
def test_a_config_with_a_voices_map_is_warned_that_apply_leaves_the_voice_names_as_they_are(
    capsys, tmp_path, voices, warned
):
    """Before: `apply --config` with a new `voices` entry said "no change: the running topology already is this
    plan", and requests for the new name still got 400 voice_not_found: only `serve` reads the map."""
    config = tmp_path / "voices.yaml"
    config.write_text(f"model_path: demo\n{voices}")
    code = main(["apply", "--config", str(config), "--dry-run", "--admin-address", f"unix:{tmp_path}/admin.sock"])
    assert code == 1  # no daemon there
    err = capsys.readouterr().err
    warning = (
        f"warning: {config}: `voices` is read when the daemon starts; apply changes the topology only, so the voice "
        "names clients may send stay as they are: restart the daemon with this --config to change them\n"
    )
    assert err.startswith(warning) if warned else "warning" not in err
