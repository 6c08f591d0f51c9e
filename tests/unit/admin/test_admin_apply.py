"""The admin API's Apply: it plans with the `plan` rules before the daemon is asked, and answers the diff."""

import asyncio
import json

import grpc
import pytest

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.admin.servicer import AdminServicer
from stagevisor.supervisor.errors import DaemonError, ErrorCode, PlacementError
from stagevisor.supervisor.placement.diff import topology_diff
from stagevisor.supervisor.config.voices import VoiceNamesChange
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement, voice_names
from tests.fakes import Aborted, FakeServicerContext


class ApplyingDaemon:
    """An AdminDaemon running the demo's declared topology; records what it is asked to apply."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.plan = plan_placement(PlacementRequest("demo"))
        self.asked: list[tuple[object, bool]] = []
        self.refusal = refusal

    async def apply_request(self, request, *, dry_run=False):
        plan = plan_placement(request)  # the daemon's own planning (LiveChange.apply_request)
        self.asked.append((plan, dry_run))
        if self.refusal is not None:
            raise self.refusal
        voices = voice_names(request)
        return plan, topology_diff(self.plan, plan), None if voices is None else VoiceNamesChange({}, voices)


def apply(daemon, **fields):
    return asyncio.run(AdminServicer(daemon).Apply(admin_pb2.ApplyRequest(**fields), FakeServicerContext()))


def test_the_daemon_gets_the_plan_of_the_request_and_the_reply_carries_the_diff():
    daemon = ApplyingDaemon()
    reply = apply(daemon, model_path="demo", isolate_stages=["vocoder"])
    [(plan, dry_run)] = daemon.asked
    assert [g.name for g in plan.groups] == ["pipeline", "vocoder"] and dry_run is False
    assert reply.changed and reply.applied
    assert json.loads(reply.diff_json)["moved"] == [{"stage": "vocoder", "from": "pipeline", "to": "vocoder"}]
    assert json.loads(reply.plan_json)["groups"][1]["name"] == "vocoder"


def test_a_dry_run_is_never_reported_applied():
    reply = apply(ApplyingDaemon(), model_path="demo", isolate_stages=["vocoder"], dry_run=True)
    assert reply.changed and not reply.applied


def test_the_config_travels_as_text_and_is_named_by_its_path():
    daemon = ApplyingDaemon()
    text = "model_path: demo\nstages:\n  - name: vocoder\n    process: vocoder\n"
    apply(daemon, config_path="mine.yaml", config_text=text)
    assert [g.name for g in daemon.asked[0][0].groups] == ["pipeline", "vocoder"]
    named = apply(daemon, config_path="mine.yaml", config_text=f"{text}voices:\n  narrator: heart\n")
    assert json.loads(named.voices_json)["after"] == {"narrator": "heart"}
    assert apply(daemon, model_path="demo").voices_json == ""  # no config: nothing said of the voices
    with pytest.raises(Aborted) as caught:
        apply(daemon, config_path="mine.yaml", config_text="model_path: demo\nstagez: []\n")
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details.startswith("INVALID_CONFIG: mine.yaml")


def test_a_config_path_without_its_text_is_refused_and_never_opened(tmp_path):
    """Before, the daemon opened the path a client named and a parse error quoted the file back: an admin client
    allowed by uid or token read any file the daemon's user can (`/etc/shadow`'s first line in the message)."""
    secret = tmp_path / "secret.yaml"
    secret.write_text("root:x:0:0:the daemon's secret\n")
    daemon = ApplyingDaemon()
    with pytest.raises(Aborted) as caught:
        apply(daemon, config_path=str(secret))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "config_text" in caught.value.details and "secret" not in caught.value.details.replace(str(secret), "")
    assert daemon.asked == []


def test_a_placement_the_rules_refuse_never_reaches_the_daemon():
    daemon = ApplyingDaemon()
    with pytest.raises(Aborted) as caught:
        apply(daemon, model_path="qwen3-tts", isolate_stages=["tts_engine"])  # preprocessing -> tts_engine unsafe
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details.startswith("UNSAFE_EDGE: ")
    assert daemon.asked == []


@pytest.mark.parametrize(
    "refusal, prefix",
    [
        (PlacementError(ErrorCode.OVER_LIMIT, "GPU 0 would carry 1.9"), "OVER_LIMIT: GPU 0 would carry 1.9"),
        (DaemonError("apply refused: the new topology did not start (boom); nothing changed"), "apply refused"),
    ],
)
def test_the_daemon_s_refusal_is_a_failed_precondition_with_its_message(refusal, prefix):
    with pytest.raises(Aborted) as caught:
        apply(ApplyingDaemon(refusal), model_path="demo", isolate_stages=["vocoder"])
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION and caught.value.details.startswith(prefix)
