"""OpenTelemetry export against a real daemon: spans received by an OTLP/HTTP receiver the test runs on
port 0 (bodies parsed with opentelemetry-proto), and nothing OpenTelemetry imported without OTEL variables."""

from __future__ import annotations

import gzip
import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.integration.daemon_helpers import DaemonProcess, make_plan, poll_until, synthesize

trace_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

NO_OTEL = "tests.integration.daemon_stages:make_no_otel"
GROUPS = {"a": "front", "b": "front", "c": "back"}


class OtlpReceiver:
    """A minimal OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest body."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Any]] = []  # (resource attributes, Span)
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.paths.append(self.path)
                    for resource_spans in request.resource_spans:
                        resource = attributes(resource_spans.resource.attributes)
                        for scope in resource_spans.scope_spans:
                            receiver.spans.extend((resource, span) for span in scope.spans)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "OtlpReceiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def traces(self) -> dict[bytes, list[Any]]:
        """trace id -> its spans, for the traces whose root span arrived."""
        with self.lock:
            spans = [span for _, span in self.spans]
        by_trace: dict[bytes, list[Any]] = {}
        for span in spans:
            by_trace.setdefault(span.trace_id, []).append(span)
        return {trace: found for trace, found in by_trace.items() if any(s.name == "synthesize" for s in found)}


def attributes(pairs: Any) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        out[pair.key] = getattr(pair.value, kind) if kind else None
    return out


def plan(factories: dict[str, str] | None = None):
    """a -> b in-process (group front), b -> c over a cross-process edge (group back)."""
    return make_plan(
        "otel-test",
        [("a", "front", None, None), ("b", "front", None, None), ("c", "back", None, None)],
        factories=factories,
    )


def otel_env(endpoint: str) -> dict[str, str]:
    """The standard variables, as an operator would set them (the SDK reads the endpoint and protocol)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "stagevisor-otel-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def http_speech(url: str) -> int:
    body = json.dumps({"model": "otel-test", "input": "hello", "response_format": "pcm"}).encode()
    request = urllib.request.Request(f"{url}/v1/audio/speech", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
        return response.status


def check_trace(spans: list[Any]) -> str:
    """Assert one request's trace: a root, a child per stage and handoff, all ended inside the root.
    Returns the request id the spans carry."""
    names = sorted(s.name for s in spans)
    assert names == sorted(["synthesize", "stage a", "stage b", "stage c", "handoff a -> b", "handoff b -> c"]), names
    by_name = {s.name: s for s in spans}
    root = by_name["synthesize"]
    root_attrs = attributes(root.attributes)
    request_id = root_attrs["stagevisor.request_id"]
    assert request_id and root_attrs["stagevisor.model"] == "otel-test"
    assert root_attrs["stagevisor.status"] == "OK" and root_attrs["rpc.grpc.status_code"] == 0
    assert not root.parent_span_id
    for span in spans:
        assert span.end_time_unix_nano >= span.start_time_unix_nano > 0, span.name
        if span is root:
            continue
        assert span.trace_id == root.trace_id and span.parent_span_id == root.span_id, span.name
        assert root.start_time_unix_nano <= span.start_time_unix_nano, span.name
        assert span.end_time_unix_nano <= root.end_time_unix_nano, span.name  # the trace ends with its root
        assert attributes(span.attributes)["stagevisor.request_id"] == request_id
    for stage, group in GROUPS.items():
        found = attributes(by_name[f"stage {stage}"].attributes)
        assert (found["stagevisor.stage"], found["stagevisor.group"]) == (stage, group)
    for src, dst, transport in (("a", "b", "in_process"), ("b", "c", "grpc")):
        found = attributes(by_name[f"handoff {src} -> {dst}"].attributes)
        assert (found["stagevisor.src"], found["stagevisor.dst"], found["stagevisor.transport"]) == (
            src,
            dst,
            transport,
        )
        assert (found["stagevisor.src_group"], found["stagevisor.dst_group"]) == (GROUPS[src], GROUPS[dst])
    return request_id


@pytest.mark.slow  # a daemon of its own with an OTLP collector
def test_spans_of_grpc_and_http_requests_reach_the_otlp_endpoint_as_one_trace_each():
    """1. A daemon runs with the standard OTEL variables pointing at a receiver on port 0.
    2. One gRPC Synthesize and one HTTP /v1/audio/speech request.
    3. Two traces arrive: a `synthesize` root with one child per stage call and handoff, carrying the stage,
       process group, transport and request id, every child ended inside its root."""
    with (
        OtlpReceiver() as receiver,
        DaemonProcess(plan(), "--http", "127.0.0.1:0", env=otel_env(receiver.endpoint)) as daemon,
    ):
        daemon.wait_serving()
        synthesize(daemon.listen, "hello")
        assert http_speech(daemon.http_url()) == 200
        traces = poll_until(
            lambda: (t := receiver.traces()) and len(t) == 2 and t,
            timeout=30,
            message="two traces at the OTLP receiver",
        )
        request_ids = {check_trace(spans) for spans in traces.values()}
        assert len(request_ids) == 2
        assert set(receiver.paths) == {"/v1/traces"}
        with receiver.lock:
            assert {resource["service.name"] for resource, _ in receiver.spans} == {"stagevisor-otel-test"}


def test_without_otel_variables_neither_the_daemon_nor_a_worker_imports_opentelemetry(tmp_path):
    """A request passes through stages that fail it if their worker imported OpenTelemetry; the daemon
    writes the modules it imported as it exits."""
    modules = tmp_path / "modules.txt"
    daemon = DaemonProcess(
        make_plan("otel-test", [("a", "solo", None, None)], factories={"a": NO_OTEL}),
        "--loaded-modules-file",
        str(modules),
    )
    daemon.env = {k: v for k, v in daemon.env.items() if not k.startswith("OTEL_")}
    with daemon:
        daemon.wait_serving()
        synthesize(daemon.listen, "hello")  # raises if a stage found OpenTelemetry in its worker
        daemon.proc.terminate()
        assert daemon.wait_exit() == 0
    loaded = modules.read_text().split()
    assert "stagevisor.supervisor.metrics.timings" in loaded  # the module that would import it, when asked
    assert not [m for m in loaded if m.split(".")[0] == "opentelemetry"]
