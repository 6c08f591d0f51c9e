"""`stagevisor restart GROUP` of a one-worker group loses no request: a new worker starts beside the old one.

Before: the old worker was stopped first (its requests had STOP_GRACE, 5 s, then were cancelled) and requests
that arrived before the new one was READY failed UNAVAILABLE.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import ServeProcess, alive, poll_until
from tests.integration.test_rolling_drain import CONFIG, long_request

LONG = 12
"""Seconds of the request in flight when the restart begins: longer than a stopped worker's 5 s grace."""
SHORT = 2
CLIENTS = 3


def group(topology: dict, name: str) -> dict:
    return next(g for g in topology["groups"] if g["name"] == name)


@pytest.mark.slow
def test_restart_of_a_single_worker_under_load_fails_no_request(tmp_path: Path):
    """Steps:
    1. `back` runs one worker; a 12 s request is in flight there;
    2. three clients send 2 s requests back to back;
    3. `stagevisor restart back` returns with a new pid while they run;
    4. the long request and every short one (some issued during the restart) completed with all their audio;
       the old worker is gone.
    """
    (tmp_path / "drain.yaml").write_text(CONFIG)
    with ServeProcess(
        "--config", str(tmp_path / "drain.yaml"), "--drain-timeout", "5", "--request-timeout", "60"
    ) as daemon:
        daemon.wait_serving(timeout=300)
        old_pid = group(daemon.topology(), "back")["pid"]
        outcomes: list[tuple[float, str]] = []
        lock = threading.Lock()
        stop = threading.Event()
        long_outcome: list[str] = []

        def client() -> None:
            while not stop.is_set():
                started = time.monotonic()
                outcome = long_request(daemon.listen, SHORT)
                with lock:
                    outcomes.append((started, outcome))

        long_thread = threading.Thread(target=lambda: long_outcome.append(long_request(daemon.listen, LONG)))
        long_thread.start()
        threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        try:
            poll_until(lambda: len(outcomes) >= CLIENTS, timeout=120, message="the load running")
            began = time.monotonic()
            result = daemon.cli("restart", "back", timeout=300)
            ended = time.monotonic()
            assert result.returncode == 0, result.stderr
            after = len(outcomes)
            poll_until(lambda: len(outcomes) >= after + CLIENTS, timeout=120, message="requests after the restart")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
            long_thread.join(timeout=120)
        new_pid = group(daemon.topology(), "back")["pid"]
        assert f"pid {old_pid} -> {new_pid} (READY)" in result.stdout
        assert new_pid != old_pid and not alive(old_pid)
        counts = Counter(outcome for _, outcome in outcomes)
        assert long_outcome == ["OK"], (long_outcome, counts)
        assert set(counts) == {"OK"}, counts
        assert any(began <= started <= ended for started, _ in outcomes), "no request was issued during the restart"
        print(f"restart under load: {dict(counts)}, restart took {ended - began:.1f}s")
