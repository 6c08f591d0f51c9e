"""listen_problem: the addresses `serve --listen` and `--admin-address` can bind, checked before anything starts."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.addresses import listen_problem


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
