"""`stagevisor apply --format json`: what a script reads of the topology and of the voices map."""

from __future__ import annotations

import json

import pytest

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands import apply as apply_command
from stagevisor.supervisor.placement.diff import topology_diff
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_voices_only_change_says_whether_it_was_applied_and_a_dry_run_says_it_is_one(
    capsys, monkeypatch, tmp_path, dry_run
):
    """A config changing only `voices` (taken at once, alone) answered `"applied": false`, the same JSON as its
    `--dry-run`: a script could tell neither that the names changed nor which of the two it ran."""
    config = tmp_path / "voices.yaml"
    config.write_text("model_path: demo\nvoices:\n  narrator: heart\n")
    plan = plan_placement(PlacementRequest(model_path="demo"))
    voices = {"changed": True, "before": {}, "after": {"narrator": "heart"}, "unknown": []}
    reply = admin_pb2.ApplyResponse(
        changed=False,
        applied=False,
        diff_json=json.dumps(topology_diff(plan, plan).to_json()),
        plan_json=json.dumps(plan.to_json()),
        voices_json=json.dumps(voices),
    )
    monkeypatch.setattr(apply_command, "call", lambda args, method: reply)
    argv = ["apply", "--config", str(config), "--admin-address", f"unix:{tmp_path}/a.sock", "--format", "json"]
    assert main(argv + (["--dry-run"] if dry_run else [])) == 0
    answer = json.loads(capsys.readouterr().out)
    assert (answer["changed"], answer["applied"], answer["dry_run"]) == (False, False, dry_run)
    assert answer["voices"] == {**voices, "applied": not dry_run}
