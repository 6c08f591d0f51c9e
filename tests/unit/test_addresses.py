"""listen_problem: the addresses `serve --listen` and `--admin-address` can bind, checked before anything starts."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.addresses import host_port, listen_problem


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:50551", "0.0.0.0:0", "[::1]:65535", "localhost:8000", "unix:/run/sv/a.sock", "unix-abstract:sv"],
)
def test_addresses_a_server_can_listen_on_have_no_problem(address):
    assert listen_problem(address) is None


@pytest.mark.parametrize(
    "address, words",
    [
        ("127.0.0.1:99999", "a port from 0 to 65535"),  # gRPC would bind it as 34463
        ("127.0.0.1:-1", "a port from 0 to 65535"),
        ("127.0.0.1:\u00b2", "a port from 0 to 65535"),
        ("foo", "not HOST:PORT"),
        (":8000", "not HOST:PORT"),
        ("[]:8000", "not HOST:PORT"),
        ("unix:", "unix: needs a path after it"),
        ("unix://", "unix:// needs a path after it"),
        ("unix-abstract:", "unix-abstract: needs a name after it"),
    ],
)
def test_an_address_no_server_can_listen_on_says_why(address, words):
    problem = listen_problem(address)
    assert problem is not None and words in problem


@pytest.mark.parametrize(
    "address, parsed",
    [("127.0.0.1:8000", ("127.0.0.1", 8000)), ("[::1]:0", ("::1", 0)), ("localhost:65535", ("localhost", 65535))],
)
def test_host_port_splits_host_and_port(address, parsed):
    assert host_port(address) == parsed


@pytest.mark.parametrize("address", ["8000", ":8000", "[]:8000", " :8000", "h:65536", "h:+1", "h:\u00b2", "h:"])
def test_host_port_is_none_for_anything_else(address):
    assert host_port(address) is None
