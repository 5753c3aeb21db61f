"""Client and worker on different machines (issue 28): the worker runs in its own mount namespace
(bubblewrap) where the client's folder does not exist, sharing only Temporal and an S3 store (moto's
server). Every job kind started through the SDK with local inputs ends with its real verdict, because
the SDK ships what the user points at; a worker with a filesystem store of its own fails at once
with STORE_NOT_SHARED."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from client.sdk import FleetforgeClient
from contracts.common import JobStatus
from contracts.errors import Err
from contracts.models import ModelRef
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.conftest import make_bucket
from tests.helpers import SELF_TESTS
from tests.reliability.worker_process import WorkerProcess

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def isolated(client_dir: Path, worker_dir: Path) -> list[str]:
    """bwrap argv: the whole filesystem read-only, the client's folder an empty tmpfs, the worker's
    own state folder writable; same network (Temporal and S3 on 127.0.0.1)."""
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", str(client_dir),
            "--bind", str(worker_dir), str(worker_dir), "--die-with-parent"]


def worker_env(worker_dir: Path, store_url: str, endpoint: str | None) -> dict[str, str]:
    (worker_dir / "home").mkdir(parents=True, exist_ok=True)
    (worker_dir / "tmp").mkdir(parents=True, exist_ok=True)
    env = {"FLEETFORGE_STORE_URL": store_url, "HOME": str(worker_dir / "home"), "TMPDIR": str(worker_dir / "tmp")}
    return env | ({"FLEETFORGE_S3_ENDPOINT": endpoint} if endpoint else {})


def calibration_npz(model: Path, path: Path, samples: int = 4) -> Path:
    import numpy as np
    import onnx

    graph = onnx.load(str(model)).graph
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    rng = np.random.default_rng(0)
    np.savez(path, **{name: rng.standard_normal((samples, *shape)).astype(np.float32) for name, shape in shapes.items()})
    return path


def torch_exported(path: Path) -> Path:
    """A model torch.onnx.export writes with its weights in `<name>.data` (external data)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    torch.onnx.export(net.eval(), (torch.randn(1, 3, 8, 8),), str(path), external_data=True, dynamo=True)
    assert (path.parent / (path.name + ".data")).is_file()
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    client_dir, worker_dir = tmp_path / "client", tmp_path / "worker"
    client_dir.mkdir()
    worker_dir.mkdir()
    return client_dir, worker_dir


async def test_every_job_kind_with_local_inputs_ends_with_its_verdict_on_a_worker_that_cannot_see_them(
    temporal_env, s3_endpoint: str, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
):
    client_dir, worker_dir = dirs
    store_url = f"s3://{make_bucket(s3_endpoint)}/ff"
    prefix = f"iso-{uuid.uuid4().hex[:8]}"
    model = build_tiny_cnn(client_dir / "tiny.onnx")
    calibration_npz(model, client_dir / "calib.npz")
    exported = torch_exported(client_dir / "exported" / "net.onnx")
    shutil.copy(EXAMPLES / "kernels" / "relu.py", client_dir / "relu.py")
    (client_dir / "models.csv").write_text('model_name,status,note,command\nok,,,"python -c ""print(1)"""\n'
                                           'broken,,,"python -c ""import sys; sys.exit(3)"""\n')
    monkeypatch.chdir(client_dir)  # relative paths, as a user types them
    settings = Settings(state_dir=client_dir / "state", queue_prefix=prefix, store_url=store_url, s3_endpoint=s3_endpoint)
    fc = FleetforgeClient(temporal_env.client, settings)

    async with WorkerProcess(temporal_env.client, worker_dir, prefix=prefix, wrap=isolated(client_dir, worker_dir),
                             env=worker_env(worker_dir, store_url, s3_endpoint)):
        convert = await fc.start_convert("tiny.onnx", soc="sm8550", precision="int8", calibration="calib.npz",
                                         output="onnx_qdq")
        inspect = await fc.start_inspect("exported/net.onnx")
        kernel = await fc.start_kernel("relu.py")
        fleet = await fc.start_fleet_test(Path("models.csv"), **SELF_TESTS, concurrency=1)

        converted = await convert.outcome()
        assert converted.status is JobStatus.COMPLETED, converted.failure
        assert converted.evaluation is not None and converted.evaluation.calibration == "data"
        assert converted.evaluation.inputs == "held_out"  # graded on the uploaded calibration file's held-out part
        assert converted.model is not None and converted.model.source == str(model)

        inspected = await inspect.outcome()
        assert inspected.status is JobStatus.COMPLETED, inspected.failure
        assert inspected.model is not None and inspected.model.source == str(exported)

        verified = await kernel.outcome()
        assert verified.status is JobStatus.COMPLETED and verified.report is not None and verified.report.passed, \
            verified.failure

        tested = await fleet.outcome()
        assert (tested.total, tested.passed, tested.failed + tested.errors) == (2, 1, 1)
        written = await fc.write_back(fleet.id, Path("models.csv"))
        assert written.written and "Yes" in (client_dir / "models.csv").read_text()


@pytest.mark.skipif("sidecars" not in ModelRef.model_fields,
                    reason="the converter carries external data into its workspace with the convert-inputs branch")
async def test_a_torch_exported_model_with_its_sidecar_converts_on_a_worker_that_cannot_see_it(
    temporal_env, s3_endpoint: str, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
):
    client_dir, worker_dir = dirs
    store_url = f"s3://{make_bucket(s3_endpoint)}/ff"
    prefix = f"iso-{uuid.uuid4().hex[:8]}"
    torch_exported(client_dir / "exported" / "net.onnx")
    monkeypatch.chdir(client_dir / "exported")
    settings = Settings(state_dir=client_dir / "state", queue_prefix=prefix, store_url=store_url, s3_endpoint=s3_endpoint)
    fc = FleetforgeClient(temporal_env.client, settings)

    async with WorkerProcess(temporal_env.client, worker_dir, prefix=prefix, wrap=isolated(client_dir, worker_dir),
                             env=worker_env(worker_dir, store_url, s3_endpoint)):
        handle = await fc.start_convert("net.onnx", soc="sm8550", precision="fp16", output="ort")
        result = await handle.outcome()

    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.evaluation is not None and result.evaluation.cosine > 0.99
    assert result.model is not None and result.model.source == str(client_dir / "exported" / "net.onnx")
    assert [s.name for s in result.model.sidecars] == ["net.onnx.data"], "the upload:// model's sidecar reached the workspace"


async def test_a_worker_with_its_own_file_store_fails_the_job_at_once_saying_to_share_one(
    temporal_env, dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
):
    client_dir, worker_dir = dirs
    prefix = f"iso-{uuid.uuid4().hex[:8]}"
    build_tiny_cnn(client_dir / "tiny.onnx")
    monkeypatch.chdir(client_dir)
    settings = Settings(state_dir=client_dir / "state", queue_prefix=prefix)  # file:// store under the client's folder
    fc = FleetforgeClient(temporal_env.client, settings)

    async with WorkerProcess(temporal_env.client, worker_dir, prefix=prefix, wrap=isolated(client_dir, worker_dir),
                             env=worker_env(worker_dir, (worker_dir / "artifacts").as_uri(), None)):
        handle = await fc.start_inspect("tiny.onnx")
        result = await handle.outcome()

    assert result.status is JobStatus.FAILED and result.failure is not None
    assert result.failure.code == Err.STORE_NOT_SHARED, result.failure
    assert "FLEETFORGE_STORE_URL=s3://" in result.failure.message
