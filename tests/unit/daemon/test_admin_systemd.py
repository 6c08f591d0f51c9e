"""sd_notify sends its fields to $NOTIFY_SOCKET as one datagram, and is a no-op without it."""

from __future__ import annotations

import socket

from stagevisor.supervisor.daemon import systemd


def test_notify_without_notify_socket_does_nothing(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False


def test_notify_sends_newline_separated_fields_in_one_datagram(monkeypatch, tmp_path):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert systemd.notify("READY=1", "STATUS=serving 4 process groups") is True
        assert receiver.recv(4096) == b"READY=1\nSTATUS=serving 4 process groups"


def test_notify_to_a_missing_socket_reports_failure(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert systemd.notify("READY=1") is False


def test_a_status_line_goes_out_once_per_change_and_with_every_other_field(monkeypatch):
    sent: list[tuple[str, ...]] = []
    monkeypatch.setattr(systemd, "notify", lambda *fields: sent.append(fields) or True)
    line = systemd.StatusLine()
    line.tell("STATUS=serving 1 process group", "READY=1")
    line.tell("STATUS=serving 1 process group")
    line.tell("STATUS=draining", "STOPPING=1")
    line.tell("STATUS=draining", "STOPPING=1")
    line.tell("STATUS=serving 1 process group")
    assert sent == [
        ("READY=1", "STATUS=serving 1 process group"),
        ("STOPPING=1", "STATUS=draining"),
        ("STOPPING=1", "STATUS=draining"),
        ("STATUS=serving 1 process group",),
    ]


def test_the_status_after_a_recovery_counts_process_groups_as_the_ready_status_does(monkeypatch, tmp_path):
    """Back to SERVING after DEGRADED, systemd's STATUS read `serving 1 process groups` (and counted worker processes
    as groups) where the READY notification read `serving 1 process group`."""
    import asyncio

    from stagevisor.supervisor.daemon.lifecycle import DaemonState
    from tests.fakes import FakeLauncher
    from tests.unit.daemon.daemon_driver import cpu_plan, started_daemon

    sent: list[tuple[str, ...]] = []
    monkeypatch.setattr(systemd, "notify", lambda *fields: sent.append(fields) or True)

    async def scenario():
        daemon = await started_daemon(cpu_plan(*["pipeline"] * 4), tmp_path, FakeLauncher([]))
        try:
            daemon.set_state(DaemonState.DEGRADED)
            daemon.set_state(DaemonState.SERVING)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())
    statuses = [field for fields in sent for field in fields if field.startswith("STATUS=serving")]
    assert statuses[-1] == "STATUS=serving 1 process group"
    assert statuses[-1] in {field for fields in sent if "READY=1" in fields for field in fields}


def test_startup_sends_the_serving_status_once_with_ready(monkeypatch, tmp_path):
    """A daemon reaching SERVING at startup sent `STATUS=serving ...` twice: once alone as its state changed, then
    again with READY=1. systemd needs it once, with READY=1."""
    import asyncio

    from tests.fakes import FakeLauncher
    from tests.unit.daemon.daemon_driver import cpu_plan, started_daemon

    sent: list[tuple[str, ...]] = []
    monkeypatch.setattr(systemd, "notify", lambda *fields: sent.append(fields) or True)

    async def scenario():
        daemon = await started_daemon(cpu_plan(*["pipeline"] * 4), tmp_path, FakeLauncher([]))
        await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())
    serving = [fields for fields in sent if any(field.startswith("STATUS=serving") for field in fields)]
    assert serving == [("READY=1", "STATUS=serving 1 process group")]


def test_a_scale_tells_systemd_the_workers_it_serves_now_once(monkeypatch, tmp_path):
    """After `scale pipeline=1` from 2, `systemctl status` still read `serving 2 process groups (3 workers)`: the
    STATUS line was sent at startup and on recovery only."""
    import asyncio

    from stagevisor.supervisor.placement.planner import rescale
    from tests.fakes import FakeLauncher
    from tests.unit.daemon.daemon_driver import AnnouncingGateway, cpu_plan, started_daemon

    sent: list[tuple[str, ...]] = []
    monkeypatch.setattr(systemd, "notify", lambda *fields: sent.append(fields) or True)

    async def scenario():
        plan = rescale(cpu_plan("front", "front", "pipeline", "pipeline"), "pipeline", 2)
        daemon = await started_daemon(plan, tmp_path, FakeLauncher([]), AnnouncingGateway)
        try:
            await asyncio.wait_for(daemon.scale_group("pipeline", 1), 30)
            await asyncio.wait_for(daemon.scale_group("pipeline", 1), 30)  # nothing changes: nothing sent
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())
    statuses = [field for fields in sent for field in fields if field.startswith("STATUS=serving")]
    assert statuses == ["STATUS=serving 2 process groups (3 workers)", "STATUS=serving 2 process groups"]
