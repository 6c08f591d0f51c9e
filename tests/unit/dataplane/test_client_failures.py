"""What a client is told when the worker holding its request's stages goes: one stage or several, in plain grammar."""

from __future__ import annotations

from stagevisor.supervisor.daemon.handle import describe_unresponsive
from stagevisor.supervisor.dataplane.client_failures import (
    OUTLASTED_STOP_TIMEOUT,
    group_down,
    replica_down,
    worker_stopped,
    worker_unreachable,
)


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


def test_a_worker_killed_for_its_heartbeat_blames_its_loop_or_says_its_process_was_stopped():
    # A SIGSTOPped worker's clients were told "its event loop was blocked": the daemon now reads the process's
    # state before it kills it.
    blocked = group_down(["vocoder"], "vocoder", describe_unresponsive(42, "vocoder", 10.0))
    stopped = group_down(["vocoder"], "vocoder", describe_unresponsive(42, "vocoder", 10.0, stopped=True))
    assert "stopped answering its heartbeat (its event loop was blocked) and was killed" in blocked
    assert "stopped answering its heartbeat (its process was stopped) and was killed" in stopped


def test_a_worker_killed_past_its_stop_timeout_was_stopped_on_purpose_not_gone_down():
    # A worker that drained past --stop-timeout and was killed: its clients were told it "went down".
    reason = f"worker pid 42 of group 'back' {OUTLASTED_STOP_TIMEOUT} (3.0s after SIGTERM); killed it"
    told = group_down(["source"], "back", reason)
    assert told == (
        "stage 'source' is unavailable: its worker (group 'back') was stopped (a restart, a scale-down or a "
        "shutdown) and killed when it outlasted the stop timeout; retry"
    )
