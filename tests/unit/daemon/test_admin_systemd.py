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
