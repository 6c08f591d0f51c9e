"""What a client is told when the worker holding its request's stages goes: one stage or several, in plain grammar."""

from __future__ import annotations

from stagevisor.supervisor.dataplane.client_failures import group_down, replica_down, worker_stopped, worker_unreachable


def test_one_stage_is_unavailable():
    assert group_down(["b"], "second", "exit 1").startswith("stage 'b' is unavailable: its worker (group 'second')")


def test_a_group_of_several_stages_says_they_are_unavailable():
    # A declared Qwen3-TTS pipeline group read "stage 'preprocessing', 'tts_engine', 'vocoder' is unavailable".
    stages = ["preprocessing", "tts_engine", "vocoder"]
    named = "stages 'preprocessing', 'tts_engine', 'vocoder' are"
    assert group_down(stages, "pipeline", "killed").startswith(f"{named} unavailable: its worker (group 'pipeline')")
    assert worker_unreachable(stages, ["pipeline"], False).startswith(f"{named} unavailable: its worker")
    assert worker_unreachable(stages, ["pipeline"], True).startswith(f"{named} unreachable: the daemon")
    assert worker_stopped(stages).startswith(f"{named} unavailable: its worker stopped")
    assert replica_down(stages) == f"{named} unavailable: the replica that held them went down; retry"


def test_no_known_stage_is_named_as_unknown():
    assert worker_stopped([]).startswith("stage (unknown) is unavailable")
