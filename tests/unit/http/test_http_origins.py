"""The Origin check: another site's page may not open the speech WebSocket or POST a form through a browser."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient, WebSocketDenialResponse

from stagevisor.supervisor.http.origins import WORKING_GETS, origin_authority, same_origin
from stagevisor.supervisor.http.server import uvicorn_config
from stagevisor.supervisor.http.settings import HttpSettings

DAEMON = "http://127.0.0.1:8000"
WS = "ws://127.0.0.1:8000/stream"


def app() -> Starlette:
    async def hello(request):
        return PlainTextResponse("hi")

    async def stream(websocket):
        await websocket.accept()
        await websocket.send_text("spoken")
        await websocket.close()

    return Starlette(
        routes=[
            Route("/hello", hello, methods=["GET", "POST"]),
            Route("/v1/audio/speech", hello, methods=["GET", "POST"]),
            WebSocketRoute("/stream", stream),
        ]
    )


def client(*cors_origins: str) -> TestClient:
    config = uvicorn_config(app(), settings=HttpSettings(cors_origins=cors_origins))
    return TestClient(config.app, base_url=DAEMON)


def test_a_websocket_from_another_sites_page_is_refused_with_403_naming_the_option():
    """Cross-site WebSocket hijacking: any page the operator visits could speak through a loopback daemon."""
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client().websocket_connect(WS, headers={"Origin": "https://evil.example"}):
            pass
    assert refused.value.status_code == 403
    error = refused.value.json()["error"]
    assert error["code"] == "origin_not_allowed"
    assert "--http-cors-origin https://evil.example" in error["message"]


@pytest.mark.parametrize(
    "origin", ["http://127.0.0.1:9999", "null", "http://localhost:8000", "https://127.0.0.1:8000x"]
)
def test_a_websocket_from_another_port_a_null_origin_or_another_name_is_refused(origin):
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client().websocket_connect(WS, headers={"Origin": origin}):
            pass
    assert refused.value.status_code == 403


@pytest.mark.parametrize("headers", [{}, {"Origin": DAEMON}])
def test_a_websocket_without_an_origin_or_from_the_daemons_own_page_is_served(headers):
    with client().websocket_connect(WS, headers=headers) as websocket:
        assert websocket.receive_text() == "spoken"


def test_a_websocket_from_a_configured_cors_origin_is_served():
    with client("https://app.example.com").websocket_connect(WS, headers={"Origin": "https://app.example.com"}) as ws:
        assert ws.receive_text() == "spoken"


def test_a_form_post_from_another_sites_page_is_refused_and_a_get_is_left_to_cors():
    """A multipart POST needs no preflight: without the check, any page could upload voices to the daemon."""
    foreign = {"Origin": "https://evil.example"}
    posted = client().post("/hello", headers=foreign, files={"audio": ("a.wav", b"RIFF")})
    assert posted.status_code == 403 and posted.json()["error"]["code"] == "origin_not_allowed"
    assert client().get("/hello", headers=foreign).status_code == 200
    assert client().post("/hello", headers={"Origin": DAEMON}).status_code == 200
    assert client("https://evil.example").post("/hello", headers=foreign).status_code == 200


@pytest.mark.parametrize(
    "headers, status",
    [
        ({"Origin": "https://evil.example"}, 403),
        ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "audio"}, 403),  # an <audio src>: no Origin sent
        ({"Sec-Fetch-Site": "same-site"}, 403),  # a page on another port of the same host
        ({"Sec-Fetch-Site": "same-origin"}, 200),  # the daemon's own playground page
        ({"Sec-Fetch-Site": "none"}, 200),  # typed in the address bar
        ({}, 200),  # curl, SDKs
        ({"Origin": DAEMON}, 200),
    ],
)
def test_a_speech_get_another_sites_page_makes_is_refused(headers, status):
    """Before: GET /v1/audio/speech was left to CORS like any read, but it does work: an `<audio src>` on any page
    the operator visited spoke its text through a loopback daemon, on its compute."""
    answer = client().get("/v1/audio/speech?input=hi", headers=headers)
    assert answer.status_code == status
    if status == 403:
        assert answer.json()["error"]["code"] == "origin_not_allowed"


def test_a_cross_site_speech_get_passes_where_every_origin_is_allowed():
    assert client("*").get("/v1/audio/speech", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


@pytest.mark.parametrize(
    "origin, authority",
    [
        ("https://Tts.Example.com", ("tts.example.com", 443)),
        ("http://127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("http://[::1]:8000", ("::1", 8000)),
        ("null", None),
        ("file://", None),
        ("http://host:port", None),
    ],
)
def test_an_origin_reads_as_its_host_and_port(origin, authority):
    assert origin_authority(origin) == authority


@pytest.mark.parametrize(
    "host, same",
    [("127.0.0.1:8000", True), ("127.0.0.1", True), ("127.0.0.1:8001", False), ("localhost:8000", False)],
)
def test_a_host_header_without_a_port_matches_on_the_name(host, same):
    assert same_origin(("127.0.0.1", 8000), host) is same


@pytest.mark.parametrize(
    "host", ["evil.com@localhost", "evil.com@localhost:8000", "localhost/x", "localhost?a", "a\\b"]
)
def test_a_host_header_with_more_than_a_name_and_a_port_is_malformed(host):
    """`evil.com@localhost` passed the Host check as `localhost` (urlsplit took `evil.com` for userinfo)."""
    from stagevisor.supervisor.http.origins import host_and_port

    assert host_and_port(host) is None
    assert host_and_port("LocalHost:8000") == ("localhost", 8000)


def test_a_foreign_host_name_gets_a_coded_400_naming_the_option_that_lets_it_in():
    """DNS rebinding: the page's own name arrives as Host; the refusal tells a legitimate user what to do."""
    response = TestClient(uvicorn_config(app()).app, base_url="http://evil.example:8000").get("/hello")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_host" and error["param"] == "Host"
    assert "--http-allowed-host evil.example" in error["message"]


def test_a_websocket_to_a_foreign_host_name_gets_the_same_coded_400():
    with pytest.raises(WebSocketDenialResponse) as refused:
        with TestClient(uvicorn_config(app()).app).websocket_connect("ws://evil.example:8000/stream"):
            pass
    assert refused.value.status_code == 400 and refused.value.json()["error"]["code"] == "invalid_host"


@pytest.mark.parametrize("host", ["LOCALHOST:8000", "[::1]:8000", "127.0.0.1"])
def test_loopback_names_in_any_case_with_or_without_a_port_are_answered(host):
    response = TestClient(uvicorn_config(app()).app).get("/hello", headers={"Host": host})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("host", ["127.0.0.1:http", "127.0.0.1.evil.example", "", "a b"])
def test_a_malformed_or_look_alike_host_is_refused(host):
    response = TestClient(uvicorn_config(app()).app).get("/hello", headers={"Host": host})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_host"


def test_a_configured_pattern_admits_subdomains_only():
    settings = HttpSettings(allowed_hosts=("*.example.com",))
    served = TestClient(uvicorn_config(app(), bind_host="0.0.0.0", settings=settings).app)
    assert served.get("/hello", headers={"Host": "tts.example.com"}).status_code == 200
    assert served.get("/hello", headers={"Host": "example.com.evil"}).status_code == 400


@pytest.mark.parametrize("pattern", ["a*b", "*example.com", "tts.*"])
def test_a_host_pattern_with_a_star_elsewhere_than_a_leading_label_is_refused_when_parsed(pattern):
    """It used to pass the CLI and crash `serve` with an AssertionError traceback once the server started."""
    with pytest.raises(ValueError, match=r"allowed_host .* use `\*` alone or a leading `\*\.`"):
        HttpSettings(allowed_hosts=(pattern,))


def test_a_configured_origin_may_delete_an_uploaded_voice_and_other_origins_may_not():
    """The CORS methods were GET and POST only: an allowed page could upload a voice but never delete it."""
    preflight = {"Access-Control-Request-Method": "DELETE"}
    allowed = client("https://app.example.com").options(
        "/hello", headers={**preflight, "Origin": "https://app.example.com"}
    )
    assert allowed.status_code == 200 and "DELETE" in allowed.headers["access-control-allow-methods"]
    other = client("https://app.example.com").options("/hello", headers={**preflight, "Origin": "https://evil.example"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


OPENAI_JS_HEADERS = (
    "authorization,content-type,x-stainless-lang,x-stainless-package-version,x-stainless-os,x-stainless-arch,"
    "x-stainless-runtime,x-stainless-runtime-version,x-stainless-retry-count,x-stainless-timeout"
)
"""What the openai JS SDK asks a preflight for in a browser (dangerouslyAllowBrowser): its X-Stainless-* headers."""


def test_a_configured_origin_may_call_with_the_openai_js_sdks_headers():
    """Before: the preflight allowed only authorization and content-type, so a page of a configured origin using
    the openai SDK got 400 `Disallowed CORS headers` and its browser never sent the speech request."""
    preflight = {
        "Origin": "https://app.example.com",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": OPENAI_JS_HEADERS,
    }
    answer = client("https://app.example.com").options("/hello", headers=preflight)
    assert answer.status_code == 200, answer.text
    allowed = {h.strip().lower() for h in answer.headers["access-control-allow-headers"].split(",")}
    assert set(OPENAI_JS_HEADERS.split(",")) <= allowed
    other = client("https://app.example.com").options("/hello", headers={**preflight, "Origin": "https://evil.example"})
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_a_configured_origins_page_may_read_the_headers_the_openai_sdks_act_on():
    """X-Should-Retry (a 504 carries `false`) was not exposed: the browser hid it, and the SDK in the page retried."""
    answer = client("https://app.example.com").get("/hello", headers={"Origin": "https://app.example.com"})
    exposed = {h.strip().lower() for h in answer.headers["access-control-expose-headers"].split(",")}
    assert {"x-should-retry", "retry-after", "x-request-id"} <= exposed


@pytest.mark.parametrize("path", ["/v1/audio/speech", "/hello"])
def test_a_preflight_from_an_origin_not_allowed_is_refused_as_without_cors(path):
    """Before: with --http-cors-origin, Starlette's 400 text/plain `Disallowed CORS origin`, where a daemon without
    the option answered the same preflight to /v1/audio/speech 403 origin_not_allowed in the API's envelope."""
    preflight = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    answers = [client("https://app.example").options(path, headers=preflight)]
    if path in WORKING_GETS:
        answers.append(client().options(path, headers=preflight))
    for answer in answers:
        assert (answer.status_code, answer.headers["content-type"]) == (403, "application/json")
        assert answer.json() == {
            "error": {
                "message": "a web page of 'https://evil.example' may not use this API through its visitors' "
                "browsers; if that page is yours, serve with --http-cors-origin https://evil.example",
                "type": "invalid_request_error",
                "param": None,
                "code": "origin_not_allowed",
            }
        }
        assert "access-control-allow-origin" not in answer.headers


def test_a_preflight_for_a_method_cors_does_not_allow_is_a_coded_405_naming_the_methods_it_does():
    """Before: 400 text/plain `Disallowed CORS method`; a PUT sent without a browser gets 405 method_not_allowed."""
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "PUT"}
    answer = client("https://app.example").options("/v1/audio/speech", headers=preflight)
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["type"]) == (405, "method_not_allowed", "invalid_request_error")
    assert error["message"] == (
        "a web page may not send 'PUT' to this API through its visitors' browsers; send GET, POST, DELETE"
    )
    assert answer.headers["allow"] == "GET, POST, DELETE"  # RFC 9110 section 15.5.6: every 405 carries Allow
    allowed = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    unchanged = client("https://app.example").options("/v1/audio/speech", headers=allowed)
    assert (unchanged.status_code, unchanged.text) == (200, "OK")
    assert unchanged.headers["access-control-allow-origin"] == "https://app.example"


def private_network_preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Private-Network": "true",
    }


def test_a_private_network_preflight_from_a_configured_origin_is_allowed():
    """Chrome asks before a public page reaches a loopback or private address; a page the operator named as a CORS
    origin was refused with 403, so it could not use a daemon on the visitor's own machine or network."""
    for configured in (("https://app.example",), ("*", "https://app.example")):
        answer = client(*configured).options("/hello", headers=private_network_preflight("https://app.example"))
        assert (answer.status_code, answer.text) == (200, "OK")
        assert answer.headers["access-control-allow-private-network"] == "true"
        assert answer.headers["access-control-allow-origin"] in ("https://app.example", "*")
        assert "Access-Control-Request-Private-Network" in answer.headers["vary"]


def test_a_private_network_preflight_is_refused_unless_its_origin_is_named():
    """`*` lets any page call, but not reach the visitor's private network: that origin must be named."""
    answer = client("*").options("/hello", headers=private_network_preflight("https://app.example"))
    error = answer.json()["error"]
    assert (answer.status_code, error["code"]) == (403, "private_network_not_allowed")
    assert "--http-cors-origin https://app.example" in error["message"]
    other = client("https://app.example").options("/hello", headers=private_network_preflight("https://evil.example"))
    assert (other.status_code, other.json()["error"]["code"]) == (403, "origin_not_allowed")
    named_put = client("https://app.example").options(
        "/hello", headers=private_network_preflight("https://app.example", "PUT")
    )
    assert (named_put.status_code, named_put.json()["error"]["code"]) == (405, "method_not_allowed")
    for refused in (answer, other, named_put):
        assert "access-control-allow-private-network" not in refused.headers
