"""A Daemon run in one event loop without processes: workers from a scripted fake launcher (tests/fakes.py), and
gateways that stand in for the data plane (one whose stop fails, one that stops cleanly and can hand over to the
gateway of a topology applied live, one that records each announcement of the replicas that take requests)."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.daemon.options import DaemonOptions
from tests.integration.daemon_helpers import make_plan


class BrokenStopGateway:
    """A gateway whose stop() fails, as remove_leftovers did on a directory planted in /dev/shm."""

    def __init__(self, *args, admission=None) -> None:
        self.stopped = False
        self.admission = admission
        self.shm_dir = ""
        self.metrics = None

    async def start(self) -> None:
        pass

    def stop_accepting(self) -> None:
        pass

    def in_flight(self) -> int:
        return 0

    async def stop(self, grace: float) -> None:
        raise IsADirectoryError(21, "Is a directory", "/dev/shm/stagevisor-0123456789ab-1-zzz")

    def remove_shared_area(self) -> None:
        pass

    def fail_group(self, group: str, reason: str) -> None:
        pass

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        pass


class SwitchingGateway(BrokenStopGateway):
    """A gateway that stops cleanly and can hand its requests to the gateway of a topology applied live."""

    limits = None

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        pass

    def retire(self, successor: object) -> None:
        pass

    def push_replicas(self, sets: object, lost: object, workers: object, names: object = None) -> int:
        return 0

    async def wait_replicas(self, version: int, workers: object, timeout: float) -> list[str]:
        return []

    def replica_in_flight(self, replica: str) -> int:
        return 0

    def request_ids(self) -> frozenset[str]:
        return frozenset()

    async def stop(self, grace: float) -> None:
        pass


async def started_daemon(plan, tmp_path, launcher, gateway=SwitchingGateway, **options) -> Daemon:
    """A daemon serving `plan` on `launcher`'s scripted workers and `gateway`, started."""
    daemon = Daemon(
        plan,
        DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0, **options),
        launcher=launcher.factory,
        gateway_factory=gateway,
    )
    await daemon.start()
    return daemon


class HoldingGateway(SwitchingGateway):
    """A gateway whose requests stay in flight while `held` names any: a worker it stops drains until a test
    empties it (`daemon.gateway.held = frozenset()`)."""

    held: frozenset[str] = frozenset({"request-1"})

    def request_ids(self) -> frozenset[str]:
        return self.held


def cpu_plan(*processes: str):
    """Higgs-TTS's four stages on CPU, placed in `processes` (one per stage, in order)."""
    stages = ("preprocessing", "audio_encoder", "tts_engine", "vocoder")
    return make_plan("higgs-tts", [(s, p, None, None) for s, p in zip(stages, processes, strict=True)])


class AnnouncingGateway(SwitchingGateway):
    def __init__(self, *args, admission=None) -> None:
        super().__init__(*args, admission=admission)
        self.sets: list[dict[str, tuple[str, ...]]] = []

    def push_replicas(
        self, sets: dict[str, tuple[str, ...]], lost: tuple[str, ...], workers: object, names: object = None
    ) -> int:
        self.sets.append(dict(sets))
        return len(self.sets)


def published_warnings(events: asyncio.Queue, kind: str = "WARNING") -> list[tuple[str, str]]:
    """(group, reason) of the events of `kind` (WARNING by default) published to `events` so far, taking every
    event off the queue; group "" for the whole daemon's."""
    found = []
    while not events.empty():
        event = events.get_nowait()
        if event is not None and event.kind == kind:
            found.append((event.group, event.reason))
    return found
