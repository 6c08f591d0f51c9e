"""An unexpected error in an HTTP route: a 500 naming its class and a request id the log also has, never its text."""

from __future__ import annotations

import logging

from starlette.testclient import TestClient

from stagevisor.supervisor.http.app import create_app
from tests.unit.http.test_http_openapi import FakeDaemon

SECRET = "/var/lib/stagevisor/token=hunter2"


class BrokenDaemon(FakeDaemon):
    """A daemon whose topology report fails with an error no route expects."""

    def topology(self):
        raise OSError(f"cannot read {SECRET}")


def test_an_unexpected_error_in_a_route_is_a_500_with_its_class_and_a_request_id_the_log_has(caplog):
    client = TestClient(create_app(BrokenDaemon()), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="stagevisor.http"):
        response = client.get("/v1/topology")
    request_id = response.headers["x-request-id"]
    assert response.status_code == 500 and len(request_id) == 32
    assert response.json()["error"] == {
        "message": f"the daemon failed with OSError; the daemon log has the details (request {request_id})",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert f"request {request_id}: HTTP GET /v1/topology failed" in caplog.text and SECRET in caplog.text
