"""Addresses: what `serve --listen` and `--admin-address` can bind (listen_problem), and what a client command
can dial (dial_address), both checked before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagevisor.supervisor.addresses import host_port, listen_problem, unix_path


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


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1:99999", "port from 0 to 65535"),
        ("", "not HOST:PORT"),
        ("127.0.0.1:0", "port 0 names no endpoint"),
        ("unix:", "needs a path"),
        ("localhost", "not HOST:PORT"),
    ],
)
def test_a_client_address_that_names_no_endpoint_is_refused_before_anything_is_dialled(address, problem):
    """Before: `synthesize --address 127.0.0.1:99999` dialled port 34463, and an empty address printed gRPC's
    C-core error lines."""
    import argparse

    from stagevisor.supervisor.addresses import dial_address, dial_problem

    assert problem in (dial_problem(address) or "")
    with pytest.raises(argparse.ArgumentTypeError, match=problem):
        dial_address(address)


@pytest.mark.parametrize("address", ["127.0.0.1:50551", "[::1]:8000", "unix:/run/stagevisor/admin.sock", "host:1"])
def test_a_client_dials_what_a_daemon_listens_on(address):
    from stagevisor.supervisor.addresses import dial_address

    assert dial_address(address) == address


@pytest.mark.parametrize(
    "argv",
    [
        ["synthesize", "hi", "--address", "127.0.0.1:99999"],
        ["status", "--admin-address", ""],
        ["top", "--admin-address", "127.0.0.1:0"],
        ["bench", "--address", "127.0.0.1:65536"],
    ],
)
def test_the_cli_refuses_an_address_that_names_no_endpoint_as_a_usage_error(argv, capsys):
    from stagevisor.supervisor.cli import main

    assert main(argv) == 2
    assert "error: argument --" in capsys.readouterr().err


@pytest.mark.parametrize(
    "address, path",
    [
        ("unix:/run/x/admin.sock", Path("/run/x/admin.sock")),
        ("unix:///run/x/admin.sock", Path("/run/x/admin.sock")),
        ("unix:admin.sock", Path("admin.sock")),
        ("unix-abstract:admin", None),
        ("127.0.0.1:50552", None),
    ],
)
def test_a_unix_address_names_its_socket_path_and_no_other_address_does(address, path):
    assert unix_path(address) == path
