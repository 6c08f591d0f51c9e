"""Each rule of supervisor/security/ at its boundary: API key length and characters, key modes, constant-time checks."""

from __future__ import annotations

import hmac
import json
import os
import stat

import pytest

from stagevisor.supervisor.security import client as client_side
from stagevisor.supervisor.security import files as secret_files
from stagevisor.supervisor.security import server as server_side
from stagevisor.supervisor.errors import ErrorCode
from stagevisor.supervisor.http.auth import BearerAuthMiddleware
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.security.files import (
    MAX_API_KEY_CHARS,
    MIN_API_KEY_CHARS,
    SecurityError,
    key_file_warning,
    load_api_key,
    parse_api_key,
)
from stagevisor.supervisor.security.server import Security, check_bearer

# ---- API key length --------------------------------------------------------------------


def test_the_key_length_limits_are_16_and_4096_characters():
    assert (MIN_API_KEY_CHARS, MAX_API_KEY_CHARS) == (16, 4096)


@pytest.mark.parametrize("length", [MIN_API_KEY_CHARS, MIN_API_KEY_CHARS + 1, MAX_API_KEY_CHARS - 1, MAX_API_KEY_CHARS])
def test_a_key_of_a_length_within_the_limits_is_accepted(length):
    assert parse_api_key("k" * length, "$KEY") == "k" * length


def test_a_key_one_character_too_short_is_refused_saying_its_length_and_the_minimum():
    with pytest.raises(SecurityError) as caught:
        parse_api_key("k" * (MIN_API_KEY_CHARS - 1), "$KEY")
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert f"the API key has {MIN_API_KEY_CHARS - 1} characters; use at least {MIN_API_KEY_CHARS}" in (
        caught.value.message
    )
    assert caught.value.message.startswith("$KEY: ")


def test_a_key_one_character_too_long_is_refused_saying_the_maximum():
    with pytest.raises(SecurityError) as caught:
        parse_api_key("k" * (MAX_API_KEY_CHARS + 1), "$KEY")
    assert f"at most {MAX_API_KEY_CHARS} characters" in caught.value.message


def test_the_length_is_counted_after_stripping_surrounding_whitespace():
    padded = "  " + "k" * (MIN_API_KEY_CHARS - 1) + "\n\n"
    with pytest.raises(SecurityError, match=f"has {MIN_API_KEY_CHARS - 1} characters"):
        parse_api_key(padded, "$KEY")
    assert parse_api_key("\t" + "k" * MIN_API_KEY_CHARS + " \n", "$KEY") == "k" * MIN_API_KEY_CHARS


# ---- API key characters -----------------------------------------------------------------


@pytest.mark.parametrize("char", ["!", "~", "0", "Z", "_"])  # 0x21 and 0x7E: the printable range's ends
def test_printable_ascii_up_to_both_ends_of_the_range_is_accepted(char):
    key = "k" * (MIN_API_KEY_CHARS - 1) + char
    assert parse_api_key(key, "$KEY") == key


@pytest.mark.parametrize("char", [" ", "\x7f", "\t", "\x00", "\u00e9", "\U0001f511"])  # 0x20 and 0x7F: just outside
def test_a_character_outside_printable_ascii_is_refused(char):
    with pytest.raises(SecurityError, match="printable ASCII without spaces"):
        parse_api_key("k" * 8 + char + "k" * 8, "$KEY")


def test_a_short_key_with_a_bad_character_is_refused_for_the_character():
    with pytest.raises(SecurityError, match="printable ASCII"):
        parse_api_key("a b", "$KEY")


# ---- key files ------------------------------------------------------------------------


def write_key(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "api.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_key_file_is_read_stripped_and_checked_by_the_same_rules(tmp_path):
    assert load_api_key(write_key(tmp_path, "k" * MIN_API_KEY_CHARS + "\n")) == "k" * MIN_API_KEY_CHARS
    with pytest.raises(SecurityError) as caught:
        load_api_key(write_key(tmp_path, "k" * (MIN_API_KEY_CHARS - 1) + "\n"), "--admin-api-key-file")
    assert caught.value.message.startswith(f"--admin-api-key-file {tmp_path / 'api.key'}: ")
    assert load_api_key(None) is None


def test_an_unreadable_key_file_is_invalid_config_naming_the_flag_and_file(tmp_path):
    with pytest.raises(SecurityError) as caught:
        load_api_key(tmp_path / "missing.key", "--api-key-file")
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert f"cannot read the API key file {tmp_path / 'missing.key'} (--api-key-file)" in caught.value.message


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o200, 0o700, 0o000])
def test_a_key_file_only_its_owner_can_use_gets_no_warning(tmp_path, mode):
    assert key_file_warning(write_key(tmp_path, "x", mode), "--api-key-file") is None


@pytest.mark.parametrize(
    "mode", [0o640, 0o620, 0o610, 0o604, 0o602, 0o601, 0o644, 0o666, 0o777, 0o660, 0o400 | stat.S_IROTH]
)
def test_any_permission_for_group_or_others_gets_a_warning_naming_the_mode(tmp_path, mode):
    path = write_key(tmp_path, "x", mode)
    warning = key_file_warning(path, "--api-key-file")
    assert warning == f"--api-key-file {path} is readable by other users (mode {mode:04o}); chmod 600 it"


def test_no_file_or_a_missing_one_gets_no_warning(tmp_path):
    assert key_file_warning(None, "--api-key-file") is None
    assert key_file_warning(tmp_path / "missing.key", "--api-key-file") is None  # loading it says why


# ---- constant-time comparison --------------------------------------------------------------

KEY = "correct-horse-battery-staple"


@pytest.fixture
def compared(monkeypatch):
    """Every hmac.compare_digest call security/server.py makes, as (presented, expected); the real result returned."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(server_side.hmac, "compare_digest", spy)
    return calls


@pytest.mark.parametrize(
    "presented",
    [KEY, KEY[:-1], KEY + "x", "x", "X" * len(KEY), KEY[:-1] + "X", "", "\udcff"],
)
def test_every_presented_token_is_compared_in_constant_time_whatever_its_length(compared, presented):
    assert check_bearer(f"Bearer {presented}", KEY) is (presented == KEY)
    assert compared == [(presented.encode("utf-8", "surrogateescape"), KEY.encode())]


def test_an_endpoint_compares_through_the_same_constant_time_check(compared):
    assert Security(api_key=KEY).check_bearer(f"Bearer {KEY}") is True
    assert Security(api_key=KEY).check_bearer("Bearer nope") is False
    assert len(compared) == 2


@pytest.mark.parametrize("header", [None, "", f"Basic {KEY}", KEY, f"Token {KEY}"])
def test_a_header_without_the_bearer_scheme_is_refused_before_any_comparison(compared, header):
    assert check_bearer(header, KEY) is False
    assert compared == []


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_scheme_is_case_insensitive_and_the_token_is_not(scheme):
    assert check_bearer(f"{scheme} {KEY}", KEY) is True
    assert check_bearer(f"{scheme} {KEY.upper()}", KEY) is False


# ---- the HTTP endpoint's token, WebSocket handshakes included ----------------------------------------


def asgi_call(scope: dict, *, token: str | None, authorization: bytes | None = None) -> tuple[list[dict], list[str]]:
    """Run one request through BearerAuthMiddleware(app); return what it sent and what reached the app.

    `authorization`, when given, is the raw header value (else `Bearer <token>`, or none without a token)."""
    import asyncio

    reached: list[str] = []
    sent: list[dict] = []
    if authorization is None and token is not None:
        authorization = f"Bearer {token}".encode()
    headers = [(b"authorization", authorization)] if authorization is not None else []
    incoming = [{"type": f"{scope['type']}.connect" if scope["type"] == "websocket" else "http.request"}]

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    middleware = BearerAuthMiddleware(app, Security(api_key=KEY))
    asyncio.run(middleware({**scope, "headers": headers}, receive, send))
    return sent, reached


@pytest.mark.parametrize(
    "token, reason", [(None, "no bearer token"), ("wrong-token-0123456789", "a wrong bearer token")]
)
def test_a_websocket_handshake_without_the_token_never_reaches_the_app_and_is_closed_as_a_policy_violation(
    token, reason
):
    sent, reached = asgi_call({"type": "websocket", "path": "/v1/audio/speech/stream"}, token=token)
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008, "reason": f"unauthorized: {reason}"}]


def test_a_websocket_handshake_without_the_token_is_denied_with_the_coded_401_where_the_server_can_say_why():
    """A client sees why (and what to send) instead of a bare 403 with an empty body."""
    scope = {"type": "websocket", "path": "/v1/audio/speech/stream", "extensions": {"websocket.http.response": {}}}
    sent, reached = asgi_call(scope, token=None)
    assert reached == [] and [m["type"] for m in sent] == [
        "websocket.http.response.start",
        "websocket.http.response.body",
    ]
    assert sent[0]["status"] == 401 and (b"www-authenticate", b'Bearer realm="stagevisor"') in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "invalid_api_key" and "Authorization: Bearer <API key>" in error["message"]


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_a_refusal_for_the_token_is_written_as_every_other_api_error_is(kind):
    """One writer of the coded refusals (http/errors.py `refuse`): the Host and Origin guards' and this one."""
    scope = {"type": kind, "path": "/v1/models", "extensions": {"websocket.http.response": {}}}
    sent, _ = asgi_call(scope, token=None)
    expected = ApiError(
        401,
        "the request carried no bearer token; send `Authorization: Bearer <API key>`",
        code="invalid_api_key",
        headers={"WWW-Authenticate": 'Bearer realm="stagevisor"'},
    ).response()
    assert sent[0]["status"] == 401 and sorted(sent[0]["headers"]) == sorted(expected.raw_headers)
    assert sent[1]["body"] == expected.body


def test_a_websocket_handshake_with_the_token_reaches_the_app():
    assert asgi_call({"type": "websocket", "path": "/v1/audio/speech/stream"}, token=KEY) == (
        [],
        ["/v1/audio/speech/stream"],
    )


@pytest.mark.parametrize("path", ["/health", "/ready", "/"])
def test_only_the_probes_paths_and_the_playground_page_are_open_without_the_token(path):
    assert asgi_call({"type": "http", "path": path}, token=None)[1] == [path]
    for near in (path + "/", path + "z", "/v1" + path):
        sent, reached = asgi_call({"type": "http", "path": near}, token=None)
        assert reached == [] and sent[0]["status"] == 401, near


@pytest.mark.parametrize(
    "path", ["/metrics", "/v1/models", "/v1/audio/speech", "/v1/audio/voices", "/v1/topology", "/openapi.json"]
)
def test_every_route_but_the_probes_needs_the_token_metrics_included(path):
    sent, reached = asgi_call({"type": "http", "path": path}, token=None)
    assert reached == [] and sent[0]["status"] == 401, path
    assert asgi_call({"type": "http", "path": path}, token=KEY)[1] == [path]


def test_lifespan_events_pass_through_without_a_token():
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    import asyncio

    asyncio.run(BearerAuthMiddleware(app, Security(api_key=KEY))({"type": "lifespan"}, None, None))
    assert reached == ["lifespan"]


# ---- the gRPC endpoint's token (the server interceptor and the CLI's side) ------------------------------


class CallDetails:
    def __init__(self, method: str, metadata: tuple = ()) -> None:
        self.method, self.invocation_metadata = method, metadata


class AbortContext:
    def __init__(self) -> None:
        self.aborted: tuple | None = None

    async def abort(self, code, message) -> None:
        self.aborted = (code, message)
        raise RuntimeError("aborted")


def intercept(method: str, metadata: tuple, kind: tuple[bool, bool] = (False, True)):
    """What the interceptor returns for a call: (the service's own handler, the handler it returned)."""
    import asyncio

    import grpc

    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kind]
    own = make(lambda request, context: None, request_deserializer=bytes, response_serializer=bytes)

    async def continuation(details):
        return own

    interceptor = server_side.bearer_interceptor(Security(api_key=KEY))
    return own, asyncio.run(interceptor.intercept_service(continuation, CallDetails(method, metadata)))


def denial(handler) -> tuple:
    """Call a denying handler; return (status code, message) it aborted with."""
    import asyncio

    context = AbortContext()
    behaviour = next(
        b
        for b in (handler.unary_unary, handler.unary_stream, handler.stream_unary, handler.stream_stream)
        if b is not None
    )
    with pytest.raises(RuntimeError, match="aborted"):
        asyncio.run(behaviour(None, context))
    return context.aborted


@pytest.mark.parametrize("header", [f"Bearer {KEY}", f"Bearer {KEY}".encode("latin-1")])
def test_a_grpc_call_with_the_token_reaches_its_handler_as_str_or_bytes(header):
    own, got = intercept("/stagevisor.v1.Synthesis/Synthesize", (("authorization", header),))
    assert got is own


@pytest.mark.parametrize("method", sorted(server_side.UNAUTHENTICATED_METHODS))
def test_grpc_health_needs_no_token(method):
    own, got = intercept(method, ())
    assert got is own


def test_health_is_the_only_method_open_without_a_token():
    assert server_side.UNAUTHENTICATED_METHODS == {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}


@pytest.mark.parametrize(
    "metadata, reason",
    [
        ((), "no bearer token"),
        ((("authorization", "Bearer wrong-token-0123456789"),), "a wrong bearer token"),
        ((("authorization", "Basic dXNlcjpwYXNz"),), "an authorization header of another scheme than Bearer"),
    ],
)
@pytest.mark.parametrize("kind", [(False, False), (False, True), (True, False), (True, True)])
def test_a_grpc_call_without_the_token_ends_unauthenticated_saying_why_in_its_own_streaming_kind(
    metadata, reason, kind
):
    import grpc

    own, got = intercept("/stagevisor.v1.Synthesis/Synthesize", metadata, kind)
    assert got is not own
    assert (got.request_streaming, got.response_streaming) == kind
    assert got.request_deserializer is own.request_deserializer
    assert got.response_serializer is own.response_serializer
    code, message = denial(got)
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert message.startswith(f"the call carried {reason}; send `authorization: Bearer <API key>`")
    assert "--api-key-file or $STAGEVISOR_API_KEY" in message


def test_an_unknown_method_is_left_to_grpc():
    import asyncio

    async def continuation(details):
        return None

    interceptor = server_side.bearer_interceptor(Security(api_key=KEY))
    assert asyncio.run(interceptor.intercept_service(continuation, CallDetails("/no.Such/Method"))) is None


def test_an_endpoint_without_a_token_has_no_interceptor_and_one_with_a_token_has_one():
    assert Security().grpc_interceptors() == []
    assert len(Security(api_key=KEY).grpc_interceptors()) == 1


class ClientCallDetails:
    method, timeout, credentials, wait_for_ready, compression = "/m", 5.0, None, True, None

    def __init__(self, metadata) -> None:
        self.metadata = metadata


@pytest.mark.parametrize("metadata", [None, (("x-trace", "1"),)])
def test_the_cli_adds_the_token_to_every_call_and_keeps_the_rest(metadata):
    interceptor = client_side._token_interceptor_class()(KEY)
    seen = []

    def continuation(details, request):
        seen.append((details, request))
        return "answer"

    assert interceptor.intercept_unary_unary(continuation, ClientCallDetails(metadata), "req") == "answer"
    assert interceptor.intercept_unary_stream(continuation, ClientCallDetails(metadata), "req") == "answer"
    for details, request in seen:
        assert request == "req"
        assert list(details.metadata) == [*(metadata or ()), ("authorization", f"Bearer {KEY}")]
        assert (details.method, details.timeout, details.wait_for_ready) == ("/m", 5.0, True)


# ---- secrets stay out of logs; whom the CLI trusts; what a bad TLS file is told ------------------------


def test_no_secret_of_an_endpoint_shows_in_its_repr():
    endpoint = Security(cert_pem=b"CERT-PEM", key_pem=b"KEY-PEM", client_ca_pem=b"CA-PEM", api_key=KEY)
    shown = repr(endpoint)
    assert not any(secret in shown for secret in ("CERT-PEM", "KEY-PEM", "CA-PEM", KEY))
    client = client_side.ClientSecurity(api_key=KEY, tls=True, ca_pem=b"CA-PEM", cert_pem=b"CERT-PEM", key_pem=b"K")
    assert not any(secret in repr(client) for secret in ("CERT-PEM", "CA-PEM", KEY, "b'K'"))


def test_the_cli_trusts_admin_sockets_of_its_own_user_and_root_only():
    assert client_side.trusted_uids() == frozenset({os.getuid(), 0})


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    from tests.certificates import make_certificates

    return make_certificates(tmp_path_factory.mktemp("pems"))


def test_a_client_ca_that_is_not_a_ca_bundle_is_refused_with_the_tls_librarys_reason(pems):
    with pytest.raises(SecurityError) as caught:
        server_side.load_security(tls_cert=pems.server_cert, tls_key=pems.server_key, tls_client_ca=pems.server_key)
    assert caught.value.message == f"--tls-client-ca {pems.server_key} is not a PEM CA bundle (no certificate in it)"


def test_a_key_that_does_not_match_the_certificate_is_refused_with_the_tls_librarys_reason(pems):
    with pytest.raises(SecurityError) as caught:
        server_side.load_security(tls_cert=pems.server_cert, tls_key=pems.client_key)
    assert caught.value.message.endswith("matching unencrypted private key (KEY_VALUES_MISMATCH)")


# ---- the CLI's checks of a unix admin socket before it dials ------------------------------------------


def test_the_cli_dials_a_listening_socket_of_its_own_in_a_private_directory(tmp_path):
    import socket

    tmp_path.chmod(0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(tmp_path / "admin.sock"))
        server.listen(1)
        client_side.check_admin_socket(f"unix:{tmp_path / 'admin.sock'}")
        client_side.check_admin_socket(f"unix://{tmp_path / 'admin.sock'}")
    finally:
        server.close()


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o730, 0o702, 0o703, 0o722])
def test_a_socket_in_a_directory_its_group_or_others_may_write_to_is_not_dialed(tmp_path, mode):
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(mode)
    with pytest.raises(SecurityError) as caught:
        client_side.check_admin_socket(f"unix:{directory / 'admin.sock'}")
    assert f"its directory {directory} is writable by other users (mode {mode:04o})" in caught.value.message
    assert caught.value.code is ErrorCode.INSECURE_ENDPOINT


@pytest.mark.parametrize("mode", [0o1770, 0o1777, 0o750, 0o755])
def test_a_socket_directory_others_cannot_write_to_or_that_is_sticky_is_trusted(tmp_path, mode):
    directory = tmp_path / "run"
    directory.mkdir()
    directory.chmod(mode)
    client_side.check_admin_socket(f"unix:{directory / 'admin.sock'}")


def test_a_socket_whose_directory_is_a_symbolic_link_is_not_dialed(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(SecurityError, match=f"its directory {tmp_path / 'link'} is a symbolic link"):
        client_side.check_admin_socket(f"unix:{tmp_path / 'link' / 'admin.sock'}")


def test_a_socket_under_a_path_that_is_not_a_directory_is_not_dialed(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(SecurityError, match=f"{tmp_path / 'file'} is not a directory"):
        client_side.check_admin_socket(f"unix:{tmp_path / 'file' / 'admin.sock'}")


def test_a_listener_of_an_untrusted_user_is_not_dialed_and_named_by_its_uid(monkeypatch):
    import socket

    monkeypatch.setattr(client_side, "trusted_uids", lambda: frozenset({54321}))
    name = f"stagevisor-test-untrusted-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("\0" + name)
        server.listen(1)
        with pytest.raises(SecurityError) as caught:
            client_side.check_admin_socket(f"unix-abstract:{name}")
    finally:
        server.close()
    assert caught.value.code is ErrorCode.INSECURE_ENDPOINT
    assert caught.value.message.startswith(
        f"not dialing unix-abstract:{name}: the process listening there runs as uid {os.getuid()}, "
        f"not as you (uid {os.getuid()}) or root"
    )


def test_a_socket_in_a_directory_that_does_not_exist_is_left_for_the_dial_to_report(tmp_path):
    client_side.check_admin_socket(f"unix:{tmp_path / 'missing' / 'admin.sock'}")


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a socket to another user")
def test_a_socket_of_another_user_is_not_dialed(tmp_path):
    import socket

    tmp_path.chmod(0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(tmp_path / "admin.sock"))
        os.chown(tmp_path / "admin.sock", 54321, 54321)
        with pytest.raises(SecurityError, match="the socket belongs to uid 54321") as caught:
            client_side.check_admin_socket(f"unix:{tmp_path / 'admin.sock'}")
        assert caught.value.code is ErrorCode.INSECURE_ENDPOINT
    finally:
        server.close()


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a directory to another user")
def test_a_socket_in_another_users_directory_is_not_dialed(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(SecurityError, match=f"its directory {theirs} belongs to uid 54321"):
        client_side.check_admin_socket(f"unix:{theirs / 'admin.sock'}")


def test_an_abstract_admin_address_with_nothing_listening_is_left_for_the_dial_to_report():
    client_side.check_admin_socket(f"unix-abstract:stagevisor-test-nobody-{os.getpid()}")


def test_the_cli_dials_an_abstract_socket_its_own_user_listens_on():
    import socket

    name = f"stagevisor-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("\0" + name)
        server.listen(1)
        client_side.check_admin_socket(f"unix-abstract:{name}")
    finally:
        server.close()


def test_cli_options_left_out_mean_plaintext_without_a_token():
    settings = client_side.client_security(cli_options(), {})
    assert settings == client_side.ClientSecurity()


@pytest.mark.parametrize("tls, api_key", [(False, None), (True, None), (False, KEY), (True, KEY)])
def test_the_cli_channel_uses_tls_and_the_token_as_configured(monkeypatch, tls, api_key):
    import grpc

    made = []
    monkeypatch.setattr(grpc, "secure_channel", lambda address, credentials: made.append(("secure", address)) or "s")
    monkeypatch.setattr(grpc, "insecure_channel", lambda address: made.append(("insecure", address)) or "i")
    monkeypatch.setattr(grpc, "intercept_channel", lambda channel, interceptor: ("token", channel))
    channel = client_side.ClientSecurity(api_key=api_key, tls=tls).channel("127.0.0.1:1")
    assert made == [("secure" if tls else "insecure", "127.0.0.1:1")]
    plain = "s" if tls else "i"
    assert channel == (("token", plain) if api_key else plain)


def test_a_client_certificate_and_key_given_as_flags_alone_turn_mutual_tls_on(pems):
    flags = cli_options(tls_client_cert=str(pems.client_cert), tls_client_key=str(pems.client_key))
    settings = client_side.client_security(flags, {})
    assert settings.tls
    assert settings.cert_pem == pems.client_cert.read_bytes() and settings.key_pem == pems.client_key.read_bytes()


def test_a_client_certificate_and_key_from_the_environment_alone_turn_mutual_tls_on(pems):
    environ = {
        client_side.ENV_TLS_CLIENT_CERT: str(pems.client_cert),
        client_side.ENV_TLS_CLIENT_KEY: str(pems.client_key),
    }
    settings = client_side.client_security(cli_options(), environ)
    assert settings.tls and settings.key_pem == pems.client_key.read_bytes()


def test_a_secret_file_that_cannot_be_read_is_named_with_the_systems_reason(tmp_path):
    missing = tmp_path / "missing.key"
    with pytest.raises(SecurityError) as caught:
        secret_files.load_api_key(missing)
    assert caught.value.message == f"cannot read the API key file {missing} (--api-key-file): No such file or directory"
    assert caught.value.code is ErrorCode.INVALID_CONFIG


def test_endpoint_and_client_settings_are_immutable_values():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        server_side.Security().api_key = KEY  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        client_side.ClientSecurity().tls = True  # type: ignore[misc]


# ---- what an endpoint's settings turn into (credentials, uvicorn options, the admin token) ---------------


def test_tls_is_on_when_a_certificate_is_loaded():
    assert Security(cert_pem=b"CERT", key_pem=b"KEY").tls
    assert not Security(key_pem=b"KEY").tls and not Security().tls
    assert Security(cert_pem=b"C", key_pem=b"K", client_ca_pem=b"CA").mutual_tls


def test_the_admin_api_s_token_replaces_the_token_and_keeps_the_tls_material():
    from pathlib import Path

    public = Security(Path("c.pem"), Path("k.pem"), Path("ca.pem"), b"C", b"K", b"CA", api_key=KEY)
    admin = public.with_api_key("admin-token-0123456789")
    assert admin.api_key == "admin-token-0123456789" and public.api_key == KEY
    assert admin == Security(Path("c.pem"), Path("k.pem"), Path("ca.pem"), b"C", b"K", b"CA", "admin-token-0123456789")
    assert public.with_api_key(None).authenticated is False


@pytest.mark.parametrize("client_ca, required", [(b"", False), (b"CA-PEM", True)])
def test_the_grpc_server_credentials_pair_the_key_with_its_certificate_and_require_a_client_cert_for_mutual_tls(
    monkeypatch, client_ca, required
):
    import grpc

    made = []
    monkeypatch.setattr(grpc, "ssl_server_credentials", lambda *a, **kw: made.append((a, kw)) or "credentials")
    endpoint = Security(cert_pem=b"CERT-PEM", key_pem=b"KEY-PEM", client_ca_pem=client_ca)
    assert endpoint.grpc_server_credentials() == "credentials"
    assert made == [
        (([(b"KEY-PEM", b"CERT-PEM")],), {"root_certificates": client_ca or None, "require_client_auth": required})
    ]


def test_uvicorn_serves_the_certificate_and_key_files_and_asks_clients_for_theirs_only_with_mutual_tls():
    import ssl
    from pathlib import Path

    files = dict(cert_file=Path("/etc/c.pem"), key_file=Path("/etc/k.pem"), cert_pem=b"C", key_pem=b"K")
    assert Security(**files).uvicorn_ssl_options() == {"ssl_certfile": "/etc/c.pem", "ssl_keyfile": "/etc/k.pem"}
    mutual = Security(**files, client_ca_file=Path("/etc/ca.pem"), client_ca_pem=b"CA")
    assert mutual.uvicorn_ssl_options() == {
        "ssl_certfile": "/etc/c.pem",
        "ssl_keyfile": "/etc/k.pem",
        "ssl_ca_certs": "/etc/ca.pem",
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }


def test_a_key_file_whose_path_cannot_be_examined_gets_no_warning(tmp_path):
    (tmp_path / "file").write_text("x")
    assert key_file_warning(tmp_path / "file" / "api.key", "--api-key-file") is None  # NotADirectoryError


def test_admin_on_loopback_tcp_with_tls_but_no_token_is_refused():
    with pytest.raises(SecurityError, match="every local user could stop the daemon") as caught:
        server_side.check_admin_exposure("127.0.0.1:50552", Security(cert_pem=b"C", key_pem=b"K"))
    assert caught.value.code is ErrorCode.INSECURE_ENDPOINT


@pytest.mark.parametrize("method", ["/grpc.health.v1.Health/List", "/grpc.health.v1.HealthAdmin/Check"])
def test_only_the_two_health_probes_are_open_not_every_health_named_method(method):
    own, got = intercept(method, ())
    assert got is not own
    assert denial(got)[0].name == "UNAUTHENTICATED"


def test_a_401_tells_the_client_to_use_the_bearer_scheme():
    sent, reached = asgi_call({"type": "http", "path": "/v1/models"}, token=None)
    assert reached == []
    start = sent[0]
    headers = dict(start["headers"])
    assert start["status"] == 401
    assert headers[b"www-authenticate"] == b'Bearer realm="stagevisor"'
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(sent[1]["body"])


def test_a_client_key_needs_its_certificate(tmp_path):
    import argparse

    (tmp_path / "client.key").write_text("KEY")
    options = argparse.Namespace(
        api_key_file=None, tls=False, tls_ca=None, tls_client_cert=None, tls_client_key=str(tmp_path / "client.key")
    )
    with pytest.raises(SecurityError, match="go together") as caught:
        client_side.client_security(options, {})
    assert caught.value.code is ErrorCode.INVALID_CONFIG


def test_a_client_certificate_turns_tls_on_and_each_file_is_read_for_its_part(pems):
    import argparse

    options = argparse.Namespace(
        api_key_file=None,
        tls=False,
        tls_ca=None,
        tls_client_cert=str(pems.client_cert),
        tls_client_key=str(pems.client_key),
    )
    settings = client_side.client_security(options, {})
    assert settings.tls and settings.ca_pem is None
    assert (settings.cert_pem, settings.key_pem) == (pems.client_cert.read_bytes(), pems.client_key.read_bytes())


def test_the_cli_trusts_root_besides_its_own_user_whoever_it_runs_as(monkeypatch):
    monkeypatch.setattr(client_side.os, "getuid", lambda: 1000)
    assert client_side.trusted_uids() == frozenset({1000, 0})


def test_a_listener_that_never_accepts_does_not_hang_the_cli_s_check(tmp_path):
    import socket
    import time

    tmp_path.chmod(0o700)
    path = str(tmp_path / "admin.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting: list[socket.socket] = []
    try:
        server.bind(path)
        server.listen(0)
        while True:  # fill the backlog: the next connect would wait for an accept that never comes
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            waiting.append(client)
            try:
                client.connect(path)
            except BlockingIOError:
                break
        started = time.monotonic()
        client_side.check_admin_socket(f"unix:{path}")  # gives up on the probe: nothing answers there
        assert time.monotonic() - started < 10
    finally:
        for client in waiting:
            client.close()
        server.close()


@pytest.mark.parametrize(
    "endpoint, described",
    [
        (Security(), "plaintext, no authentication"),
        (Security(api_key=KEY), "plaintext, bearer token"),
        (Security(cert_pem=b"C", key_pem=b"K"), "TLS, no authentication"),
        (Security(cert_pem=b"C", key_pem=b"K", client_ca_pem=b"CA", api_key=KEY), "mutual TLS, bearer token"),
    ],
)
def test_an_endpoint_describes_its_transport_and_its_authentication_each_on_its_own(endpoint, described):
    assert endpoint.describe() == described


def cli_options(**given):
    import argparse

    options = dict(api_key_file=None, tls=False, tls_ca=None, tls_client_cert=None, tls_client_key=None)
    return argparse.Namespace(**{**options, **given})


def test_the_tls_flag_alone_turns_tls_on_against_the_system_cas():
    settings = client_side.client_security(cli_options(tls=True), {})
    assert settings.tls and settings.ca_pem is None and settings.cert_pem is None


def test_a_token_from_the_environment_is_checked_by_the_same_rules_naming_the_variable():
    with pytest.raises(SecurityError) as caught:
        client_side.client_security(cli_options(), {client_side.ENV_API_KEY: "short"})
    assert caught.value.message.startswith(f"${client_side.ENV_API_KEY}: the API key has 5 characters")
    settings = client_side.client_security(cli_options(), {client_side.ENV_API_KEY: f"  {KEY}\n"})
    assert settings.api_key == KEY


def test_a_ca_bundle_that_cannot_be_read_is_named_with_its_flag(tmp_path):
    with pytest.raises(SecurityError) as caught:
        client_side.client_security(cli_options(tls_ca=str(tmp_path / "missing.pem")), {})
    assert caught.value.message.startswith(f"cannot read the CA bundle {tmp_path / 'missing.pem'} (--tls-ca)")


def test_the_cli_s_tls_channel_presents_its_certificate_with_its_key_and_verifies_with_its_ca(monkeypatch):
    import grpc

    made = []
    monkeypatch.setattr(grpc, "ssl_channel_credentials", lambda **kw: made.append(kw) or "credentials")
    monkeypatch.setattr(grpc, "secure_channel", lambda address, credentials: ("secure", address, credentials))
    client = client_side.ClientSecurity(tls=True, ca_pem=b"CA-PEM", cert_pem=b"CERT-PEM", key_pem=b"KEY-PEM")
    assert client.channel("daemon:50051") == ("secure", "daemon:50051", "credentials")
    assert made == [{"root_certificates": b"CA-PEM", "private_key": b"KEY-PEM", "certificate_chain": b"CERT-PEM"}]


def test_a_grpc_call_without_any_metadata_is_refused_not_crashed():
    own, got = intercept("/stagevisor.v1.Synthesis/Synthesize", None)
    assert got is not own
    code, message = denial(got)
    assert code.name == "UNAUTHENTICATED" and "no bearer token" in message


@pytest.mark.parametrize("text", ["", "  \n", "a key with spaces in it", "é" * 20, "short"])
def test_every_unusable_key_is_invalid_config(text):
    with pytest.raises(SecurityError) as caught:
        secret_files.parse_api_key(text, "--api-key-file k")
    assert caught.value.code is ErrorCode.INVALID_CONFIG


def test_the_key_the_hint_tells_how_to_generate_is_one_the_rules_accept():
    import contextlib
    import io
    import re

    command = re.search(r"python3 -c '(.+)' > FILE", secret_files.GENERATE_HINT).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(command, {})  # the hint's own one-liner
    assert secret_files.parse_api_key(printed.getvalue(), "--api-key-file FILE") == printed.getvalue().strip()


def test_a_bearer_header_that_is_not_utf_8_is_refused_with_a_401_not_a_crash():
    authorization = b"Bearer \xff\xfe" + KEY.encode()
    sent, reached = asgi_call({"type": "http", "path": "/v1/models"}, token=None, authorization=authorization)
    assert reached == [] and sent[0]["status"] == 401


def test_a_socket_or_directory_of_an_untrusted_user_is_not_dialed_whoever_runs_the_tests(tmp_path, monkeypatch):
    import socket

    tmp_path.chmod(0o700)
    owner = os.stat(tmp_path).st_uid
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(tmp_path / "admin.sock"))
        monkeypatch.setattr(client_side, "trusted_uids", lambda: frozenset({54321}))
        with pytest.raises(SecurityError, match=f"its directory {tmp_path} belongs to uid {owner}") as caught:
            client_side.check_admin_socket(f"unix:{tmp_path / 'admin.sock'}")
        assert caught.value.code is ErrorCode.INSECURE_ENDPOINT
        # a directory owned by a trusted user, holding a socket of an untrusted one
        monkeypatch.setattr(client_side, "trusted_uids", lambda: frozenset({owner}))
        monkeypatch.setattr(client_side.os, "lstat", _socket_owned_by(54321, tmp_path / "admin.sock"))
        with pytest.raises(SecurityError, match="the socket belongs to uid 54321"):
            client_side.check_admin_socket(f"unix:{tmp_path / 'admin.sock'}")
    finally:
        server.close()


def _socket_owned_by(uid: int, path):
    real_lstat = os.lstat

    def lstat(target, *args, **kwargs):
        info = real_lstat(target, *args, **kwargs)
        if os.fspath(target) == str(path):
            fields = list(info)
            fields[stat.ST_UID] = uid
            return os.stat_result(fields)
        return info

    return lstat


WRONG = "wrong-token-0123456789"


@pytest.mark.parametrize("first, second", [(KEY, WRONG), (WRONG, KEY), (KEY, KEY)])
def test_a_grpc_call_with_two_authorization_values_is_refused_whichever_holds_the_token(first, second):
    """gRPC metadata used to let the last value win (and HTTP the first): two values are ambiguous to a proxy."""
    import grpc

    metadata = (("authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}"))
    own, got = intercept("/stagevisor.v1.Synthesis/Synthesize", metadata)
    assert got is not own
    code, message = denial(got)
    assert code is grpc.StatusCode.UNAUTHENTICATED and message.startswith("the call carried 2 authorization headers")


@pytest.mark.parametrize("first, second", [(KEY, WRONG), (WRONG, KEY), (KEY, KEY)])
def test_an_http_request_with_two_authorization_headers_is_refused_whichever_holds_the_token(first, second):
    import asyncio

    reached: list[str] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    headers = [(b"authorization", f"Bearer {first}".encode()), (b"authorization", f"Bearer {second}".encode())]
    scope = {"type": "http", "path": "/v1/models", "headers": headers}
    asyncio.run(BearerAuthMiddleware(app, Security(api_key=KEY))(scope, None, send))
    assert reached == [] and sent[0]["status"] == 401
    assert json.loads(sent[1]["body"])["error"]["message"].startswith("the request carried 2 authorization headers")


def test_the_key_file_the_hint_tells_how_to_generate_draws_no_warning_about_its_mode(tmp_path):
    """The hint (and `serve --help`'s recipe) wrote the key with `> FILE` alone: at the usual umask 022 that is
    mode 0644, and `serve --api-key-file` then warned the file is readable by other users. The recipe sets the
    umask it needs; here the file is created as the shell would create it under that umask."""
    import re

    umask = re.search(r"\(umask (0[0-7]{2,3}); python3 -c '.+' > FILE\)", secret_files.GENERATE_HINT)
    assert umask, f"the hint makes the file at the caller's umask: {secret_files.GENERATE_HINT}"
    key = tmp_path / "api.key"
    previous = os.umask(int(umask.group(1), 8))
    try:
        os.close(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))  # a shell's `>` asks for 0666
    finally:
        os.umask(previous)
    assert secret_files.key_file_warning(key, "--api-key-file") is None
