"""Joining a Ray cluster (supervisor/cluster/connect.py): the address checked before Ray is asked; no Ray here."""

from __future__ import annotations

from typing import Iterator

import pytest

from stagevisor.supervisor.cluster import connect as cluster
from stagevisor.supervisor.errors import ErrorCode, StagevisorError


class FakeRay:
    """Ray as `connect` uses it: not yet joined; `init` records its arguments."""

    def __init__(self) -> None:
        self.joined: dict | None = None

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs) -> None:
        self.joined = kwargs


@pytest.fixture
def fake_ray(monkeypatch) -> FakeRay:
    ray = FakeRay()
    monkeypatch.setattr(cluster, "import_ray", lambda: ray)
    return ray


@pytest.fixture
def listening() -> Iterator[str]:
    """host:port of a local socket that takes connections (a cluster's address, as far as TCP goes)."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


def closed_address() -> str:
    """host:port where nothing listens: a port the kernel gave out and took back."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return f"127.0.0.1:{port}"


def test_joining_a_cluster_with_stderr_in_a_file_turns_off_rays_colour_codes(
    monkeypatch, tmp_path, fake_ray, listening
):
    """The daemon log file held ANSI colour codes from the worker lines Ray forwards."""
    import sys

    monkeypatch.delenv("RAY_COLOR_PREFIX", raising=False)
    with open(tmp_path / "daemon.log", "w") as log:
        monkeypatch.setattr(sys, "stderr", log)
        cluster.connect(listening)
    assert cluster.os.environ["RAY_COLOR_PREFIX"] == "0"
    assert fake_ray.joined is not None and fake_ray.joined["address"] == listening


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_cluster_address_nothing_answers_at_is_refused_without_asking_ray(fake_ray, monkeypatch, scheme):
    """Ray's driver retried such an address for about ten minutes in C++, deaf to Ctrl-C and SIGTERM
    (`plan --launcher ray --ray-address 127.0.0.1:1`), where docs/guides/ray.md promises CLUSTER_UNREACHABLE."""
    address = scheme + closed_address()
    with pytest.raises(StagevisorError) as caught:
        cluster.connect(address)
    assert caught.value.code is ErrorCode.CLUSTER_UNREACHABLE and fake_ray.joined is None
    assert f"cannot join the Ray cluster at {address} (--ray-address): nothing takes a connection there" in (
        caught.value.message
    )
    assert "refused" in caught.value.message.lower() and "ray start --head" in caught.value.message
    monkeypatch.setenv("RAY_ADDRESS", address)  # the same address from the environment
    with pytest.raises(StagevisorError):
        cluster.connect(None)
    assert fake_ray.joined is None


@pytest.mark.parametrize("address", ["auto", "local", "10.0.0.1", "ray://", "host:port"])
def test_an_address_ray_resolves_itself_is_handed_to_ray_unchecked(fake_ray, address):
    assert cluster.unreachable(address) is None
    cluster.connect(address)
    assert fake_ray.joined is not None and fake_ray.joined["address"] == address


def test_no_address_joins_the_running_local_cluster(fake_ray, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster.connect(None)
    assert fake_ray.joined is not None and fake_ray.joined["address"] == "auto"
