"""The OpenAPI document at /openapi.json: valid 3.1, one operation per route, and true to what the routes answer."""

from __future__ import annotations

import re

import jsonschema
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route
from starlette.responses import PlainTextResponse
from starlette.testclient import TestClient

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS
from stagevisor.supervisor.config import SpeechConfig
from stagevisor.supervisor.http.app import create_app
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.names import voice_map
from stagevisor.supervisor.http.openapi import document
from stagevisor.supervisor.http.operations import METRICS_OPERATION, OPERATIONS
from stagevisor.supervisor.http.request import Served, parse_speech_request
from tests.fakes import FakeSpeechDaemon


def metrics_route() -> Route:
    async def metrics(request):
        return PlainTextResponse("# nothing\n")

    return Route("/metrics", metrics, methods=["GET"])


def served_operations(app) -> set[tuple[str, str]]:
    """(path, method) of every route, a path parameter's convertor dropped (`{model:path}` is `{model}`)."""
    return {
        (re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path), method.lower())
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }


def test_the_document_is_valid_openapi_3_1():
    doc = document([*OPERATIONS, METRICS_OPERATION], version="1.0", authenticated=True)
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_has_exactly_one_operation_and_every_operation_a_route():
    app = create_app(FakeSpeechDaemon(), extra_routes=[metrics_route()], extra_operations=[METRICS_OPERATION])
    documented = {(op.path, op.method) for op in [*OPERATIONS, METRICS_OPERATION]}
    assert len(documented) == len(OPERATIONS) + 1, "an operation is listed twice"
    assert served_operations(app) == documented


def test_openapi_json_is_served_with_the_routes_passed_in():
    client = TestClient(
        create_app(FakeSpeechDaemon(), extra_routes=[metrics_route()], extra_operations=[METRICS_OPERATION])
    )
    doc = client.get("/openapi.json").json()
    assert "/metrics" in doc["paths"] and "/v1/audio/speech" in doc["paths"]
    assert "securitySchemes" not in doc["components"]
    plain = TestClient(create_app(FakeSpeechDaemon())).get("/openapi.json").json()
    assert "/metrics" not in plain["paths"]


def _schema_of(doc: dict, path: str, status: int) -> dict:
    responses = doc["paths"][path]["get"]["responses"]
    response = responses.get(str(status), responses["default"])
    schema = response["content"]["application/json"]["schema"]
    return {**schema, "components": doc["components"]}


@pytest.mark.parametrize("group_state", ["READY", "STARTING"])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/audio/voices", "/v1/topology", "/health", "/ready", "/nope"])
def test_json_answers_match_their_documented_schema(path, group_state):
    client = TestClient(create_app(FakeSpeechDaemon(group_state)))
    doc = client.get("/openapi.json").json()
    response = client.get(path)
    documented = doc["paths"].get(path, doc["paths"]["/health"])  # an unknown path answers the default error
    if path not in doc["paths"]:
        assert response.status_code == 404
    else:
        assert str(response.status_code) in documented["get"]["responses"]
    jsonschema.validate(
        response.json(), _schema_of(doc, path if path in doc["paths"] else "/health", response.status_code)
    )


@pytest.mark.parametrize("stand_in", [False, True])
def test_v1_models_says_whether_stand_ins_run_the_model(stand_in):
    models = TestClient(create_app(FakeSpeechDaemon(stand_in=stand_in))).get("/v1/models").json()["data"]
    assert "fake" in [m["id"] for m in models] and {m["stand_in"] for m in models} == {stand_in}


def test_v1_models_name_answers_the_model_by_any_of_its_names_and_404_for_another():
    """OpenAI's SDKs call `client.models.retrieve(name)`; before, every name was a 404 `not_found` (no such route)."""
    client = TestClient(create_app(FakeSpeechDaemon()))
    doc = client.get("/openapi.json").json()
    listed = client.get("/v1/models").json()["data"]
    for entry in listed:
        response = client.get(f"/v1/models/{entry['id']}")
        assert (response.status_code, response.json()) == (200, entry)
        jsonschema.validate(response.json(), {**doc["components"]["schemas"]["Model"], "components": doc["components"]})
    missing = client.get("/v1/models/Qwen/Qwen3-TTS-12Hz-1.7B-Base")
    error = missing.json()["error"]
    assert (missing.status_code, error["code"], error["param"]) == (404, "model_not_found", "model")
    assert "'Qwen/Qwen3-TTS-12Hz-1.7B-Base' is not served here" in error["message"]


def test_a_local_model_path_is_listed_nowhere_yet_still_answered_as_a_model_name():
    """
    1. `serve --model-path /srv/models/qwen3`: GET /v1/models listed the path as an id, and a request for another
       model was told it ("this daemon serves ..., '/srv/models/qwen3', ..."): the daemon's directory layout;
    2. a client already sending the path as `model` is still answered, and `client.models.retrieve(path)` finds
       the model under the name it asked for (it learns nothing it did not send).
    """
    daemon = FakeSpeechDaemon()
    daemon.plan.model_path = "/srv/models/qwen3"
    client = TestClient(create_app(daemon))
    listed = client.get("/v1/models").json()["data"]
    assert "/srv/models/qwen3" not in [entry["id"] for entry in listed] and listed[0]["id"] == "fake"
    retrieved = client.get("/v1/models//srv/models/qwen3")
    assert (retrieved.status_code, retrieved.json()) == (200, {**listed[0], "id": "/srv/models/qwen3"})
    refused = client.post("/v1/audio/speech", json={"model": "/srv/models/qwen3", "input": ""}).json()["error"]
    assert refused["param"] == "input"  # past the model check
    other = client.post("/v1/audio/speech", json={"model": "tts-2", "input": "Hi."}).json()["error"]
    assert other["code"] == "model_not_found" and "/srv/models" not in other["message"]


def test_an_error_answer_matches_the_error_schema():
    client = TestClient(create_app(FakeSpeechDaemon()))
    doc = client.get("/openapi.json").json()
    response = client.post("/v1/audio/speech", content=b"{", headers={"content-type": "application/json"})
    assert response.status_code == 400
    jsonschema.validate(response.json(), {**doc["components"]["schemas"]["Error"], "components": doc["components"]})


def test_v1_topology_is_the_cli_s_topology_json_plus_status_and_admission():
    """GET /v1/topology and `stagevisor topology --format json` print the same report the same way."""
    from tests.unit.reports.samples import STATUS, TOPOLOGY

    daemon = FakeSpeechDaemon()
    daemon.topology = lambda: TOPOLOGY
    daemon.status = lambda: STATUS
    client = TestClient(create_app(daemon))
    response = client.get("/v1/topology")
    body = response.json()
    assert {k: v for k, v in body.items() if k not in ("status", "admission")} == TOPOLOGY.to_json()
    assert list(body)[: len(TOPOLOGY.to_json())] == list(TOPOLOGY.to_json())
    assert body["status"] == STATUS.to_json() and body["admission"]["max_concurrent"] >= 0
    jsonschema.validate(body, _schema_of(client.get("/openapi.json").json(), "/v1/topology", 200))


def _speech_client(gateway) -> TestClient:
    daemon = FakeSpeechDaemon()
    daemon.gateway = gateway
    return TestClient(create_app(daemon))


def test_the_input_limit_in_the_document_is_the_one_the_daemon_serves_now():
    """`input` had no maxLength, though the daemon refuses more than 5000 characters, or fewer where a stage of the
    pipeline declares less (known once its worker is READY, so the document follows the gateway)."""
    daemon = FakeSpeechDaemon()
    client = TestClient(create_app(daemon))

    def limits(doc: dict) -> tuple[int, int]:
        body = doc["components"]["schemas"]["SpeechInput"]["maxLength"]
        [query] = [p for p in doc["paths"]["/v1/audio/speech"]["get"]["parameters"] if p["name"] == "input"]
        resolved = doc["components"]["schemas"][query["schema"]["$ref"].rpartition("/")[2]]["maxLength"]
        assert doc["components"]["schemas"]["SpeechRequest"]["properties"]["input"] == ref_to("SpeechInput")
        return body, resolved

    assert limits(client.get("/openapi.json").json()) == (DEFAULT_MAX_TEXT_CHARS, DEFAULT_MAX_TEXT_CHARS)
    daemon.gateway.max_text_chars = 300  # a stage declaring `max_text_chars = 300` became READY
    doc = client.get("/openapi.json").json()
    assert limits(doc) == (300, 300)
    validate(doc)


def test_the_seed_range_in_the_document_and_in_v1_models_is_the_served_models():
    """The document said 0 to 2^32-1 for every model; a model declaring another range (Qwen3-TTS: 2^63-1) has its
    own, and GET /v1/models says the same."""
    from stagevisor.supervisor.config import SpeechConfig
    from stagevisor.supervisor.http.names import SpeechSettings

    def served(speech: SpeechConfig) -> tuple[dict, dict]:
        client = TestClient(create_app(FakeSpeechDaemon(), settings=SpeechSettings(speech=speech)))
        doc = client.get("/openapi.json").json()
        validate(doc)
        seed = doc["components"]["schemas"]["SpeechRequest"]["properties"]["seed"]
        return seed, client.get("/v1/models").json()["data"][0]["accepts"]

    seed, accepts = served(SpeechConfig(seed=True, seed_maximum=2**63 - 1))
    assert (seed["minimum"], seed["maximum"]) == (0, 2**63 - 1)
    assert accepts["seed_range"] == {"minimum": 0, "maximum": 2**63 - 1}
    seed, accepts = served(SpeechConfig(seed=True))
    assert seed["maximum"] == accepts["seed_range"]["maximum"] == 2**32 - 1
    assert served(SpeechConfig())[1]["seed_range"] is None  # a model that takes no seed


def ref_to(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


@pytest.mark.parametrize(("method", "stream_format"), [("post", "audio"), ("post", "sse"), ("get", "audio")])
def test_every_header_a_speech_answer_sends_is_declared_with_a_schema_it_meets(method, stream_format):
    """X-Sample-Rate (and X-Request-Id on GET, Cache-Control, X-Accel-Buffering) went out undeclared."""
    from tests.fakes import ScriptedGateway, ScriptedHandle, audio_chunk

    client = _speech_client(ScriptedGateway(ScriptedHandle([audio_chunk(240)])))
    fields = {"model": "fake", "input": "hi", "response_format": "wav"}
    if method == "post":
        response = client.post("/v1/audio/speech", json={**fields, "stream_format": stream_format})
    else:
        response = client.get("/v1/audio/speech", params=fields)
    assert response.status_code == 200, response.text
    declared = client.get("/openapi.json").json()["paths"]["/v1/audio/speech"][method]["responses"]["200"]["headers"]
    http_own = {"content-type", "transfer-encoding", "content-length", "date", "server"}
    assert {name.lower() for name in response.headers} - http_own <= {name.lower() for name in declared}
    for name, header in declared.items():
        value = response.headers.get(name)
        assert value is not None or not header.get("required"), name
        if value is not None:
            jsonschema.validate(int(value) if header["schema"].get("type") == "integer" else value, header["schema"])


def test_a_refusal_by_admission_control_declares_its_retry_after():
    from stagevisor.supervisor.dataplane.admission import AdmissionRejected
    from tests.fakes import ScriptedGateway

    refusal = AdmissionRejected("RESOURCE_EXHAUSTED", "BUSY", "the daemon is busy", retry_after=7)
    client = _speech_client(ScriptedGateway(refusal=refusal))
    response = client.post("/v1/audio/speech", json={"model": "fake", "input": "hi"})
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    declared = client.get("/openapi.json").json()["paths"]["/v1/audio/speech"]["post"]["responses"]["429"]
    jsonschema.validate(7, declared["headers"]["Retry-After"]["schema"])


def test_head_on_the_speech_url_is_405_and_synthesizes_nothing():
    """starlette routes HEAD to every GET route: `curl -I '/v1/audio/speech?input=Hi'` ran a whole synthesis and
    held a request slot until its first audio, to answer headers only."""
    from tests.fakes import ScriptedGateway, ScriptedHandle, audio_chunk

    gateway = ScriptedGateway(ScriptedHandle([audio_chunk(240)]))
    response = _speech_client(gateway).head("/v1/audio/speech", params={"model": "fake", "input": "hi"})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"
    assert gateway.payloads == []


def test_a_request_for_no_route_is_told_where_the_routes_are_listed():
    """A 404 pointed at "the README", which a client of the API does not have; the daemon lists its routes itself."""
    client = TestClient(create_app(FakeSpeechDaemon()))
    answer = client.get("/v1/audio/speeches")
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert message.startswith("no route GET /v1/audio/speeches; ") and "GET /openapi.json" in message
    assert "/v1/audio/speech" in client.get("/openapi.json").json()["paths"]


def test_v1_models_root_is_the_models_key_not_the_path_the_operator_typed():
    """`root` was --model-path as typed: a local path showed clients the daemon's directory layout, and it named one
    spelling of the model rather than the model every listed id stands for (OpenAI's `root`)."""
    daemon = FakeSpeechDaemon()
    daemon.plan.model_path = "/srv/private/checkpoints/fake"
    listed = TestClient(create_app(daemon)).get("/v1/models").json()["data"]
    assert {entry["root"] for entry in listed} == {"fake"}


def test_v1_models_shows_an_integer_options_bounds_as_json_integers():
    """An integer option's bounds were stored as floats: `"maximum": 100000.0` for Qwen3-TTS's top_k, and a bound
    past 2^53 was no longer the declared one (2^63-1 became 2^63)."""
    import json

    from stagevisor.supervisor.config import OptionSpec, SpeechConfig
    from stagevisor.supervisor.http.names import SpeechSettings

    options = {
        "top_k": OptionSpec(type="integer", minimum=0, maximum=100_000),
        "steps": OptionSpec(type="integer", minimum=1.0, maximum=float(2**32 - 1)),  # as a YAML `4294967295.0` reads
        "big": OptionSpec(type="integer", minimum=0, maximum=2**63 - 1),
    }
    settings = SpeechSettings(speech=SpeechConfig(options=options))
    body = TestClient(create_app(FakeSpeechDaemon(), settings=settings)).get("/v1/models").text
    shown = json.loads(body)["data"][0]["accepts"]["options"]
    bounds = {name: (shown[name]["minimum"], shown[name]["maximum"]) for name in options}
    assert bounds == {"top_k": (0, 100_000), "steps": (1, 2**32 - 1), "big": (0, 2**63 - 1)}
    assert all(type(bound) is int for pair in bounds.values() for bound in pair)
    assert '"maximum":4294967295,' in body.replace(" ", "") and "4294967295.0" not in body


@pytest.mark.parametrize(
    "voice",
    ["heart", "", None, {"id": "heart"}, {"id": "heart", "name": "Heart"}, {"id": None}, {}, ["heart"], 7],
    ids=repr,
)
def test_the_speech_schema_admits_a_voice_exactly_where_a_request_takes_it(voice):
    """A client generated from the document, or a fuzzer, must not be told a voice is valid that the request then
    refuses: `{"id": "heart", "name": ...}` was admitted by the schema (an object with more keys) and refused as
    `invalid_type`."""
    doc = document(OPERATIONS, version="1.0")
    schema = {**doc["components"]["schemas"]["SpeechRequest"], "components": doc["components"]}
    body = {"model": "fake", "input": "Hello.", "voice": voice}
    voices = [{"id": "heart"}]
    served = Served(models=("fake",), voices=voices, voice_map=voice_map(voices, {}), speech=SpeechConfig())
    try:
        parse_speech_request(body, served)
        taken = True
    except ApiError as error:
        assert error.param == "voice", error.message
        taken = False
    assert jsonschema.Draft202012Validator(schema).is_valid(body) == taken
