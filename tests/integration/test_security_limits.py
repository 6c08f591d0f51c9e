"""A daemon with TLS, API keys and tight request limits, driven by the CLI and by grpc clients.

grpcurl is not installable on this machine (no Go toolchain, no package); its
calls are reproduced with grpc python clients: TLS with a CA, a bearer header,
server reflection and health.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc, synthesis_pb2 as spb, synthesis_pb2_grpc as sgrpc
from tests.certificates import make_certificates
from tests.integration.daemon_helpers import ROOT, ServeProcess, poll_until
from tests.integration.limit_stages import ENTRY_MAX_TEXT_CHARS, pipeline_config

CONFIG = pipeline_config("limits-test")
MAX_AUDIO_SECONDS = 30
REQUEST_TIMEOUT = 2
IDLE_TIMEOUT = 1


class SecureDaemon:
    """The running daemon's addresses, tokens and certificates."""

    def __init__(self, process: ServeProcess, certs, api_key: str, admin_key: str) -> None:
        self.process = process
        self.certs = certs
        self.api_key = api_key
        self.admin_key = admin_key
        self.public = ""
        self.admin = ""
        self.http = ""

    def credentials(self, ca=None) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials((ca or self.certs.ca).read_bytes())

    def public_channel(self, ca=None, options=()) -> grpc.Channel:
        return grpc.secure_channel(self.public, self.credentials(ca), options=options)

    def bearer(self, token: str | None = None) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {token or self.api_key}")]

    def status(self) -> dict:
        with grpc.secure_channel(self.admin, self.credentials()) as channel:
            msg = admin_pb2_grpc.AdminStub(channel).GetStatus(
                admin_pb2.GetStatusRequest(), timeout=10, metadata=self.bearer(self.admin_key)
            )
        return {"state": msg.state, "in_flight": msg.in_flight}

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "stagevisor", *args],
            cwd=ROOT,
            env={**self.process.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secure")
    certs = make_certificates(tmp)
    api_key, admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    for name, token in (("api.key", api_key), ("admin.key", admin_key)):
        (tmp / name).write_text(token)
        (tmp / name).chmod(0o600)
    (tmp / "limits.yaml").write_text(CONFIG)
    process = ServeProcess()
    process.argv = [
        sys.executable,
        "-m",
        "stagevisor",
        "serve",
        "--config",
        str(tmp / "limits.yaml"),
        "--listen",
        "127.0.0.1:0",
        "--admin-address",
        "127.0.0.1:0",
        "--stop-timeout",
        "5",
        "--tls-cert",
        str(certs.server_cert),
        "--tls-key",
        str(certs.server_key),
        "--api-key-file",
        str(tmp / "api.key"),
        "--admin-api-key-file",
        str(tmp / "admin.key"),
        "--max-audio-seconds",
        str(MAX_AUDIO_SECONDS),
        "--request-timeout",
        str(REQUEST_TIMEOUT),
        "--stream-idle-timeout",
        str(IDLE_TIMEOUT),
        "--http",
        "127.0.0.1:0",
    ]
    with process:
        secure = SecureDaemon(process, certs, api_key, admin_key)

        def bound():
            assert process.proc.poll() is None, f"daemon exited:\n{process.log()}"
            found = dict(re.findall(r"(admin API|public endpoint) listening on (\S+)", process.log()))
            return found if len(found) == 2 else None

        found = poll_until(bound, timeout=60, message="the daemon's bound ports in its log")
        secure.admin, secure.public = found["admin API"], found["public endpoint"]
        secure.http = process.http_url()
        poll_until(lambda: secure.status()["state"] == "SERVING", timeout=90, message="daemon SERVING")
        yield secure


def synthesize(daemon: SecureDaemon, text: str = "Hello.", metadata=None, **options: str) -> list:
    with daemon.public_channel() as channel:
        call = sgrpc.SynthesisStub(channel).Synthesize(
            spb.SynthesizeRequest(text=text, options=options), timeout=60, metadata=metadata or daemon.bearer()
        )
        return list(call)


# -- TLS and tokens ---------------------------------------------------------------


def test_the_cli_synthesizes_over_tls_with_token_and_ca_from_the_environment(daemon, tmp_path):
    out = tmp_path / "out.wav"
    result = daemon.cli(
        "synthesize",
        "Hello.",
        "-o",
        str(out),
        "--address",
        daemon.public,
        env={"STAGEVISOR_API_KEY": daemon.api_key, "STAGEVISOR_TLS_CA": str(daemon.certs.ca)},
    )
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 44


def test_the_cli_without_the_token_is_unauthenticated(daemon, tmp_path):
    result = daemon.cli(
        "synthesize",
        "Hello.",
        "-o",
        str(tmp_path / "x.wav"),
        "--address",
        daemon.public,
        "--tls-ca",
        str(daemon.certs.ca),
    )
    assert result.returncode == 1
    assert "UNAUTHENTICATED" in result.stderr and "no bearer token" in result.stderr


def test_bench_at_the_address_measures_over_tls_with_token_and_ca_from_the_environment(daemon, tmp_path):
    """`bench --address` took neither $STAGEVISOR_API_KEY nor $STAGEVISOR_TLS_CA: every request failed, exit 0."""
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello.\nA second text.\n")  # within the entry stage's short text limit
    argv = ["bench", "--address", daemon.public, "--text-file", str(texts), "--requests", "3", "--concurrency", "1"]
    result = daemon.cli(
        *argv, "--warmup", "0", "--format", "json",
        env={"STAGEVISOR_API_KEY": daemon.api_key, "STAGEVISOR_TLS_CA": str(daemon.certs.ca)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (topology,) = json.loads(result.stdout)["topologies"]
    assert topology["error"] is None
    assert [(row["requests"], row["errors"]) for row in topology["rows"]] == [(3, {})]


def test_bench_without_the_token_fails_naming_the_refusal(daemon, tmp_path):
    """Every request UNAUTHENTICATED was reported as a measurement ("error": null, exit 0)."""
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello.\n")
    argv = ["bench", "--address", daemon.public, "--text-file", str(texts), "--requests", "2", "--concurrency", "1"]
    result = daemon.cli(*argv, "--warmup", "0", "--tls-ca", str(daemon.certs.ca), "--format", "json")
    assert result.returncode == 1, result.stderr
    (topology,) = json.loads(result.stdout)["topologies"]
    assert topology["error"]["code"] == "REQUESTS_FAILED"
    assert "2 UNAUTHENTICATED" in topology["error"]["message"] and "no bearer token" in topology["error"]["message"]


def test_bench_dialling_a_tls_address_in_plaintext_says_tls_mismatch(daemon, tmp_path):
    """It said DAEMON_FAILED with gRPC's connection text, as if no daemon answered there."""
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello.\n")
    argv = ["bench", "--address", daemon.public, "--text-file", str(texts), "--requests", "2", "--concurrency", "1"]
    result = daemon.cli(*argv, "--warmup", "0", "--format", "json", env={"STAGEVISOR_API_KEY": daemon.api_key})
    assert result.returncode == 1, result.stderr
    (topology,) = json.loads(result.stdout)["topologies"]
    assert topology["error"]["code"] == "TLS_MISMATCH", topology["error"]
    assert "serves its public endpoint with TLS" in topology["error"]["message"]


def test_a_wrong_token_is_unauthenticated(daemon):
    with pytest.raises(grpc.RpcError) as caught:
        synthesize(daemon, metadata=daemon.bearer("x" * 32))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "a wrong bearer token" in caught.value.details()


def test_the_admin_token_is_not_a_synthesis_token_and_the_other_way_round(daemon):
    with pytest.raises(grpc.RpcError) as caught:
        synthesize(daemon, metadata=daemon.bearer(daemon.admin_key))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    result = daemon.cli(
        "status",
        "--admin-address",
        daemon.admin,
        "--tls-ca",
        str(daemon.certs.ca),
        env={"STAGEVISOR_API_KEY": daemon.api_key},
    )
    assert result.returncode == 1 and "bearer token" in result.stderr


def test_the_admin_cli_works_over_tls_with_the_admin_token(daemon):
    result = daemon.cli(
        "status",
        "--format",
        "json",
        "--admin-address",
        daemon.admin,
        env={"STAGEVISOR_API_KEY": daemon.admin_key, "STAGEVISOR_TLS_CA": str(daemon.certs.ca)},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["state"] == "SERVING"


@pytest.mark.slow  # CLI runs that each wait out the connect timeout
def test_the_admin_cli_dialling_the_tls_daemon_in_plaintext_or_with_another_ca_is_told_so(daemon):
    """The CLI said there was no daemon and to start one (and the JSON form DAEMON_UNREACHABLE) while it served."""
    env = {"STAGEVISOR_API_KEY": daemon.admin_key}
    plaintext = daemon.cli("status", "--format", "json", "--admin-address", daemon.admin, env=env)
    assert plaintext.returncode == 2
    error = json.loads(plaintext.stdout)["error"]
    assert error["code"] == "TLS_MISMATCH"
    assert error["message"].startswith(
        f"the stagevisor daemon at {daemon.admin} serves its admin API with TLS, and this command dialled it in "
        "plaintext: give --tls-ca FILE"
    )
    other_ca = daemon.cli("status", "--admin-address", daemon.admin, "--tls-ca", str(daemon.certs.other_ca), env=env)
    assert other_ca.returncode == 2
    assert f"at {daemon.admin} serves TLS, but the connection with this command's TLS settings (--tls-ca)" in (
        other_ca.stderr
    )
    assert "CERTIFICATE_VERIFY_FAILED" in other_ca.stderr and "start one" not in other_ca.stderr


def test_a_plaintext_client_or_another_ca_cannot_connect(daemon):
    for channel in (grpc.insecure_channel(daemon.public), daemon.public_channel(ca=daemon.certs.other_ca)):
        with channel, pytest.raises(grpc.RpcError) as caught:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_health_answers_without_a_token_for_probes(daemon):
    for address in (daemon.public, daemon.admin):
        with grpc.secure_channel(address, daemon.credentials()) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def list_services(daemon: SecureDaemon, metadata) -> list[str]:
    """What `grpcurl -cacert ca.pem -H 'authorization: Bearer ...' HOST:PORT list` does."""
    with daemon.public_channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10, metadata=metadata
        )
        return [s.name for reply in replies for s in reply.list_services_response.service]


def test_reflection_needs_the_token(daemon):
    assert "stagevisor.v1.Synthesis" in list_services(daemon, daemon.bearer())
    with pytest.raises(grpc.RpcError) as caught:
        list_services(daemon, ())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


# -- the HTTP API ---------------------------------------------------------------------


def openai_client(daemon: SecureDaemon, api_key: str):
    import ssl

    import openai

    verify = ssl.create_default_context(cafile=str(daemon.certs.ca))
    return openai.OpenAI(
        base_url=daemon.http + "/v1",
        api_key=api_key,
        max_retries=0,
        timeout=60,
        http_client=openai.DefaultHttpxClient(verify=verify),
    )


def test_the_http_api_serves_tls(daemon):
    assert daemon.http.startswith("https://127.0.0.1:")


def test_the_openai_sdk_synthesizes_over_tls_with_the_key(daemon):
    with openai_client(daemon, daemon.api_key) as client:
        audio = client.audio.speech.create(
            model="limits-test", voice="x", input="Hello.", response_format="pcm", extra_body={"sample_rate": 48_000}
        )
    assert len(audio.content) == 2 * 48_000  # one second of 16-bit PCM from the source stage, at its rate


@pytest.mark.parametrize("key", [None, "wrong-key-0123456789abcdef"])
def test_the_openai_sdk_without_the_right_key_gets_401_in_the_openai_envelope(daemon, key):
    import openai

    with openai_client(daemon, key or daemon.admin_key) as client, pytest.raises(openai.AuthenticationError) as caught:
        client.audio.speech.create(model="limits-test", voice="x", input="Hello.", response_format="pcm")
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key"


def test_the_speech_websocket_needs_the_key_too(daemon):
    import ssl

    from websockets.exceptions import InvalidMessage, InvalidStatus
    from websockets.sync.client import connect

    context = ssl.create_default_context(cafile=str(daemon.certs.ca))
    url = daemon.http.replace("https://", "wss://") + "/v1/audio/speech/stream"

    @contextlib.contextmanager
    def handshake(what: str):
        # A handshake the server ended without a word (seen once in CI, never reproduced) fails with the
        # daemon's own HTTP log lines first, not the websockets parser's traceback.
        try:
            yield
        except InvalidMessage as error:
            lines = [
                line for line in daemon.process.log().splitlines() if "stagevisor.http" in line or "uvicorn" in line
            ]
            pytest.fail(
                f"{what}: {error!r} ({error.__cause__!r}); the daemon's HTTP log:\n" + "\n".join(lines[-20:]),
                pytrace=False,
            )

    with handshake("the handshake without a key"), pytest.raises(InvalidStatus) as refused:
        connect(url, ssl=context, open_timeout=30, proxy=None).close()
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
    headers = {"Authorization": f"Bearer {daemon.api_key}"}
    with (
        handshake("the handshake with the key"),
        connect(url, ssl=context, additional_headers=headers, open_timeout=30, proxy=None) as ws,
    ):
        ws.send(json.dumps({"type": "start", "model": "limits-test", "voice": "x", "sample_rate": 48000}))
        ws.send(json.dumps({"type": "text", "text": "Hello."}))
        ws.send(json.dumps({"type": "end"}))
        frames = list(ws)
    assert json.loads(frames[-1])["type"] == "done"
    assert sum(len(f) for f in frames if isinstance(f, bytes)) == 2 * 48_000


def test_http_health_stays_open_for_probes_and_plaintext_is_refused(daemon):
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=str(daemon.certs.ca))
    with urllib.request.urlopen(daemon.http + "/health", context=context, timeout=10) as answer:
        assert answer.status == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(daemon.http.replace("https://", "http://") + "/health", timeout=10)


def test_http_text_over_the_declared_limit_is_a_400(daemon):
    import openai

    with openai_client(daemon, daemon.api_key) as client, pytest.raises(openai.BadRequestError) as caught:
        client.audio.speech.create(
            model="limits-test", voice="x", input="a" * (ENTRY_MAX_TEXT_CHARS + 1), response_format="pcm"
        )
    assert f"the limit is {ENTRY_MAX_TEXT_CHARS}" in caught.value.body["message"]


# -- request limits ------------------------------------------------------------------


def test_text_over_the_limit_the_executor_declared_is_refused_at_the_gateway(daemon):
    assert len(synthesize(daemon, "a" * ENTRY_MAX_TEXT_CHARS)) == 1
    with pytest.raises(grpc.RpcError) as caught:
        synthesize(daemon, "a" * (ENTRY_MAX_TEXT_CHARS + 1))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        f"text has {ENTRY_MAX_TEXT_CHARS + 1} characters; the limit is "
        f"{ENTRY_MAX_TEXT_CHARS}, split it into several requests"
    )


def test_a_100_kb_voice_is_invalid_argument_not_resource_exhausted(daemon):
    """Before: the voice came back inside the error, past gRPC's metadata limit (RESOURCE_EXHAUSTED)."""
    with daemon.public_channel() as channel, pytest.raises(grpc.RpcError) as caught:
        list(
            sgrpc.SynthesisStub(channel).Synthesize(
                spb.SynthesizeRequest(text="Hi.", voice="v" * 100_000), timeout=60, metadata=daemon.bearer()
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "a voice name has at most" in caught.value.details()


def test_audio_past_the_cap_ends_the_request_with_resource_exhausted(daemon):
    got = []
    with daemon.public_channel() as channel:
        call = sgrpc.SynthesisStub(channel).Synthesize(
            spb.SynthesizeRequest(text="Long.", options={"seconds": "forever"}), timeout=60, metadata=daemon.bearer()
        )
        with pytest.raises(grpc.RpcError) as caught:
            for chunk in call:
                got.append(chunk)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"more than {MAX_AUDIO_SECONDS} s of audio" in caught.value.details()
    assert len(got) == MAX_AUDIO_SECONDS  # one-second chunks: every one up to the cap, none after
    poll_until(lambda: daemon.status()["in_flight"] == 0, timeout=30, message="the capped request released")


def test_a_request_running_past_the_server_deadline_is_deadline_exceeded(daemon):
    with pytest.raises(grpc.RpcError) as caught:
        synthesize(daemon, "Slow.", seconds="forever", interval="0.5")
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"longer than {REQUEST_TIMEOUT} s, the server's request timeout" in caught.value.details()


def test_a_client_that_never_reads_loses_its_slot_after_the_idle_timeout(daemon):
    """Before: a client that never read its stream held its request (and the worker's work) forever.

    1. open a stream of endless audio and read nothing
    2. the daemon shows it in flight, then gives it up after the idle timeout
    3. when the client finally reads, it gets what was buffered and DEADLINE_EXCEEDED saying why

    BDP probing is off so the client's receive window stays at its initial size, as for a client
    that stopped reading (with it on, the window grows to megabytes and the audio cap ends it first).
    """
    with daemon.public_channel(options=[("grpc.http2.bdp_probe", 0)]) as channel:
        call = sgrpc.SynthesisStub(channel).Synthesize(
            spb.SynthesizeRequest(text="Endless.", options={"seconds": "forever"}), timeout=60, metadata=daemon.bearer()
        )
        seen = threading.Event()

        def in_flight_then_released() -> bool:
            count = daemon.status()["in_flight"]
            if count:
                seen.set()
            return seen.is_set() and count == 0

        poll_until(in_flight_then_released, timeout=30, interval=0.02, message="the idle request released")
        with pytest.raises(grpc.RpcError) as caught:
            for _ in call:
                pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"read no audio for {IDLE_TIMEOUT} s (--stream-idle-timeout)" in caught.value.details()


# -- codes that tell a client what to do -------------------------------------------


def http_post(daemon: SecureDaemon, body: bytes) -> tuple[int, dict]:
    """POST /v1/audio/speech with a raw JSON body; (status, error envelope or {})."""
    import ssl
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        daemon.http + "/v1/audio/speech",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {daemon.api_key}"},
    )
    context = ssl.create_default_context(cafile=str(daemon.certs.ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=60) as answer:
            answer.read()
            return answer.status, {}
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_http_a_lone_surrogate_in_input_is_a_400_naming_input(daemon):
    """Before: 500 with a traceback from the codec (JSON carries "\\ud800"; UTF-8 cannot)."""
    status, body = http_post(daemon, b'{"model": "limits-test", "input": "a\\ud800b", "response_format": "pcm"}')
    assert status == 400, body
    assert body["error"]["param"] == "input" and "lone surrogate (U+D800) at position 1" in body["error"]["message"]


def test_http_a_too_long_voice_names_the_voice_field(daemon):
    payload = {"model": "limits-test", "input": "Hi.", "voice": "v" * 10_000, "response_format": "pcm"}
    status, body = http_post(daemon, json.dumps(payload).encode())
    assert status == 400 and body["error"]["param"] == "voice", body


def test_http_a_request_past_the_server_deadline_is_a_504(daemon):
    """Before: 500 `deadline_exceeded`. The stage waits longer than --request-timeout for its first chunk."""
    payload = {"model": "limits-test", "input": "Slow.", "delay": "30", "response_format": "pcm"}
    status, body = http_post(daemon, json.dumps(payload).encode())
    assert status == 504, body
    assert body["error"]["code"] == "deadline_exceeded" and "--request-timeout" in body["error"]["message"]


def test_grpc_60_seconds_of_48_khz_reference_audio_fit_the_public_message_limit(daemon):
    """Before: gRPC's 4 MiB default refused the 5.8 MB request with RESOURCE_EXHAUSTED (a code that says retry)."""
    wav = bytes(60 * 48_000 * 2 + 44)
    with daemon.public_channel() as channel:
        chunks = list(
            sgrpc.SynthesisStub(channel).Synthesize(
                spb.SynthesizeRequest(text="Hello.", reference_audio=wav), timeout=60, metadata=daemon.bearer()
            )
        )
    assert len(chunks) >= 1


def test_grpc_oversized_reference_audio_is_invalid_argument_saying_retrying_will_not_help(daemon):
    with daemon.public_channel() as channel, pytest.raises(grpc.RpcError) as caught:
        list(
            sgrpc.SynthesisStub(channel).Synthesize(
                spb.SynthesizeRequest(text="Hello.", reference_audio=bytes(7_000_000)),
                timeout=60,
                metadata=daemon.bearer(),
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reference audio is 7000000 bytes" in caught.value.details()
    assert "retrying will not help" in caught.value.details()


# -- mutual TLS ----------------------------------------------------------------------


def test_mutual_tls_refuses_a_client_without_a_certificate_from_the_ca(tmp_path):
    from stagevisor.supervisor.admin.endpoints import HealthReporter, create_server
    from stagevisor.supervisor.security.server import load_security

    certs = make_certificates(tmp_path)
    security = load_security(tls_cert=certs.server_cert, tls_key=certs.server_key, tls_client_ca=certs.ca)

    async def scenario() -> tuple[bool, bool]:
        server, port = create_server("127.0.0.1:0", security)
        health = HealthReporter()
        health.add_to_server(server)
        await server.start()
        await health.set(True)
        results = []
        try:
            for with_cert in (False, True):
                credentials = grpc.ssl_channel_credentials(
                    certs.ca.read_bytes(),
                    private_key=certs.client_key.read_bytes() if with_cert else None,
                    certificate_chain=certs.client_cert.read_bytes() if with_cert else None,
                )
                async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
                    try:
                        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                        results.append(True)
                    except grpc.aio.AioRpcError as error:
                        assert error.code() == grpc.StatusCode.UNAVAILABLE
                        results.append(False)
        finally:
            await server.stop(0)
        return tuple(results)

    assert asyncio.run(scenario()) == (False, True)


def test_zz_the_cli_stops_the_daemon_over_tls(daemon):
    """Last in this module: `stop` needs the admin token for Shutdown and for watching the daemon go."""
    result = daemon.cli(
        "stop",
        "--admin-address",
        daemon.admin,
        "--tls-ca",
        str(daemon.certs.ca),
        env={"STAGEVISOR_API_KEY": daemon.admin_key},
    )
    assert result.returncode == 0, result.stderr
    assert daemon.process.wait_exit(timeout=60) == 0
