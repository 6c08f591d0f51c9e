"""Autoscaling in a real daemon: a load step from 1 to 8 clients adds vocoder replicas, idling removes them.

The demo with its vocoder isolated and autoscaled between 1 and 3 replicas on
requests per replica (the first-audio target is set out of reach, so the test
does not depend on this machine's speed). Every request is compared with the
audio of one made at rest: none may fail or differ while replicas come and go.
"""

from __future__ import annotations


import pytest

from tests.integration.daemon_helpers import ServeProcess, SpeechLoad, poll_until, synthesize

pytestmark = pytest.mark.slow

TEXT = "Autoscaling adds a vocoder when the queue grows."
CONFIG = """\
model_path: demo
processes:
  vocoder:
    autoscale:
      min_replicas: 1
      max_replicas: 3
      target_first_audio_p90_seconds: 600
      max_in_flight_per_replica: 1
      scale_up_cooldown_seconds: 0
      scale_down_cooldown_seconds: 3
      window_seconds: 5
"""


def vocoder_replicas(daemon: ServeProcess) -> int:
    group = next(g for g in daemon.admin_topology()["groups"] if g["name"] == "vocoder")
    return max(1, group.get("replicas") or 1)


@pytest.mark.timeout(900)  # its own waits add up to 840 s on a loaded machine: start, scale up, serve, scale down
def test_a_load_step_adds_replicas_up_to_the_maximum_and_idling_removes_them(tmp_path):
    config = tmp_path / "autoscale.yaml"
    config.write_text(CONFIG)
    with ServeProcess("--config", str(config), "--isolate-stage", "vocoder", "--drain-timeout", "30") as daemon:
        daemon.wait_serving(timeout=300)
        expected, _ = synthesize(daemon.listen, TEXT)
        shown = next(g for g in daemon.topology()["groups"] if g["name"] == "vocoder")
        assert shown["autoscale"]["min_replicas"] == 1 and shown["autoscale"]["max_replicas"] == 3
        with SpeechLoad(daemon.listen, TEXT, expected, grpc_clients=8) as load:
            poll_until(lambda: vocoder_replicas(daemon) == 3, timeout=240, message="the vocoder at 3 replicas")
            poll_until(lambda: load.outcomes["OK"] >= 8, timeout=120, message="requests served at 3 replicas")
        poll_until(lambda: vocoder_replicas(daemon) == 1, timeout=180, message="the vocoder back to 1 replica")
        log = daemon.log()
    print(f"outcomes: {dict(load.outcomes)}")
    assert set(load.outcomes) == {"OK"}, load.outcomes
    assert "autoscaled 'vocoder' from 1 to 2 replicas" in log
    assert "autoscaled 'vocoder' from 2 to 3 replicas" in log
    assert "autoscaled 'vocoder' from 3 to 2 replicas: every signal under 0.5 of its target" in log
    assert "autoscaled 'vocoder' from 2 to 1 replica:" in log
