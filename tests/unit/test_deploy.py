"""The deployable artifacts: Kubernetes manifests, the Compose file and the Dockerfile.

No cluster and no Docker engine here: the manifests are validated against Kubernetes' own
schemas (kubernetes-validate bundles them), and the rest is checked for what a deploy relies on.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import relayer
from relayer.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy/kubernetes"
MANIFESTS = [
    document
    for document in yaml.safe_load_all((KUBERNETES / "relayer.yaml").read_text())
    if document
]
KUBERNETES_VERSION = "1.30.0"  # the oldest release still supported when this was written


def kind(name: str) -> list[dict[str, Any]]:
    return [document for document in MANIFESTS if document["kind"] == name]


def pod_specs() -> list[dict[str, Any]]:
    return [document["spec"]["template"]["spec"] for document in kind("Deployment") + kind("Job")]


@pytest.mark.parametrize(
    "document", MANIFESTS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_each_manifest_is_valid_for_kubernetes(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_kubernetes_validate_rejects_what_a_cluster_would() -> None:
    broken = yaml.safe_load(yaml.safe_dump(kind("Deployment")[0]))
    broken["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_every_pod_is_locked_down() -> None:
    for spec in pod_specs():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 10001
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in spec.get("initContainers", []) + spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, container["name"]
            assert security["readOnlyRootFilesystem"] is True, container["name"]
            assert security["capabilities"] == {"drop": ["ALL"]}, container["name"]
            assert "memory" in container["resources"]["limits"], container["name"]


def test_images_are_pinned_to_this_version_and_the_schema_job_is_named_after_it() -> None:
    version = relayer.__version__
    for spec in pod_specs():
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert container["image"] == f"relayer:{version}", container["name"]
    [job] = kind("Job")
    # A Job's template is immutable: a new release needs a Job of a new name.
    assert job["metadata"]["name"] == f"relayer-schema-{version}"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["schema", "apply", "orders"]
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["relayer.yaml"]
    assert kustomization["images"] == [{"name": "relayer", "newTag": version}]
    for name in ("docker/Dockerfile", "docs/deploy.md", "docker/compose.yaml"):
        tags = set(re.findall(r"relayer:(\d[\w.]*\w)", (ROOT / name).read_text()))
        assert tags <= {version}, name


def test_workers_wait_for_the_schema_and_a_budget_limits_disruptions() -> None:
    [deployment] = kind("Deployment")
    [wait] = deployment["spec"]["template"]["spec"]["initContainers"]
    script = " ".join(wait["command"] + wait["args"])
    assert "until relayer schema check orders" in script
    [budget] = kind("PodDisruptionBudget")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1


def test_the_configmap_is_valid_relayer_configuration(tmp_path: Path) -> None:
    [config_map] = kind("ConfigMap")
    config = tmp_path / "relayer.toml"
    config.write_text(config_map["data"]["relayer.toml"])
    assert load_settings(config).store("orders").default_transport == "kafka"


def test_compose_runs_a_worker_and_advertises_kafka_on_its_network() -> None:
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "kafka", "rabbitmq", "relayer-schema", "relayer"} <= set(services)
    kafka = services["kafka"]["environment"]
    advertised = kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert "INTERNAL://kafka:19092" in advertised and "HOST://127.0.0.1:9092" in advertised
    listeners = {entry.split("://")[0] for entry in kafka["KAFKA_LISTENERS"].split(",")}
    protocol_map = kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    protocols = dict(entry.split(":") for entry in protocol_map.split(","))
    assert listeners <= set(protocols)
    worker = services["relayer"]
    assert worker["command"][:2] == ["run", "orders"]
    assert worker["depends_on"]["relayer-schema"] == {"condition": "service_completed_successfully"}
    assert services["relayer-schema"]["build"]["dockerfile"] == "docker/Dockerfile"
    [mount] = worker["volumes"]
    source = ROOT / "docker" / mount.split(":")[0]
    config = load_settings(source).store("orders")
    assert config.transports["events"].options["bootstrap.servers"] == "kafka:19092"
    # The same store as the example order service's, only its addresses differ.
    example = load_settings(ROOT / "examples/fastapi_sqlalchemy/relayer.toml").store("orders")
    assert config.model_copy(update={"dsn": None, "transports": {}}) == example.model_copy(
        update={"dsn": None, "transports": {}}
    )


def test_the_dockerfile_installs_existing_extras_with_an_otlp_exporter() -> None:
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The image installs the lock (tests/unit/test_image_lock.py checks it is in step), made
    # with the extras the lock script names.
    assert "pip install --require-hashes --no-deps -r requirements.lock" in dockerfile
    assert "pip install --no-deps --no-build-isolation --no-index ." in dockerfile
    extras = re.findall(r"--extra (\w+)", (ROOT / "scripts/lock_image.sh").read_text())
    assert set(extras) <= set(project["optional-dependencies"])
    extra_dependencies = project["optional-dependencies"]
    installed = [item for extra in extras for item in extra_dependencies[extra]]
    assert any(dependency.startswith("opentelemetry-exporter-otlp") for dependency in installed)
    assert any(dependency.startswith("opentelemetry-distro") for dependency in installed)
    assert "USER 10001:10001" in dockerfile  # numeric: runAsNonRoot can verify it
    copied = re.findall(r"^COPY (.+) \./", dockerfile, re.MULTILINE)
    for names in copied:
        for name in names.split():
            assert (ROOT / name).exists(), name
