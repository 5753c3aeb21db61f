"""Models as users save them, through the real workflow and the real toolchain: a TorchScript `.pt`
(with --input-shape), an ExportedProgram `.pt2`, torch's default ONNX export (`m.onnx` + `m.onnx.data`)
convert for SM8550 and are evaluated against their source; a state dict `.pth` is refused."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

from activities.storage import FileStore
from activities.workspace import Workspace
from contracts.common import JobKind, JobStatus
from contracts.convert import Precision
from contracts.convert_job import ConversionRequest, ConversionResult, InputShape
from contracts.settings import Settings
from tests.helpers import fresh_queues, new_worker, outcome_of
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.converter import ConverterWorkflow

pytest.importorskip("onnxruntime_qnn")
torch = pytest.importorskip("torch")

X = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32))


def net() -> "torch.nn.Module":
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, padding=1),
                               torch.nn.GELU()).eval()


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    hub = tmp_path / "hub"
    hub.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.trace(net(), X), str(hub / "ts.pt"))
        torch.export.save(torch.export.export(net(), (X,)), str(hub / "ep.pt2"))
        torch.onnx.export(net(), (X,), str(hub / "m.onnx"), input_names=["x"])
    torch.save(net().state_dict(), str(hub / "weights.pth"))
    assert (hub / "m.onnx.data").is_file(), "torch's default export keeps the weights beside the graph"
    return {p.name: p for p in hub.iterdir()}


async def convert(client, queues, model: Path, **kw) -> ConversionResult:
    kw = {"precision": Precision.FP16, **kw}
    req = ConversionRequest(model=str(model), queues=queues, run_id=uuid.uuid4().hex[:8], target_soc="sm8550",
                            preset="fast", **kw)
    handle = await client.start_workflow(ConverterWorkflow.run, req, id=f"convert/{req.run_id}", task_queue=queues.workflows,
                                         search_attributes=start_attributes(JobKind.CONVERT, req.model, "SM8550"))
    return await outcome_of(handle, ConversionResult)


async def test_torchscript_exported_program_and_external_data_onnx_convert_and_are_judged_against_their_source(
        temporal_env, tmp_path: Path, models: dict[str, Path]):
    settings, store = Settings(state_dir=tmp_path / "state"), FileStore(tmp_path / "artifacts")
    queues = fresh_queues()
    reg = build_registry(settings, store)
    async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                          task_queue=queues.workflows):
        ts = await convert(temporal_env.client, queues, models["ts.pt"],
                           input_shapes={"input": InputShape(dims=[1, 3, 8, 8])})
        ep = await convert(temporal_env.client, queues, models["ep.pt2"])
        ext = await convert(temporal_env.client, queues, models["m.onnx"])
        pth = await convert(temporal_env.client, queues, models["weights.pth"])

    for name, r in (("ts.pt", ts), ("ep.pt2", ep), ("m.onnx", ext)):
        assert r.status is JobStatus.COMPLETED, (name, r.failure)
        assert r.evaluation is not None and r.evaluation.cosine > 0.99 and r.offload is not None and r.offload.full, name
    for r, filename in ((ts, "ts.pt"), (ep, "ep.pt2")):
        assert r.evaluation.reference == f"converted/{Path(filename).stem}.onnx"
        ws = Workspace(store, settings.cache_dir, r.workspace)
        ws.materialize()
        exported = ws.path("logs/export.exec_result.json").read_text()
        assert "torch.onnx.export" in exported and '"opset"' in exported, "exporter and opset recorded with the artifact"
        plan = ws.path("plan.json").read_text()
        assert f'"source_model": "input/{filename}"' in plan, "the evaluation's reference is the torch module"
    index = Workspace(store, settings.cache_dir, ext.workspace).index()
    assert "input/m.onnx.data" in index and ext.model is not None and [s.name for s in ext.model.sidecars] == ["m.onnx.data"]
    assert pth.status is JobStatus.FAILED and pth.failure.code == "MODEL_INVALID"
    assert "torch.jit.save" in pth.failure.message and "torch.export.save" in pth.failure.message


async def test_an_exported_program_quantizes_on_the_users_calibration_data_checked_against_its_export(
        temporal_env, tmp_path: Path, models: dict[str, Path]):
    """int8 of a `.pt2` with --calibration: the data is copied in before the plan exports the ONNX (no
    graph to check it against then), the quantizer reads it against the export; data of another shape
    fails as CALIBRATION_INVALID naming the exported input, not as an internal error."""
    from contracts.convert import OutputKind

    rng = np.random.default_rng(3)
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    np.savez(good, input=rng.standard_normal((16, 1, 3, 8, 8)).astype(np.float32))
    np.savez(bad, input=rng.standard_normal((16, 1, 3, 4, 4)).astype(np.float32))
    settings, store = Settings(state_dir=tmp_path / "state"), FileStore(tmp_path / "artifacts")
    queues = fresh_queues()
    reg = build_registry(settings, store)
    async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], activities=reg.by_kind["toolchain"],
                          task_queue=queues.workflows):
        ok = await convert(temporal_env.client, queues, models["ep.pt2"], calibration=str(good),
                           precision=Precision.INT8, output=OutputKind.ONNX_QDQ, eval_samples=4)
        wrong = await convert(temporal_env.client, queues, models["ep.pt2"], calibration=str(bad),
                              precision=Precision.INT8, output=OutputKind.ONNX_QDQ, eval_samples=4)
    assert ok.status is JobStatus.COMPLETED, ok.failure
    assert ok.evaluation is not None and ok.evaluation.reference == "converted/ep.onnx" and ok.evaluation.samples == 4
    assert wrong.status is JobStatus.FAILED and wrong.failure.code == "CALIBRATION_INVALID", wrong.failure
    assert "[1, 3, 8, 8]" in wrong.failure.message, wrong.failure.message
