"""Rolling restarts wait for a replica's requests as long as they may legitimately run (--request-timeout).

Before: a replica was stopped after --drain-timeout (30 s by default) even while its requests, allowed up to
--request-timeout, were still running: a rolling restart under load cut 2 of 246 requests that took up to 21 s.
Here --drain-timeout is 5 s and requests take up to 20 s; none may fail.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import ServeProcess, long_request, poll_until
from tests.integration.limit_stages import pipeline_config

CONFIG = pipeline_config("drain-test", split=True)
LONGEST = 20  # seconds of audio, one chunk a second: the longest request runs about 20 s
CLIENTS = 4


@pytest.mark.slow
@pytest.mark.soak
def test_a_rolling_restart_under_load_with_20_s_requests_fails_none(tmp_path: Path):
    """Steps:
    1. the `back` group runs two replicas; --drain-timeout 5, --request-timeout 60;
    2. four clients send requests of 2 to 20 s back to back;
    3. `stagevisor restart back` replaces both replicas, one at a time, while they run;
    4. every request of the run completed with all its audio.
    """
    (tmp_path / "drain.yaml").write_text(CONFIG)
    with ServeProcess(
        "--config",
        str(tmp_path / "drain.yaml"),
        "--process-replicas",
        "back=2",
        "--drain-timeout",
        "5",
        "--request-timeout",
        "60",
    ) as daemon:
        daemon.wait_serving(timeout=300)
        outcomes: Counter = Counter()
        lock = threading.Lock()
        stop = threading.Event()

        def client(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                outcome = long_request(daemon.listen, rng.choice([2, 5, 10, 15, LONGEST]))
                with lock:
                    outcomes[outcome] += 1

        threads = [threading.Thread(target=client, args=(seed,), daemon=True) for seed in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            poll_until(lambda: sum(outcomes.values()) >= CLIENTS, timeout=120, message="the load running")
            result = daemon.cli("restart", "back", timeout=300)
            assert result.returncode == 0, result.stderr
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
        assert outcomes and set(outcomes) == {"OK"}, outcomes
        print(f"rolling restart under load: {dict(outcomes)}")
