"""The offline command writer: per-runtime templates for the row's slot and rule-based repairs; output
passes the policy and the slot check."""

from __future__ import annotations

import shlex

import pytest

from activities.containers.offline_writer import initial_knobs, repair, write_command, writer_policy
from activities.containers.policy import check_command, parse_docker_run
from activities.containers.taxonomy import classify
from contracts.errors import Err, FleetforgeError
from contracts.fleet import (
    Classification, CommandPolicy, ErrorCategory, HardwareProfile, ModelRow, Remedy, Slot, TestPhase,
)

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


def test_vllm_template_uses_the_slots_port_and_gpus_not_the_rows_port() -> None:
    slot = Slot(port=8123, devices=(4, 5))
    command = write_command(ModelRow(model_name="m/a", runtime="vllm", gpus=2, port=9999), HW, slot=slot)
    assert command is not None
    spec = parse_docker_run(command, writer_policy(HW))
    assert spec.image == "vllm/vllm-openai:latest"
    assert spec.gpus == '"device=4,5"' and spec.ipc == "host"
    assert arg(command, "--port") == "8123" and arg(command, "--host") == "127.0.0.1"
    assert arg(command, "--tensor-parallel-size") == "2"
    assert spec.env_passthrough == ["HF_TOKEN"]
    assert check_command(command, writer_policy(HW), slot, HW.gpu_count).accepted


def test_without_a_slot_a_row_gets_the_hosts_first_port_and_gpus() -> None:
    command = write_command(ModelRow(model_name="m/b", runtime="tgi", gpus=8, max_model_len=4096), HW)
    assert command is not None
    assert arg(command, "--model-id") == "m/b" and arg(command, "--num-shard") == "8"
    assert arg(command, "--max-total-tokens") == "4096" and arg(command, "--gpus") == '"device=0,1,2,3,4,5,6,7"'
    assert arg(command, "--port") == str(HW.port_range[0])


def test_http_runtime_names_its_model_and_port_in_the_environment() -> None:
    row = ModelRow(model_name="org/custom", runtime="http", image="acme/llm-server:1.2")
    command = write_command(row, HardwareProfile(gpu_count=0), slot=Slot(port=8042))
    spec = parse_docker_run(command or "", CommandPolicy())
    assert (spec.env["PORT"], spec.env["MODEL_NAME"], spec.gpus) == ("8042", "org/custom", None)


def test_oom_with_kv_cache_facts_sets_max_model_len_below_the_kv_capacity() -> None:
    c = classify(1, KV_LOG, TestPhase.START)
    command = write_command(LLAMA, HW, [c])
    assert command is not None and int(arg(command, "--max-model-len") or 0) == 20224


def test_oom_lowers_memory_knobs_within_the_rows_gpus() -> None:
    hw2 = HardwareProfile(gpu_count=2, model_cache_dir="/models/hf-cache")
    oom = fail(ErrorCategory.CUDA_OOM)
    first = write_command(LLAMA, hw2, [oom])
    assert first is not None and arg(first, "--tensor-parallel-size") is None, "the slot's GPUs are the row's: no scale-out"
    assert float(arg(first, "--gpu-memory-utilization") or 1) < 0.9
    assert int(arg(first, "--max-model-len") or 0) == 8192
    second = write_command(LLAMA, hw2, [oom, oom])
    assert second is not None and int(arg(second, "--max-model-len") or 0) == 4096
    # eventually nothing more to lower: the row needs a person
    assert write_command(LLAMA, hw2, [oom] * 30) is None


def test_trust_remote_code_is_added_once() -> None:
    trc = fail(ErrorCategory.TRUST_REMOTE_CODE)
    command = write_command(LLAMA, HW, [trc])
    assert command is not None and "--trust-remote-code" in shlex.split(command)
    assert write_command(LLAMA, HW, [trc, trc]) is None


def test_port_in_use_has_no_repair_the_port_is_the_fleets() -> None:
    assert write_command(LLAMA, HW, [fail(ErrorCategory.PORT_IN_USE, port="8000")]) is None


def test_refused_llm_commands_do_not_change_the_offline_writers_command() -> None:
    refused = fail(ErrorCategory.POLICY_REJECTED)
    first = write_command(LLAMA, HW)
    assert first is not None and write_command(LLAMA, HW, [refused, refused]) == first


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
    first = write_command(LLAMA, HW)
    assert first is not None and write_command(LLAMA, HW, [fail(ErrorCategory.TRANSIENT)]) == first
    knobs = initial_knobs(LLAMA, HW)
    assert repair(LLAMA, HW, knobs, fail(ErrorCategory.TRANSIENT)) == knobs


@pytest.mark.parametrize("row", [
    ModelRow(model_name="x; rm -rf /", runtime="vllm"),
    ModelRow(model_name="../etc", runtime="vllm"),
    ModelRow(model_name="org/m", runtime="http"),  # generic runtime without an image
    ModelRow(model_name="org/m", runtime="http", image="MyServer:1"),  # docker refuses it: the row's fault, not ours
])
def test_bad_rows_are_bad_input(row: ModelRow) -> None:
    with pytest.raises(FleetforgeError) as info:
        write_command(row, HW)
    assert info.value.code == Err.BAD_INPUT
    if row.image:
        assert info.value.message.startswith("the row's image 'MyServer:1' is not a valid image reference")


def test_cpu_host_gets_no_gpu_flags() -> None:
    cpu = HardwareProfile(gpu_count=0, model_cache_dir="/models/hf-cache")
    command = write_command(LLAMA, cpu)
    assert command is not None and "--gpus" not in command


def test_the_offline_writers_commands_pass_their_rows_image_policy() -> None:
    """The image rule binds the offline writer too: its first command and its image-not-found repair both run
    an image the row allows."""
    row = ModelRow(model_name="m/c", runtime="vllm", image="vllm/vllm-openai:v9.9.9")
    for history in ([], [fail(ErrorCategory.IMAGE_NOT_FOUND)]):
        command = write_command(row, HW, history)
        assert command is not None and check_command(command, writer_policy(HW, row)).accepted
    assert not check_command(command.replace(":latest", ":v1.0.0"), writer_policy(HW, row)).accepted
