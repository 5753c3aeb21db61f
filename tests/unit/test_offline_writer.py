"""The offline command writer: per-runtime templates and rule-based repairs; output passes the policy."""

from __future__ import annotations

import shlex

import pytest

from activities.containers.offline_writer import initial_knobs, repair, write_command, writer_policy
from activities.containers.policy import parse_docker_run
from activities.containers.taxonomy import classify
from contracts.errors import Err, FleetforgeError
from contracts.fleet import Classification, CommandPolicy, ErrorCategory, HardwareProfile, ModelRow, Remedy, TestPhase

HW = HardwareProfile(name="dgx-a100", gpu_count=8, gpu_memory_gb=80, model_cache_dir="/models/hf-cache")
LLAMA = ModelRow(model_name="meta-llama/Llama-3.1-8B-Instruct", runtime="vllm")
KV_LOG = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
          "stored in KV cache (20464). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`.")


def fail(category: ErrorCategory, **facts: str) -> Classification:
    return Classification(category=category, remedy=Remedy.NEW_COMMAND, reason="x", facts=facts)


def arg(command: str, flag: str) -> str | None:
    argv = shlex.split(command)
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("row", [
    LLAMA,
    ModelRow(model_name="mistralai/Mixtral-8x7B-Instruct-v0.1", runtime="vllm", gpus=4, max_model_len=16384, port=8100),
    ModelRow(model_name="bigscience/bloom-560m", runtime="tgi", gpus=2, max_model_len=2048),
    ModelRow(model_name="org/custom", runtime="http", image="acme/llm-server:1.2", port=9000),
    ModelRow(model_name="Qwen/Qwen2-72B", runtime="vllm", gpus=8),
])
def test_every_template_passes_the_policy(row: ModelRow) -> None:
    command = write_command(row, HW)
    assert command is not None and command.startswith("docker run ")
    spec = parse_docker_run(command, writer_policy(HW))
    assert spec.network == "host"
    assert row.model_name in command
    assert write_command(row, HW) == command  # deterministic
    # also under the default policy roots used by the fleet (the cache lives under /models)
    parse_docker_run(command, CommandPolicy())


def test_vllm_template_contents() -> None:
    command = write_command(ModelRow(model_name="m/a", runtime="vllm", gpus=2, port=8123), HW)
    assert command is not None
    spec = parse_docker_run(command, writer_policy(HW))
    assert spec.image == "vllm/vllm-openai:latest"
    assert spec.gpus == '"device=0,1"' and spec.ipc == "host"
    assert arg(command, "--port") == "8123" and arg(command, "--host") == "127.0.0.1"
    assert arg(command, "--tensor-parallel-size") == "2"
    assert spec.env_passthrough == ["HF_TOKEN"]


def test_tgi_template_contents() -> None:
    command = write_command(ModelRow(model_name="m/b", runtime="tgi", gpus=8, max_model_len=4096), HW)
    assert command is not None
    assert arg(command, "--model-id") == "m/b" and arg(command, "--num-shard") == "8"
    assert arg(command, "--max-total-tokens") == "4096" and arg(command, "--gpus") == "all"


def test_oom_with_kv_cache_facts_sets_max_model_len_below_the_kv_capacity() -> None:
    c = classify(1, KV_LOG, TestPhase.START)
    command = write_command(LLAMA, HW, [c])
    assert command is not None and int(arg(command, "--max-model-len") or 0) == 20224


def test_oom_scales_out_then_lowers_memory_knobs() -> None:
    hw2 = HardwareProfile(gpu_count=2, model_cache_dir="/models/hf-cache")
    oom = fail(ErrorCategory.CUDA_OOM)
    first = write_command(LLAMA, hw2, [oom])
    assert first is not None and arg(first, "--tensor-parallel-size") == "2"
    second = write_command(LLAMA, hw2, [oom, oom])
    assert second is not None
    assert float(arg(second, "--gpu-memory-utilization") or 1) < 0.9
    assert int(arg(second, "--max-model-len") or 0) == 8192
    third = write_command(LLAMA, hw2, [oom, oom, oom])
    assert third is not None and int(arg(third, "--max-model-len") or 0) == 4096
    # eventually nothing more to lower: the row needs a person
    assert write_command(LLAMA, hw2, [oom] * 30) is None


def test_trust_remote_code_is_added_once() -> None:
    trc = fail(ErrorCategory.TRUST_REMOTE_CODE)
    command = write_command(LLAMA, HW, [trc])
    assert command is not None and "--trust-remote-code" in shlex.split(command)
    assert write_command(LLAMA, HW, [trc, trc]) is None


def test_port_in_use_moves_to_the_next_port() -> None:
    command = write_command(LLAMA, HW, [fail(ErrorCategory.PORT_IN_USE, port="8000")])
    assert command is not None and arg(command, "--port") == "8001"
    again = write_command(LLAMA, HW, [fail(ErrorCategory.PORT_IN_USE), fail(ErrorCategory.PORT_IN_USE)])
    assert again is not None and arg(again, "--port") == "8002"


def test_image_not_found_falls_back_to_the_runtime_default() -> None:
    row = ModelRow(model_name="m/c", runtime="vllm", image="vllm/vllm-openai:v9.9.9")
    command = write_command(row, HW, [fail(ErrorCategory.IMAGE_NOT_FOUND)])
    assert command is not None and "vllm/vllm-openai:latest" in command
    assert write_command(LLAMA, HW, [fail(ErrorCategory.IMAGE_NOT_FOUND)]) is None


@pytest.mark.parametrize("category", [ErrorCategory.AUTH, ErrorCategory.UNSUPPORTED_ARCH, ErrorCategory.UNKNOWN])
def test_no_rule_means_no_command(category: ErrorCategory) -> None:
    assert write_command(LLAMA, HW, [fail(category)]) is None


def test_crash_enables_eager_mode_once() -> None:
    c = fail(ErrorCategory.CRASHED)
    command = write_command(LLAMA, HW, [c])
    assert command is not None and "--enforce-eager" in command
    assert write_command(LLAMA, HW, [c, c]) is None


def test_transient_failure_keeps_the_command() -> None:
    assert write_command(LLAMA, HW, [fail(ErrorCategory.TRANSIENT)]) == write_command(LLAMA, HW)
    knobs = initial_knobs(LLAMA, HW)
    assert repair(LLAMA, HW, knobs, fail(ErrorCategory.TRANSIENT)) == knobs


@pytest.mark.parametrize("row", [
    ModelRow(model_name="x; rm -rf /", runtime="vllm"),
    ModelRow(model_name="../etc", runtime="vllm"),
    ModelRow(model_name="org/m", runtime="http"),  # generic runtime without an image
])
def test_bad_rows_are_bad_input(row: ModelRow) -> None:
    with pytest.raises(FleetforgeError) as info:
        write_command(row, HW)
    assert info.value.code == Err.BAD_INPUT


def test_cpu_host_gets_no_gpu_flags() -> None:
    cpu = HardwareProfile(gpu_count=0, model_cache_dir="/models/hf-cache")
    command = write_command(LLAMA, cpu)
    assert command is not None and "--gpus" not in command
