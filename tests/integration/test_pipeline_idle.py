"""--pipeline-idle-timeout fails the requests no worker holds, not the slow ones: a worker that holds a request (a
stage runs it, or it waits for a turn) tells the gateway so every few seconds."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc
from tests.integration.daemon_helpers import ServeProcess
from tests.integration.limit_stages import pipeline_config

# the quick subset (-m 'not slow') leaves it out: a request that waits 15 s on purpose
pytestmark = pytest.mark.slow

CONFIG = pipeline_config("idle-test", split=True)
PIPELINE_IDLE_TIMEOUT = 11


def test_a_stage_silent_for_longer_than_the_pipeline_idle_timeout_still_answers(tmp_path: Path):
    """The `back` worker holds the request 15 s before its first chunk, with --pipeline-idle-timeout 11: it failed
    UNAVAILABLE ("a worker on its route cannot answer") at 7 s, and went on making it for nobody (a Qwen3 request
    waiting for its talker turn behind long ones met exactly this). Now the worker's keep-alives hold it."""
    config = tmp_path / "idle.yaml"
    config.write_text(CONFIG)
    with ServeProcess("--config", str(config), "--pipeline-idle-timeout", str(PIPELINE_IDLE_TIMEOUT)) as daemon:
        daemon.wait_serving(timeout=300)
        with grpc.insecure_channel(daemon.listen) as channel:
            request = synthesis_pb2.SynthesizeRequest(text="Slow.", options={"delay": "15", "seconds": "2"})
            chunks = list(synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=60))
    assert len(chunks) == 2 and all(chunk.pcm for chunk in chunks)
