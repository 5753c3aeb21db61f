"""The offline fleet command writer: a deterministic `docker run` templater per runtime (vllm, tgi,
generic http) with rule-based repairs driven by the error taxonomy.

`write_command(row, hw, history, slot)` folds the repairs for every earlier failure of the row over
the initial knobs and renders the command for the row's slot (its port, its GPUs); the result always
passes `check_command` under `writer_policy(hw)` and the slot. `repair` returns None when no rule
applies (the row needs a person). The slot is the fleet's: no repair moves the port or adds GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import BaseModel

from activities.containers.policy import check_command, image_problem, to_command
from contracts.errors import Err, FleetforgeError
from contracts.fleet import (
    Classification, CommandPolicy, DockerRunSpec, ErrorCategory, HardwareProfile, Mount, ModelRow, Slot,
)

DEFAULT_IMAGES = {
    "vllm": "vllm/vllm-openai:latest",
    "tgi": "ghcr.io/huggingface/text-generation-inference:latest",
}
HF_CACHE = "/root/.cache/huggingface"
TGI_DATA = "/data"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_MIN_MODEL_LEN = 1024
_MIN_GPU_UTIL = 0.6


class Knobs(BaseModel, frozen=True):
    """Everything a repair can change; the command is a pure function of (row, hw, knobs)."""

    image: str
    port: int
    devices: tuple[int, ...] = ()
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    trust_remote_code: bool = False
    enforce_eager: bool = False


def row_images(row: ModelRow) -> tuple[str, ...]:
    """The images a command for `row` may run: the one the row names, and its runtime's default (the repair
    after the named image is not found, recorded in the command); any image when the row names none."""
    if not row.image:
        return ()
    default = DEFAULT_IMAGES.get(row.runtime)
    return (row.image, default) if default and default != row.image else (row.image,)


def writer_policy(hw: HardwareProfile, row: ModelRow | None = None) -> CommandPolicy:
    """The policy every written command is checked against: the HF cache is the only mount and, for a row,
    only the row's images run."""
    return CommandPolicy(mount_roots=(hw.model_cache_dir,), images=row_images(row) if row else ())


def initial_knobs(row: ModelRow, hw: HardwareProfile, slot: Slot | None = None) -> Knobs:
    """Raises BAD_INPUT when the offline writer cannot template the row (the LLM writer may still can)."""
    if not _MODEL_NAME.match(row.model_name) or ".." in row.model_name:
        raise FleetforgeError(Err.BAD_INPUT, f"model name {row.model_name!r} is not a repository id")
    image = row.image or DEFAULT_IMAGES.get(row.runtime)
    if not image:
        raise FleetforgeError(Err.BAD_INPUT, f"runtime {row.runtime!r} needs an image (set the row's image)")
    if why := image_problem(image):
        raise FleetforgeError(Err.BAD_INPUT, f"the row's image {why}: correct the manifest's image cell")
    slot = slot or hw.first_slot(row.gpus)
    return Knobs(image=image, port=slot.port, devices=slot.devices, max_model_len=row.max_model_len)


def build_spec(row: ModelRow, hw: HardwareProfile, knobs: Knobs) -> DockerRunSpec:
    mounts: list[Mount]
    env: dict[str, str] = {}
    if row.runtime == "vllm":
        mounts = [Mount(host=hw.model_cache_dir, container=HF_CACHE)]
        env["HF_HOME"] = HF_CACHE
        args = ["--model", row.model_name, "--host", "127.0.0.1", "--port", str(knobs.port),
                "--gpu-memory-utilization", f"{knobs.gpu_memory_utilization:.2f}"]
        if len(knobs.devices) > 1:
            args += ["--tensor-parallel-size", str(len(knobs.devices))]
        if knobs.max_model_len:
            args += ["--max-model-len", str(knobs.max_model_len)]
        if knobs.trust_remote_code:
            args.append("--trust-remote-code")
        if knobs.enforce_eager:
            args.append("--enforce-eager")
    elif row.runtime == "tgi":
        mounts = [Mount(host=hw.model_cache_dir, container=TGI_DATA)]
        args = ["--model-id", row.model_name, "--hostname", "127.0.0.1", "--port", str(knobs.port),
                "--cuda-memory-fraction", f"{knobs.gpu_memory_utilization:.2f}"]
        if len(knobs.devices) > 1:
            args += ["--num-shard", str(len(knobs.devices))]
        if knobs.max_model_len:
            args += ["--max-total-tokens", str(knobs.max_model_len),
                     "--max-input-tokens", str(max(1, knobs.max_model_len - 1))]
        if knobs.trust_remote_code:
            args.append("--trust-remote-code")
    else:  # generic http server image: configured through the environment
        mounts = [Mount(host=hw.model_cache_dir, container=HF_CACHE, read_only=True)]
        env.update({"MODEL_NAME": row.model_name, "PORT": str(knobs.port), "HOST": "127.0.0.1",
                    "HF_HOME": HF_CACHE})
        if knobs.max_model_len:
            env["MAX_MODEL_LEN"] = str(knobs.max_model_len)
        if knobs.trust_remote_code:
            env["TRUST_REMOTE_CODE"] = "1"
        args = []
    return DockerRunSpec(
        image=knobs.image, network="host", gpus=Slot(port=knobs.port, devices=knobs.devices).gpus_flag,
        ipc="host" if row.runtime != "http" else None, shm_size="16g" if row.runtime != "http" else None,
        env=env, env_passthrough=["HF_TOKEN"], volumes=mounts, args=args,
    )


def _round_down(n: int, step: int = 256) -> int:
    return max(_MIN_MODEL_LEN, (n // step) * step)


def repair(row: ModelRow, hw: HardwareProfile, knobs: Knobs, failure: Classification) -> Knobs | None:
    """The next knobs after `failure`, or None when no rule-based repair applies."""
    cat = failure.category
    if cat is ErrorCategory.CUDA_OOM:
        kv = failure.facts.get("kv_tokens")
        if kv and kv.isdigit():
            target = _round_down(int(kv))
            if knobs.max_model_len is None or target < knobs.max_model_len:
                return knobs.model_copy(update={"max_model_len": target})
        current = knobs.max_model_len or int(failure.facts.get("max_seq_len", "0") or 0) or 16384
        new_len = _round_down(current // 2)
        new_util = round(max(_MIN_GPU_UTIL, knobs.gpu_memory_utilization - 0.05), 2)
        if new_len == knobs.max_model_len and new_util == knobs.gpu_memory_utilization:
            return None
        return knobs.model_copy(update={"max_model_len": new_len, "gpu_memory_utilization": new_util})
    if cat is ErrorCategory.TRUST_REMOTE_CODE:
        return None if knobs.trust_remote_code else knobs.model_copy(update={"trust_remote_code": True})
    if cat is ErrorCategory.IMAGE_NOT_FOUND:
        default = DEFAULT_IMAGES.get(row.runtime)
        return knobs.model_copy(update={"image": default}) if default and default != knobs.image else None
    if cat in (ErrorCategory.CRASHED, ErrorCategory.NOT_HEALTHY):
        if row.runtime == "vllm" and not knobs.enforce_eager:
            return knobs.model_copy(update={"enforce_eager": True})
        return None
    if cat in (ErrorCategory.TRANSIENT, ErrorCategory.DOCKER_UNREACHABLE):  # the same command, once the engine is back
        return knobs
    return None


def write_command(row: ModelRow, hw: HardwareProfile, history: Sequence[Classification] = (),
                  slot: Slot | None = None) -> str | None:
    """The command for the next attempt of `row` on `slot` (default: the host's first slot) after the
    failures in `history` (oldest first); None when a failure has no rule-based repair. The command
    always passes the writer policy and the slot check."""
    slot = slot or hw.first_slot(row.gpus)
    knobs = initial_knobs(row, hw, slot)
    for failure in history:
        if failure.category in (ErrorCategory.POLICY_REJECTED, ErrorCategory.NO_COMMAND):
            continue  # an LLM answer refused before it ran: the offline writer's own knobs never got there
        nxt = repair(row, hw, knobs, failure)
        if nxt is None:
            return None
        knobs = nxt
    command = to_command(build_spec(row, hw, knobs))
    verdict = check_command(command, writer_policy(hw, row), slot, hw.gpu_count)
    if not verdict.accepted:  # never hand out a command our own policy refuses
        raise FleetforgeError(Err.INTERNAL, f"the offline writer's command for {row.model_name} fails its policy: {verdict.reason}")
    return command
