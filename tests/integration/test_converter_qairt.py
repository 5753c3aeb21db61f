"""The qairt toolchain against a fake SDK folder (tests/doubles/fake_qairt_sdk.py): SDK version
detection, version-specific flags, the SDK environment, and a workflow run through toolchain=qairt."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from activities.storage import FileStore
from activities.toolchains.compiler import compile_plan
from activities.toolchains.qairt import detect_sdk
from activities.toolchains.registry import default_registry
from activities.toolchains.steps import run_step
from contracts.common import JobKind, JobStatus
from contracts.convert import ConversionPlan, Toolchain
from contracts.convert_job import ConversionRequest, ConversionResult
from contracts.errors import FleetforgeError
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.doubles.fake_qairt_sdk import build_fake_sdk, calls
from tests.doubles.openai_server import ScriptedOpenAIServer, json_reply
from tests.helpers import fresh_queues, new_worker
from worker import build_registry
from workflows._visibility import start_attributes
from workflows.converter import ConverterWorkflow


def qairt_plan(shape: bool = True) -> dict:
    conv_opt = {"input_shape": "input 1,3,8,8"} if shape else {}
    return {"status": "OK", "intent": {"soc": "SM8550"}, "rationale": "qairt int8", "steps": [
        {"step_id": "convert", "tool_name": "qairt-converter", "required_args": {"model": "input/tiny.onnx",
         "output": "converted/tiny.dlc"}, "optional_args": conv_opt, "expected_outputs": ["converted/tiny.dlc"]},
        {"step_id": "quantize", "tool_name": "qairt-quantizer", "required_args": {"model": "converted/tiny.dlc",
         "output": "converted/tiny_int8.dlc"}, "optional_args": {"act_bitwidth": "8"}, "depends_on": ["convert"]},
        {"step_id": "context_binary", "tool_name": "qnn-context-binary-generator",
         "required_args": {"model": "converted/tiny_int8.dlc", "output_dir": "converted/ctx", "binary_name": "tiny_int8_sm8550"},
         "depends_on": ["quantize"]},
    ]}


@pytest.mark.parametrize("version,flag", [("2.20", "--desired_input_shape"), ("2.31", "--source_model_input_shape")])
def test_sdk_version_picks_the_flags_and_the_environment(tmp_path: Path, version: str, flag: str):
    root = build_fake_sdk(tmp_path / "sdk", version)
    sdk = detect_sdk(root)
    assert sdk.spec_version == version and sdk.version.startswith(version)
    reg = default_registry().for_toolchain_version(Toolchain.QAIRT, sdk.spec_version)
    assert reg.get_tool_spec("qairt-converter").version == version
    assert ("snpe-dlc-quantize" if version == "2.20" else "snpe-dlc-quant") in {s.name for s in reg.list_tools()}
    ws = tmp_path / "ws"
    build_tiny_cnn(ws / "input" / "tiny.onnx")
    compiled = compile_plan(ConversionPlan.model_validate(qairt_plan()), reg, ws)
    assert compiled.ok, compiled.feedback()
    for step in compiled.steps:
        out = run_step(step, ws, root)
        assert out.details["exit_code"] == 0 and out.details["sdk_version"] == sdk.version
    recorded = calls(root)
    assert [c["tool"] for c in recorded] == ["qairt-converter", "qairt-quantizer", "qnn-context-binary-generator"]
    assert recorded[0]["argv"] == ["--input_network", "input/tiny.onnx", "--output_path", "converted/tiny.dlc",
                                   flag, "input 1,3,8,8"]
    env = recorded[0]["env"]
    assert env["PATH"].split(":")[0] == str(root / "bin" / "x86_64-linux-clang")
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(root / "lib" / "x86_64-linux-clang")
    assert env["PYTHONPATH"].split(":")[0] == str(root / "lib" / "python") and env["QAIRT_SDK_ROOT"] == str(root)
    assert recorded[0]["cwd"] == str(ws)
    assert (ws / "converted" / "ctx" / "tiny_int8_sm8550.bin").stat().st_size > 0


def test_wrong_version_flags_fail_with_the_tools_stderr(tmp_path: Path):
    old = build_fake_sdk(tmp_path / "sdk", "2.20")
    ws = tmp_path / "ws"
    build_tiny_cnn(ws / "input" / "tiny.onnx")
    new_reg = default_registry().for_toolchain_version(Toolchain.QAIRT, "2.31")  # flags of a newer SDK
    step = compile_plan(ConversionPlan.model_validate(qairt_plan()), new_reg, ws).steps[0]
    with pytest.raises(FleetforgeError) as e:
        run_step(step, ws, old)
    assert e.value.code == "EXECUTOR_ERROR" and "unrecognized arguments: --source_model_input_shape" in e.value.message


def test_missing_or_unversioned_sdk_is_toolchain_unavailable(tmp_path: Path):
    for root in (None, tmp_path / "nowhere"):
        with pytest.raises(FleetforgeError) as e:
            detect_sdk(root)
        assert e.value.code == "TOOLCHAIN_UNAVAILABLE" and "QAIRT_SDK_ROOT" in e.value.message
    root = build_fake_sdk(tmp_path / "sdk", "2.31", with_yaml=False)
    assert detect_sdk(root).version == "2.31.0.250130"  # from the folder name


async def test_workflow_converts_through_the_qairt_toolchain(temporal_env, tmp_path: Path):
    root = build_fake_sdk(tmp_path / "sdk", "2.20")
    model = build_tiny_cnn(tmp_path / "hub" / "tiny.onnx")
    store = FileStore(tmp_path / "artifacts")
    with ScriptedOpenAIServer([json_reply(json.dumps(qairt_plan()))]) as server:
        settings = Settings(state_dir=tmp_path / "state", llm="openai", llm_base_url=server.base_url,
                            llm_model="test-model", qairt_sdk_root=root)
        reg = build_registry(settings, store)
        queues = fresh_queues()
        req = ConversionRequest(model=str(model), target_soc="sm8550", precision="int8", toolchain=Toolchain.QAIRT,
                                llm="openai", queues=queues, run_id=uuid.uuid4().hex[:8], synthetic_calibration=True)
        async with new_worker(temporal_env.client, workflows=[ConverterWorkflow], task_queue=queues.workflows,
                              activities=reg.by_kind["toolchain"] + reg.by_kind["llm"]):
            result: ConversionResult = await temporal_env.client.execute_workflow(
                ConverterWorkflow.run, req, id=f"convert-qairt/{uuid.uuid4().hex[:8]}", task_queue=queues.workflows,
                search_attributes=start_attributes(JobKind.CONVERT, req.model, "sm8550"))

    assert result.status is JobStatus.COMPLETED, result.failure
    assert result.executed_steps == ["convert", "quantize", "context_binary"]
    names = {a.name for a in result.artifacts}
    assert {"converted/tiny.dlc", "converted/tiny_int8.dlc", "converted/ctx/tiny_int8_sm8550.bin"} <= names
    assert [c["tool"] for c in calls(root)] == ["qairt-converter", "qairt-quantizer", "qnn-context-binary-generator"]
    assert "--desired_input_shape" in calls(root)[0]["argv"], "SDK 2.20's flag"
