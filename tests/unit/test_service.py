"""The daemon's composition: how a server that cannot bind its address is reported, whichever option named it."""

from __future__ import annotations

import errno
import os

import pytest

from stagevisor.supervisor.errors import DaemonErrorCode
from stagevisor.supervisor.service import listen_error


def os_error(number: int) -> OSError:
    return OSError(number, os.strerror(number))


@pytest.mark.parametrize(
    "option, remedy",
    [("--http", "choose another --http, or --http none"), ("--metrics", "choose another --metrics HOST:PORT")],
)
def test_a_port_in_use_is_address_in_use_worded_as_for_listen(option, remedy):
    """Before: `--http 127.0.0.1:37183` on a port in use was `DAEMON_ERROR: ... (--http): Address already in use`
    where `--listen` said ADDRESS_IN_USE and named the port."""
    error = listen_error("127.0.0.1:37183", option, os_error(errno.EADDRINUSE), remedy)
    assert error.code is DaemonErrorCode.ADDRESS_IN_USE
    assert error.message == (
        f"cannot listen on 127.0.0.1:37183 ({option}): port 37183 on 127.0.0.1 is already in use "
        f"(another stagevisor daemon or another program); {remedy}"
    )


def test_an_address_of_another_host_is_a_daemon_error_saying_so():
    error = listen_error("[2001:db8::1]:8000", "--http", os_error(errno.EADDRNOTAVAIL), "choose another --http")
    assert error.code is DaemonErrorCode.DAEMON_ERROR
    assert error.message == (
        "cannot listen on [2001:db8::1]:8000 (--http): 2001:db8::1 is not an address of this host; "
        "choose another --http"
    )


def test_another_reason_is_named_with_the_systems_words():
    error = listen_error("127.0.0.1:8000", "--metrics", os_error(errno.EMFILE), "choose another --metrics HOST:PORT")
    assert error.code is DaemonErrorCode.DAEMON_ERROR
    assert "(--metrics): cannot bind 127.0.0.1:8000: Too many open files; choose" in error.message
