"""The shipped Kubernetes manifest validates against the Kubernetes schema and sizes /dev/shm; so does the Dockerfile.

The schemas come with the kubernetes-validate package (the `test` extra): no network at test time.
"""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

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
