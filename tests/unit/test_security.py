"""supervisor/security/: bearer-token checks, loading TLS and key files with clear errors, admin exposure, the CLI."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from stagevisor.supervisor.errors import ErrorCode
from stagevisor.supervisor.security.client import (
    ENV_API_KEY,
    ENV_TLS_CA,
    aio_token_interceptors,
    check_admin_socket,
    client_security,
)
from stagevisor.supervisor.security.files import SecurityError, key_file_warning
from stagevisor.supervisor.security.server import Security, check_admin_exposure, check_bearer, load_security
from tests.certificates import make_certificates

TOKEN = "s3cret-token-0123456789"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


def key_file(tmp_path: Path, text: str = TOKEN, name: str = "api.key") -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    "header, expected",
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),
        (f"  Bearer   {TOKEN}  ", True),
        (f"Bearer {TOKEN}x", False),
        (f"Bearer {TOKEN[:-1]}", False),
        (f"Basic {TOKEN}", False),
        (TOKEN, False),
        ("Bearer ", False),
        ("", False),
        (None, False),
        ("Bearer \udcff", False),
    ],
)
def test_check_bearer_accepts_only_the_exact_token(header, expected):
    assert check_bearer(header, TOKEN) is expected


def test_an_endpoint_without_a_token_accepts_every_call():
    assert Security().check_bearer(None) is True
    assert Security(api_key=TOKEN).check_bearer(None) is False


def test_the_token_never_shows_in_repr():
    assert TOKEN not in repr(Security(api_key=TOKEN))


def test_tls_files_load_and_describe_themselves(certs, tmp_path):
    security = load_security(
        tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=certs.ca, api_key_file=key_file(tmp_path)
    )
    assert security.tls and security.mutual_tls and security.api_key == TOKEN
    assert security.describe() == "mutual TLS, bearer token"
    assert security.grpc_server_credentials() is not None
    assert len(security.grpc_interceptors()) == 1
    options = security.uvicorn_ssl_options()
    assert options["ssl_certfile"] == str(certs.server_cert)
    assert options["ssl_cert_reqs"] == ssl.CERT_REQUIRED and options["ssl_ca_certs"] == str(certs.ca)


def test_plaintext_has_no_credentials_interceptors_or_ssl_options():
    security = load_security()
    assert security.describe() == "plaintext, no authentication"
    assert security.grpc_server_credentials() is None
    assert security.grpc_interceptors() == [] and security.uvicorn_ssl_options() == {}


@pytest.mark.parametrize(
    "kwargs, complaint",
    [
        (lambda c: dict(tls_cert=c.server_cert), "--tls-cert needs --tls-key"),
        (lambda c: dict(tls_key=c.server_key), "--tls-key needs --tls-cert"),
        (lambda c: dict(tls_client_ca=c.ca), "--tls-client-ca (mutual TLS) needs --tls-cert"),
        (lambda c: dict(tls_cert=c.server_cert, tls_key=c.client_key), "not a PEM certificate chain and its matching"),
        (lambda c: dict(tls_cert=c.server_key, tls_key=c.server_key), "not a PEM certificate chain"),
        (
            lambda c: dict(tls_cert=c.server_cert, tls_key=c.server_key, tls_client_ca=c.server_key),
            "is not a PEM CA bundle",
        ),
        (
            lambda c: dict(tls_cert=c.server_cert.with_name("missing.pem"), tls_key=c.server_key),
            "cannot read the TLS certificate",
        ),
    ],
)
def test_unusable_tls_settings_are_invalid_config_naming_the_flag(certs, kwargs, complaint):
    with pytest.raises(SecurityError) as caught:
        load_security(**kwargs(certs))
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert complaint in caught.value.message


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("", "holds no API key"),
        ("   \n", "holds no API key"),
        ("short", "has 5 characters; use at least 16"),
        ("two words in a token", "printable ASCII without spaces"),
        ("tökenwithumlaut-0123456789", "printable ASCII"),
    ],
)
def test_unusable_api_keys_are_refused(tmp_path, text, complaint):
    with pytest.raises(SecurityError, match="generate one with") as caught:
        load_security(api_key_file=key_file(tmp_path, text))
    assert complaint in caught.value.message


def test_a_key_file_saved_with_a_byte_order_mark_and_crlf_gives_the_key_alone(tmp_path):
    """Windows editors save text so: the key itself is the same token the client sends."""
    path = tmp_path / "bom.key"
    path.write_bytes(b"\xef\xbb\xbf" + TOKEN.encode() + b"\r\n")
    assert load_security(api_key_file=path).api_key == TOKEN


def test_a_key_file_others_can_read_gets_a_warning(tmp_path):
    path = key_file(tmp_path)
    assert key_file_warning(path, "--api-key-file") is None
    path.chmod(0o644)
    assert "readable by other users (mode 0644); chmod 600" in key_file_warning(path, "--api-key-file")


@pytest.mark.parametrize("address", ["unix:/run/x/admin.sock", "unix:///run/x/admin.sock"])
def test_an_admin_unix_socket_needs_nothing(address):
    check_admin_exposure(address, Security())


def test_an_abstract_admin_socket_needs_a_token():
    """An abstract socket has no file permissions: any local user can connect to it."""
    with pytest.raises(SecurityError, match="abstract unix socket, which has no file permissions") as caught:
        check_admin_exposure("unix-abstract:stagevisor", Security())
    assert caught.value.code is ErrorCode.INSECURE_ENDPOINT
    check_admin_exposure("unix-abstract:stagevisor", Security(api_key=TOKEN))


def test_the_cli_refuses_a_socket_path_that_is_a_regular_file_or_a_link(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SecurityError, match="it is not a socket"):
        check_admin_socket(f"unix:{tmp_path / 'file'}")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    with pytest.raises(SecurityError, match="it is a symbolic link"):
        check_admin_socket(f"unix:{tmp_path / 'link'}")


def test_the_cli_accepts_a_missing_socket_in_a_private_directory_and_tcp(tmp_path):
    tmp_path.chmod(0o700)
    check_admin_socket(f"unix:{tmp_path / 'admin.sock'}")  # no daemon: the caller reports that
    check_admin_socket("127.0.0.1:50552")


def test_the_cli_accepts_a_sticky_shared_directory_but_not_a_plain_writable_one(tmp_path):
    (tmp_path / "file").write_text("x")
    tmp_path.chmod(0o1777)
    with pytest.raises(SecurityError, match="it is not a socket"):  # the directory passed, the file did not
        check_admin_socket(f"unix:{tmp_path / 'file'}")
    tmp_path.chmod(0o777)
    with pytest.raises(SecurityError, match="writable by other users"):
        check_admin_socket(f"unix:{tmp_path / 'file'}")


def test_admin_on_loopback_tcp_needs_a_token():
    with pytest.raises(SecurityError, match="every local user could stop the daemon") as caught:
        check_admin_exposure("127.0.0.1:50552", Security())
    assert caught.value.code is ErrorCode.INSECURE_ENDPOINT
    check_admin_exposure("127.0.0.1:50552", Security(api_key=TOKEN))


@pytest.mark.parametrize(
    "security, missing",
    [
        (Security(), "--tls-cert/--tls-key and --admin-api-key-file"),
        (Security(api_key=TOKEN), "--tls-cert/--tls-key"),
        (Security(cert_pem=b"x", key_pem=b"y"), "--admin-api-key-file"),
    ],
)
def test_admin_on_another_host_needs_tls_and_a_token(security, missing):
    with pytest.raises(SecurityError) as caught:
        check_admin_exposure("0.0.0.0:50552", security)
    assert caught.value.code is ErrorCode.INSECURE_ENDPOINT
    assert f"give {missing}," in caught.value.message
    check_admin_exposure("0.0.0.0:50552", Security(cert_pem=b"x", key_pem=b"y", api_key=TOKEN))


def args(**kw) -> argparse.Namespace:
    base = dict(api_key_file=None, tls=False, tls_ca=None, tls_client_cert=None, tls_client_key=None)
    return argparse.Namespace(**{**base, **kw})


def test_the_cli_reads_token_and_ca_from_the_environment(certs):
    settings = client_security(args(), {ENV_API_KEY: TOKEN, ENV_TLS_CA: str(certs.ca)})
    assert settings.api_key == TOKEN and settings.tls and settings.ca_pem == certs.ca.read_bytes()


def test_cli_flags_win_over_the_environment(certs, tmp_path):
    settings = client_security(
        args(api_key_file=str(key_file(tmp_path, "flag-token-0123456789")), tls_ca=str(certs.other_ca)),
        {ENV_API_KEY: TOKEN, ENV_TLS_CA: str(certs.ca)},
    )
    assert settings.api_key == "flag-token-0123456789" and settings.ca_pem == certs.other_ca.read_bytes()


def test_the_cli_dials_plaintext_without_settings():
    settings = client_security(args(), {})
    assert not settings.tls and settings.api_key is None


def test_an_asyncio_channel_sends_the_token_with_unary_and_streaming_calls():
    """`bench --address` dials with grpc.aio, and sent no token: every request to a protected daemon failed."""
    import asyncio

    import grpc

    sent = []

    async def continuation(details, request):
        sent.append(list(details.metadata))
        return "call"

    async def calls():
        unary, stream = aio_token_interceptors(TOKEN)
        details = grpc.aio.ClientCallDetails("/m", 5.0, grpc.aio.Metadata(("x-id", "1")), None, None)
        assert await unary.intercept_unary_unary(continuation, details, b"") == "call"
        assert await stream.intercept_unary_stream(continuation, details._replace(metadata=None), b"") == "call"

    asyncio.run(calls())
    assert sent == [[("x-id", "1"), ("authorization", f"Bearer {TOKEN}")], [("authorization", f"Bearer {TOKEN}")]]
    unary, stream = aio_token_interceptors(TOKEN)  # grpc.aio files an interceptor under the first kind it is
    assert isinstance(unary, grpc.aio.UnaryUnaryClientInterceptor) and not isinstance(
        unary, grpc.aio.UnaryStreamClientInterceptor
    )
    assert isinstance(stream, grpc.aio.UnaryStreamClientInterceptor)


@pytest.mark.parametrize("api_key", [None, TOKEN])
@pytest.mark.parametrize("tls", [False, True])
def test_an_asyncio_channel_dials_tls_and_sends_the_token_as_configured(monkeypatch, api_key, tls):
    """`bench --address` and the load generator dial with `aio_channel`: TLS only where configured (a plaintext
    daemon refuses a TLS handshake), the token's interceptors only with a token (and then on every call)."""
    import asyncio

    import grpc

    from stagevisor.supervisor.security.client import ClientSecurity

    dialled = []
    monkeypatch.setattr(
        grpc.aio, "secure_channel", lambda address, credentials, interceptors: dialled.append(("tls", interceptors))
    )
    monkeypatch.setattr(
        grpc.aio, "insecure_channel", lambda address, interceptors: dialled.append(("plaintext", interceptors))
    )
    ClientSecurity(api_key=api_key, tls=tls).aio_channel("unix:/nowhere.sock")
    ((kind, interceptors),) = dialled
    assert kind == ("tls" if tls else "plaintext")
    if api_key is None:
        assert interceptors is None
    else:
        unary, stream = interceptors
        assert isinstance(unary, grpc.aio.UnaryUnaryClientInterceptor)
        assert isinstance(stream, grpc.aio.UnaryStreamClientInterceptor)
        sent = []

        async def continuation(details, request):
            sent.append(list(details.metadata))

        details = grpc.aio.ClientCallDetails("/m", 5.0, None, None, None)
        asyncio.run(stream.intercept_unary_stream(continuation, details, b""))
        assert sent == [[("authorization", f"Bearer {TOKEN}")]]


@pytest.mark.parametrize("contents", [b"root:x:0:0:root:/root:/bin/bash\n", b"", "private key"])
def test_the_cli_refuses_a_ca_file_that_is_not_a_pem_certificate_before_dialling(certs, tmp_path, contents):
    """`--tls-ca /etc/passwd` was taken: gRPC printed four lines of its own and the daemon was called wedged."""
    path = tmp_path / "ca.pem"
    path.write_bytes(certs.server_key.read_bytes() if contents == "private key" else contents)
    with pytest.raises(SecurityError) as caught:
        client_security(args(tls_ca=str(path)), {})
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert caught.value.message.startswith(f"--tls-ca {path} is not a PEM CA bundle (")
    assert "give the PEM file (-----BEGIN CERTIFICATE-----) of the CA that signed the daemon's --tls-cert" in (
        caught.value.message
    )


DER_ADVICE = "a binary file; a DER certificate converts with `openssl x509 -inform DER -in FILE -out FILE.pem`"


def der_copy(pem_path: Path, tmp_path: Path) -> Path:
    """The certificate at `pem_path` as DER, the binary form a CA is also handed out in."""
    path = tmp_path / "ca.der"
    path.write_bytes(ssl.PEM_cert_to_DER_cert(pem_path.read_text()))
    return path


def commented_bundle(pem_path: Path, tmp_path: Path) -> Path:
    """The CA in a bundle with comment lines around it, some in UTF-8, as distributions' bundles have them."""
    path = tmp_path / "bundle.pem"
    path.write_bytes(
        "# Issuer: CN=Főtanúsítvány Example Root\n# Serial: 1\n".encode() + pem_path.read_bytes() + b"\n# end\n"
    )
    return path


def test_a_der_ca_file_is_named_as_binary_with_the_conversion_on_both_sides(certs, tmp_path):
    """It used to crash the CLI with a traceback (TypeError: cadata should be an ASCII string)."""
    der = der_copy(certs.ca, tmp_path)
    with pytest.raises(SecurityError) as client:
        client_security(args(tls_ca=str(der)), {})
    assert client.value.message.startswith(f"--tls-ca {der} is not a PEM CA bundle ({DER_ADVICE}): give the PEM")
    with pytest.raises(SecurityError) as server:
        load_security(tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=der)
    assert server.value.message == f"--tls-client-ca {der} is not a PEM CA bundle ({DER_ADVICE})"


def test_a_ca_bundle_with_comments_in_utf8_is_taken_on_both_sides(certs, tmp_path):
    """The CLI crashed on it too; gRPC itself reads such a bundle, skipping the text around the certificates."""
    bundle = commented_bundle(certs.ca, tmp_path)
    assert client_security(args(tls_ca=str(bundle)), {}).ca_pem == bundle.read_bytes()
    security = load_security(tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=bundle)
    assert security.mutual_tls and security.client_ca_pem == bundle.read_bytes()


def test_a_damaged_certificate_in_a_ca_file_is_refused(certs, tmp_path):
    text = certs.ca.read_text().splitlines()
    text[2] = "A" * len(text[2])  # a line of the base64 body
    path = tmp_path / "damaged.pem"
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(SecurityError, match="is not a PEM CA bundle \\(a certificate that does not parse\\)"):
        client_security(args(tls_ca=str(path)), {})


def test_a_ca_file_from_the_environment_that_is_not_pem_is_refused_naming_the_variable(tmp_path):
    path = tmp_path / "ca.pem"
    path.write_text("not a certificate\n")
    with pytest.raises(SecurityError, match=f"^\\${ENV_TLS_CA}={path} is not a PEM CA bundle"):
        client_security(args(), {ENV_TLS_CA: str(path)})


@pytest.mark.parametrize(
    "kw, env, tls_from",
    [
        ({}, {}, ()),
        ({"tls": True}, {}, ("--tls",)),
        ({"tls": True, "tls_ca": "CA"}, {ENV_TLS_CA: "CA"}, ("--tls", "--tls-ca")),
        ({}, {ENV_TLS_CA: "CA"}, (f"${ENV_TLS_CA}",)),
        (
            {"tls_client_cert": "CERT", "tls_client_key": "KEY"},
            {},
            ("--tls-client-cert/--tls-client-key",),
        ),
    ],
)
def test_the_cli_settings_say_what_turned_tls_on(certs, kw, env, tls_from):
    """What an operator must drop or unset when the daemon serves plaintext."""
    files = {"CA": str(certs.ca), "CERT": str(certs.client_cert), "KEY": str(certs.client_key)}
    settings = client_security(
        args(**{key: files.get(value, value) for key, value in kw.items()}),
        {key: files[value] for key, value in env.items()},
    )
    assert (settings.tls, settings.tls_from) == (bool(tls_from), tls_from)


def test_a_client_certificate_needs_its_key(certs):
    with pytest.raises(SecurityError, match="go together"):
        client_security(args(tls_client_cert=str(certs.client_cert)), {})


@pytest.mark.parametrize(
    "extra, complaint",
    [
        (("--admin-address", "0.0.0.0:50552"), "give --tls-cert/--tls-key and --admin-api-key-file"),
        (("--admin-address", "127.0.0.1:50552"), "every local user could stop the daemon"),
    ],
)
def test_serve_refuses_an_unprotected_tcp_admin_address_before_anything_starts(
    tmp_path, monkeypatch, capsys, extra, complaint
):
    from stagevisor.supervisor.cli import main

    monkeypatch.setenv("STAGEVISOR_RUNTIME_DIR", str(tmp_path / "run"))
    assert main(["serve", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --admin-address") and complaint in err
    assert not (tmp_path / "run").exists()


def test_serve_refuses_one_token_for_both_the_public_and_the_admin_api(tmp_path, monkeypatch, capsys):
    from stagevisor.supervisor.cli import main

    monkeypatch.setenv("STAGEVISOR_RUNTIME_DIR", str(tmp_path / "run"))
    path = key_file(tmp_path)
    assert main(["serve", "--api-key-file", str(path), "--admin-api-key-file", str(path)]) == 2
    assert "the admin API needs its own token" in capsys.readouterr().err


def call_asgi(app, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    import asyncio
    import json

    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "path": path, "headers": headers}, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(body) if body else {}


async def ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


def test_http_requests_without_the_token_get_401_in_the_openai_error_envelope():
    from stagevisor.supervisor.http.auth import BearerAuthMiddleware

    app = BearerAuthMiddleware(ok_app, Security(api_key=TOKEN))
    status, body = call_asgi(app, "/v1/audio/speech", [])
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
    assert call_asgi(app, "/v1/models", [(b"authorization", b"Bearer wrong-token-0123456789")])[0] == 401
    assert call_asgi(app, "/v1/models", [(b"authorization", f"Bearer {TOKEN}".encode())]) == (200, {"ok": True})
    assert call_asgi(app, "/health", [])[0] == 200
    assert call_asgi(BearerAuthMiddleware(ok_app, Security()), "/v1/models", [])[0] == 200


def encrypted_copy(key: Path, target: Path) -> Path:
    """`key` (PEM) encrypted with a passphrase, as `openssl pkey -aes256` writes it."""
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    target.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    return target


def test_an_encrypted_server_key_is_refused_instead_of_asking_for_its_passphrase(certs, tmp_path):
    """OpenSSL asked for the passphrase on the daemon's terminal (or failed reading one) before any message."""
    key = encrypted_copy(certs.server_key, tmp_path / "server.key")
    with pytest.raises(SecurityError) as caught:
        load_security(tls_cert=str(certs.server_cert), tls_key=str(key))
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert caught.value.message.startswith(f"--tls-cert {certs.server_cert} and --tls-key {key}: the private key is")
    assert "gRPC takes only an unencrypted PEM key" in caught.value.message


@pytest.mark.parametrize("problem", ["mismatch", "encrypted", "not pem"])
def test_the_cli_refuses_a_client_certificate_and_key_that_are_not_a_pair_before_dialling(certs, tmp_path, problem):
    """Taken as given, they failed every handshake, which read as a daemon that does not answer."""
    if problem == "mismatch":
        key = certs.server_key
    elif problem == "encrypted":
        key = encrypted_copy(certs.client_key, tmp_path / "client.key")
    else:
        key = key_file(tmp_path, "not a key at all", "client.key")
    with pytest.raises(SecurityError) as caught:
        client_security(args(tls_client_cert=str(certs.client_cert), tls_client_key=str(key)), {})
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    named = f"--tls-client-cert {certs.client_cert} and --tls-client-key {key}"
    expected = {"encrypted": ": the private key is encrypted"}.get(problem, " are not a PEM certificate chain")
    assert caught.value.message.startswith(named + expected), caught.value.message


def test_a_client_key_pair_from_the_environment_is_named_by_its_variables(certs):
    from stagevisor.supervisor.security.client import ENV_TLS_CLIENT_CERT, ENV_TLS_CLIENT_KEY

    env = {ENV_TLS_CLIENT_CERT: str(certs.client_cert), ENV_TLS_CLIENT_KEY: str(certs.server_key)}
    with pytest.raises(SecurityError) as caught:
        client_security(args(), env)
    assert caught.value.message.startswith(
        f"${ENV_TLS_CLIENT_CERT}={certs.client_cert} and ${ENV_TLS_CLIENT_KEY}={certs.server_key} are not a PEM"
    )
    good = {ENV_TLS_CLIENT_CERT: str(certs.client_cert), ENV_TLS_CLIENT_KEY: str(certs.client_key)}
    assert client_security(args(), good).cert_pem == certs.client_cert.read_bytes()
