"""commands/unanswered.py: what an admin command says when its dial got no answer, from what the CLI saw."""

import pytest

from stagevisor.supervisor.commands.unanswered import Answer, Unanswered, explain
from stagevisor.supervisor.errors import ErrorCode

UNIX = "unix:/run/stagevisor/admin.sock"
TCP = "10.0.0.5:50552"
HANDSHAKE = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.5:50552: Tls handshake failed "
    "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED"
)


def test_a_plaintext_daemon_dialled_with_tls_is_a_tls_mismatch_not_a_wedged_daemon():
    """`status --tls` on a healthy daemon's unix socket said it was wedged and to `kill -KILL` it."""
    error = explain(Unanswered(UNIX, Answer.PLAINTEXT, tls_from=("--tls",), holder=4242))
    assert error.code is ErrorCode.TLS_MISMATCH
    assert error.message == (
        f"the stagevisor daemon (pid 4242) at {UNIX} serves its admin API in plaintext (on a unix socket it always "
        "does: the socket's private directory and peer-credential check protect it), and this command dialled it "
        "with TLS (--tls): drop --tls. The daemon is up; its log says "
        f"`admin API listening on {UNIX} (plaintext, ...)`"
    )


@pytest.mark.parametrize(
    "tls_from, undo",
    [
        (("--tls",), "drop --tls"),
        (("--tls", "--tls-ca"), "drop --tls and --tls-ca"),
        (("$STAGEVISOR_TLS_CA",), "unset STAGEVISOR_TLS_CA"),
        (
            ("--tls-ca", "$STAGEVISOR_TLS_CLIENT_CERT/$STAGEVISOR_TLS_CLIENT_KEY"),
            "drop --tls-ca and unset STAGEVISOR_TLS_CLIENT_CERT STAGEVISOR_TLS_CLIENT_KEY",
        ),
    ],
)
def test_the_tls_mismatch_says_how_to_turn_off_what_turned_tls_on(tls_from, undo):
    message = explain(Unanswered(TCP, Answer.PLAINTEXT, tls_from=tls_from)).message
    assert f"with TLS ({', '.join(tls_from)}): {undo}. The daemon is up" in message
    assert "unix socket" not in message


def test_a_tls_daemon_dialled_in_plaintext_is_a_tls_mismatch_naming_the_ca_flags():
    error = explain(Unanswered(TCP, Answer.TLS))
    assert error.code is ErrorCode.TLS_MISMATCH
    assert error.message == (
        f"the stagevisor daemon at {TCP} serves its admin API with TLS, and this command dialled it in plaintext: "
        "give --tls-ca FILE (the CA that signed the daemon's --tls-cert), --tls (when the system CAs trust it) or "
        f"set $STAGEVISOR_TLS_CA. The daemon is up; its log says `admin API listening on {TCP} (TLS, ...)`"
    )


def test_a_tls_daemon_that_refuses_the_handshake_shows_grpcs_reason_without_its_preamble():
    error = explain(Unanswered(TCP, Answer.TLS, tls_from=("--tls-ca",), grpc_error=HANDSHAKE))
    assert error.code is ErrorCode.TLS_MISMATCH
    assert "serves TLS, but the connection with this command's TLS settings (--tls-ca) failed (UNKNOWN: ipv4:" in (
        error.message
    )
    assert "CERTIFICATE_VERIFY_FAILED" in error.message and "failed to connect to all addresses" not in error.message
    assert "give --tls-ca the CA that signed the daemon's --tls-cert" in error.message


@pytest.mark.parametrize("tls_from", [(), ("--tls",)])
@pytest.mark.parametrize("answer", [answer for answer in Answer if answer is not Answer.UNKNOWN])  # unix: probed
def test_only_a_holder_that_sends_nothing_back_is_called_wedged_and_given_kill(answer, tls_from):
    """A daemon that answered the probe in any way is up: ending it would be wrong whatever the command got wrong."""
    error = explain(Unanswered(UNIX, answer, tls_from=tls_from, holder=4242))
    silent = answer in (Answer.SILENT, Answer.NOTHING_LISTENS)
    assert ("wedged" in error.message, "kill -KILL 4242" in error.message) == (silent, silent)
    mismatch = answer is (Answer.PLAINTEXT if tls_from else Answer.TLS)
    assert error.code is (ErrorCode.TLS_MISMATCH if mismatch else ErrorCode.DAEMON_UNREACHABLE)


@pytest.mark.parametrize(
    "answer, grpc_error, failed",
    [
        (Answer.PLAINTEXT, None, "gRPC got no answer within 2 s"),
        (
            Answer.PLAINTEXT,
            "failed to connect to all addresses; last error: UNAVAILABLE: x: Socket closed",
            "the admin call failed (UNAVAILABLE: x: Socket closed)",
        ),
    ],
)
def test_a_daemon_answering_in_the_dialled_protocol_is_up_and_may_be_overloaded(answer, grpc_error, failed):
    error = explain(Unanswered(UNIX, answer, holder=4242, grpc_error=grpc_error))
    assert error.code is ErrorCode.DAEMON_UNREACHABLE
    assert error.message == (
        f"the stagevisor daemon (pid 4242) at {UNIX} answers connections, but {failed}: it is up and may be "
        "overloaded; try again, and see its log"
    )


def test_a_connection_closed_unanswered_points_at_the_daemons_log_and_allowed_uids():
    error = explain(Unanswered(UNIX, Answer.CLOSED, holder=4242))
    assert error.code is ErrorCode.DAEMON_UNREACHABLE
    assert "closed the connection without answering; its log says why" in error.message
    assert "--admin-allow-uid" in error.message and "kill" not in error.message


@pytest.mark.parametrize(
    "answer, message",
    [
        (Answer.NOTHING_LISTENS, f"no stagevisor daemon at {TCP}; start one with stagevisor serve"),
        (
            Answer.UNKNOWN,
            f"no stagevisor daemon at {TCP}; start one with stagevisor serve "
            "(a daemon serving TLS there needs --tls-ca FILE, --tls or $STAGEVISOR_TLS_CA)",
        ),
        (
            Answer.SILENT,
            f"nothing answers at {TCP}: a process accepts connections there but sent nothing back within 2 s "
            "(a daemon still starting, wedged or stopped with SIGSTOP)",
        ),
    ],
)
def test_without_a_holder_the_message_says_what_was_found_at_the_address(answer, message):
    error = explain(Unanswered(TCP, answer))
    assert (error.code, error.message) == (ErrorCode.DAEMON_UNREACHABLE, message)


@pytest.mark.parametrize(
    "grpc_error",
    [
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:8000: Trying to connect an "
        "http1.x server (HTTP status 400)",  # uvicorn, as the daemon's HTTP API answers
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:8000: Failed parsing HTTP/2 "
        "(Expected SETTINGS frame as the first frame, got frame type 79)",
    ],
)
def test_an_http_server_at_the_admin_address_is_named_as_such_not_an_overloaded_daemon(grpc_error):
    error = explain(Unanswered(TCP, Answer.PLAINTEXT, grpc_error=grpc_error))
    assert error.code is ErrorCode.DAEMON_UNREACHABLE
    assert error.message == (
        f"{TCP} answers, but not with gRPC (it does not speak HTTP/2): an HTTP/1.x server, such as a daemon's HTTP "
        "API (--http); give --admin-address the address the daemon's log shows as `admin API listening on ...`"
    )
