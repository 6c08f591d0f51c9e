"""The shipped Kubernetes manifest validates against the Kubernetes schema, sizes /dev/shm and probes liveness and
readiness apart; so does the Dockerfile.

The schemas come with the kubernetes-validate package (the `test` extra): no network at test time.
"""

from __future__ import annotations

import copy
import importlib.util
import socket
from concurrent import futures
from pathlib import Path

import grpc

import kubernetes_validate
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kubernetes" / "deployment.yaml"
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
# The oldest release with the gRPC probes the manifest uses is 1.24; 1.25 is the oldest bundled schema.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def documents() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_validates_strictly_against_the_kubernetes_schema(version):
    kinds = []
    for document in documents():
        kubernetes_validate.validate(document, version, strict=True)  # raises ValidationError
        kinds.append(document["kind"])
    assert kinds == ["Deployment", "Service"]


def test_the_validation_catches_a_misspelled_field():
    deployment = copy.deepcopy(documents()[0])
    pod_spec(deployment)["volumes"][0]["emptyDir"]["sizeLimt"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError, match="sizeLimt"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_dev_shm_is_a_sized_memory_backed_empty_dir():
    spec = pod_spec(documents()[0])
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    volume = volumes[mounts["/dev/shm"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    assert volume["emptyDir"]["sizeLimit"] == "1Gi"
    # tmpfs pages are charged to the container: its limit leaves room for them.
    assert container["resources"]["limits"]["memory"] == "9Gi"


def test_the_dockerfile_run_instructions_size_dev_shm():
    run_lines = [line for line in DOCKERFILE.read_text().splitlines() if "docker run" in line]
    assert run_lines and all("--shm-size=1g" in line for line in run_lines)


HEALTHCHECK = ROOT / "deploy" / "container" / "healthcheck.py"


def load_healthcheck():
    spec = importlib.util.spec_from_file_location("stagevisor_container_healthcheck", HEALTHCHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def health_server():
    """A gRPC health service on a free loopback port, as the daemon's public endpoint serves it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize("status", ["SERVING", "NOT_SERVING"])
def test_the_container_healthcheck_is_liveness_any_answer_passes(health_server, status, capsys):
    servicer, address = health_server
    servicer.set("stagevisor.v1.Synthesis", health_pb2.HealthCheckResponse.ServingStatus.Value(status))
    assert load_healthcheck().check(address) == 0
    assert f"is {status} (readiness)" in capsys.readouterr().out


def test_the_container_healthcheck_fails_when_nothing_answers(capsys):
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        silent = f"127.0.0.1:{probe.getsockname()[1]}"
        assert load_healthcheck().check(silent, timeout=1.0) == 1
    assert "does not answer" in capsys.readouterr().err


def container_probes() -> dict[str, dict]:
    (container,) = pod_spec(documents()[0])["containers"]
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}


def test_readiness_probes_ask_for_readiness_and_liveness_runs_the_images_liveness_check():
    probes = container_probes()
    for kind in ("startupProbe", "readinessProbe"):
        assert probes[kind]["grpc"] == {"port": 50551, "service": "stagevisor.v1.Synthesis"}, kind
    # A gRPC (or HTTP /ready) liveness probe fails on NOT_SERVING: readiness, which restarts pods the daemon heals.
    liveness = probes["livenessProbe"]
    assert set(liveness) & {"grpc", "httpGet", "tcpSocket"} == set()
    command = liveness["exec"]["command"]
    assert command[-1] == "/opt/stagevisor/healthcheck.py"
    dockerfile = DOCKERFILE.read_text()
    assert f"COPY deploy/container/healthcheck.py {command[-1]}" in dockerfile
    assert f'CMD ["python", "{command[-1]}"]' in dockerfile
    assert liveness["timeoutSeconds"] > 3  # the check's own gRPC deadline, plus the interpreter's start
