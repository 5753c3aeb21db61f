"""Session fixtures: the real Temporal dev server binary, a real S3 endpoint (moto server mode),
and stores. Nothing here downloads anything or talks beyond 127.0.0.1."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from client.binaries import temporal_binary
from activities.storage import ArtifactStore, FileStore, S3Store
from contracts.settings import Settings
from workflows._visibility import SEARCH_ATTRIBUTES

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for _var in ("FLEETFORGE_LLM", "FLEETFORGE_LLM_BASE_URL", "FLEETFORGE_LLM_API_KEY", "OPENAI_API_KEY", "QAIRT_SDK_ROOT"):
    os.environ.pop(_var, None)

ARTIFACTS_DIR = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real dev server, with fleetforge's search attributes, and the pydantic converter."""
    from temporalio.contrib.pydantic import pydantic_data_converter

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter, dev_server_log_level="error",
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 HTTP endpoint on 127.0.0.1 (moto's server mode; in-memory)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def make_bucket(endpoint: str) -> str:
    import boto3

    bucket = f"ff-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def s3_store(s3_endpoint: str) -> S3Store:
    return S3Store(make_bucket(s3_endpoint), "artifacts", endpoint_url=s3_endpoint)


@pytest.fixture
def file_store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "artifacts")


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    """The same tests run against both store implementations."""
    if request.param == "file":
        return FileStore(tmp_path / "artifacts")
    endpoint = request.getfixturevalue("s3_endpoint")
    return S3Store(make_bucket(endpoint), "artifacts", endpoint_url=endpoint)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings isolated in tmp_path (file store under it)."""
    return Settings(state_dir=tmp_path / "state")


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save things a person may want to look at (screenshots, reports)."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR
