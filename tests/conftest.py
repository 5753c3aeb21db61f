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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/*.md that differ from what the code renders now; those tests "
                          "still fail, so a run with this option is never green")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a slow test run first (each file in its own order): `make test` hands files to its xdist
    workers as they free up (`--dist loadfile --no-loadscope-reorder`), so the long ones start early and the
    many short files even out the end; xdist's own order, most tests first, left a 200 s file for last."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """The golden tests' one switch (an option, not an environment variable a CI job could leave set)."""
    return bool(request.config.getoption("--update-golden"))


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


MODEL_SERVER_IMAGE = "fleetforge-test/model-server:3"
"""busybox with a shell HTTP server (MODEL_SERVER_SH): its default command waits $DELAY seconds (a
model loading), then serves GET /health, GET /v1/models and POST /v1/completions on $PORT (host
network; `COMPLETIONS=fail` makes the completion answer 500): a stand-in for an OpenAI-compatible
model server. busybox httpd could serve the GETs but routes a POST only under /cgi-bin/, hence the
shell server; busybox nc cannot bind one address, so it listens on every interface of the host
network while a test runs (tests only connect to 127.0.0.1). Change the tag when the image changes
(an existing tag is reused)."""

MODEL_SERVER_SH = r"""#!/bin/sh
# One HTTP request on stdin/stdout (`nc -ll -e` runs this per connection); a line per request on stderr.
read -r method path _
len=0
while read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in [Cc]ontent-[Ll]ength:*) len=$(( ${line#*:} )) ;; esac
done
body=$(head -c "$len")
reply() {
  printf 'HTTP/1.0 %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' "$1" "${#2}" "$2"
  echo "$method $path -> $1" >&2
}
case "$method $path" in
  "GET /health") reply "200 OK" '{"status":"ok"}' ;;
  "GET /v1/models") reply "200 OK" "{\"object\":\"list\",\"data\":[{\"id\":\"${MODEL_NAME:-fleetforge-test}\"}]}" ;;
  "POST /v1/completions")
    case "$COMPLETIONS:$body" in
      fail:*) reply "500 Internal Server Error" '{"error":{"message":"the engine failed to generate"}}' ;;
      *'"max_tokens"'*) reply "200 OK" '{"object":"text_completion","choices":[{"index":0,"text":"!","finish_reason":"length"}]}' ;;
      *) reply "400 Bad Request" '{"error":{"message":"max_tokens is required"}}' ;;
    esac ;;
  *) reply "404 Not Found" '{"error":{"message":"not found"}}' ;;
esac
"""


@pytest.fixture(scope="session")
def docker_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The model-server test image, built locally from the host's busybox (docker import; nothing
    is pulled). Fails, never skips, without a running engine: CI starts one (scripts/engines.sh)."""
    import shutil
    import subprocess

    if shutil.which("docker") is None:
        pytest.fail("the docker tests need the docker CLI and a running engine: run scripts/engines.sh as root")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        pytest.fail(f"the docker tests need a running docker engine (scripts/engines.sh starts one): "
                    f"{(info.stderr.strip().splitlines() or ['docker info failed'])[-1]}")
    if subprocess.run(["docker", "image", "inspect", MODEL_SERVER_IMAGE], capture_output=True).returncode == 0:
        return MODEL_SERVER_IMAGE
    return import_model_server_image(tmp_path_factory.mktemp("rootfs"))


def import_model_server_image(root: Path, docker: tuple[str, ...] = ("docker",)) -> str:
    """`docker import` of MODEL_SERVER_IMAGE from the host's busybox into an empty folder `root` (nothing is
    pulled); `docker` is the CLI's argv, e.g. ("docker", "-H", host) for a test's own daemon."""
    import shutil
    import subprocess

    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        pytest.fail("the docker tests need busybox-static (/bin/busybox) to build their image: apt-get install busybox-static")
    (root / "bin").mkdir()
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in ("sh", "nc", "tr", "head", "sleep", "cat", "echo", "false", "true"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "srv").mkdir()
    (root / "srv" / "serve.sh").write_text(MODEL_SERVER_SH)
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(
        [*docker, "import", "--change",
         'CMD ["/bin/sh", "-c", "sleep ${DELAY:-0}; exec nc -ll -p ${PORT:-8000} -e /bin/sh /srv/serve.sh"]',
         "-", MODEL_SERVER_IMAGE], stdin=tar.stdout, capture_output=True, text=True, timeout=120)
    tar.wait(timeout=60)
    if imported.returncode != 0:
        pytest.fail(f"docker import of the test image failed: {imported.stderr.strip()}")
    return MODEL_SERVER_IMAGE


def fleet_containers(fleet_id: str) -> list[str]:
    """Containers (running or not) that fleetforge labelled for this fleet."""
    import subprocess

    r = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=fleetforge.run={fleet_id}"],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.split()
