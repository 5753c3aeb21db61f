"""Fleet test vocabulary: a parsed `docker run` (DockerRunSpec), the policy it is checked against,
the error taxonomy (ErrorCategory, Remedy, Classification) and the inputs of the command writer.

Pure data; imports nothing else of ours except contracts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field


class Mount(BaseModel, frozen=True):
    """A bind mount `-v host:container[:ro]`. The host path is normalised and inside a mount root."""

    host: str
    container: str
    read_only: bool = False


class PortMap(BaseModel, frozen=True):
    """`-p [127.0.0.1:]host:container`. Only loopback binding is allowed (no private-range addresses)."""

    host: int = Field(ge=1, le=65535)
    container: int = Field(ge=1, le=65535)
    host_ip: str | None = None


Network = Literal["host", "none"]


class CommandPolicy(BaseModel, frozen=True):
    """What a generated `docker run` may ask for. Everything not allowed here is rejected."""

    mount_roots: tuple[str, ...] = ("/models", "/data")
    """Absolute host directories under which bind mounts are allowed (never `/`)."""
    allowed_networks: tuple[Network, ...] = ("host", "none")
    default_network: Network = "host"
    """Network used when the command names none (rendered explicitly, never docker's bridge)."""
    allow_gpus: bool = True
    image_prefixes: tuple[str, ...] = ()
    """When non-empty, the image must start with one of these (e.g. `vllm/`, `ghcr.io/huggingface/`)."""
    passthrough_env: tuple[str, ...] = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
    """`-e NAME` without a value copies NAME from the worker environment: only these names."""


class DockerRunSpec(BaseModel, frozen=True):
    """A validated `docker run`: the only thing the container runner ever executes (as argv)."""

    image: str
    name: str | None = None
    """The name the command asked for; the runner always renders its own deterministic name."""
    env: dict[str, str] = Field(default_factory=dict)
    env_passthrough: list[str] = Field(default_factory=list)
    ports: list[PortMap] = Field(default_factory=list)
    volumes: list[Mount] = Field(default_factory=list)
    network: Network = "host"
    gpus: str | None = None
    shm_size: str | None = None
    ipc: Literal["host"] | None = None
    ulimits: list[str] = Field(default_factory=list)
    workdir: str | None = None
    entrypoint: str | None = None
    runtime: Literal["nvidia"] | None = None
    args: list[str] = Field(default_factory=list)
    """Arguments after the image (the container's command line), passed as argv."""


class PolicyVerdict(BaseModel, frozen=True):
    """Outcome of checking a command: the accepted spec, or the reason it was rejected."""

    accepted: bool
    spec: DockerRunSpec | None = None
    reason: str = ""


class TestPhase(StrEnum):
    """Where in a model test a failure happened (taxonomy input)."""

    __test__ = False  # not a pytest class

    POLICY = "policy"
    START = "start"
    HEALTH = "health"
    PROBE = "probe"


class ErrorCategory(StrEnum):
    CUDA_OOM = "CUDA_OOM"
    """CUDA out of memory, including 'KV cache too small for max seq len'."""
    UNSUPPORTED_ARCH = "UNSUPPORTED_ARCH"
    TRUST_REMOTE_CODE = "TRUST_REMOTE_CODE"
    AUTH = "AUTH"
    """401/403, gated repository."""
    IMAGE_NOT_FOUND = "IMAGE_NOT_FOUND"
    PORT_IN_USE = "PORT_IN_USE"
    NOT_HEALTHY = "NOT_HEALTHY"
    CRASHED = "CRASHED"
    """Exit 125 (docker), 137 (killed), 139 (segfault) or another non-zero exit."""
    PROBE_FAILED = "PROBE_FAILED"
    POLICY_REJECTED = "POLICY_REJECTED"
    TRANSIENT = "TRANSIENT"
    """Infrastructure hiccup (docker daemon unreachable, registry rate limit, timeouts)."""
    UNKNOWN = "UNKNOWN"


class Remedy(StrEnum):
    NEW_COMMAND = "NEW_COMMAND"
    """Ask the command writer again, with the logs."""
    TEMPORAL_RETRY = "TEMPORAL_RETRY"
    """Same command later: let the activity retry policy handle it."""
    HUMAN = "HUMAN"
    """No command change will fix it: record the row as failed with a note."""


class Classification(BaseModel, frozen=True):
    category: ErrorCategory
    remedy: Remedy
    reason: str
    """One line a person can read in the CSV note / Web UI."""
    facts: dict[str, str] = Field(default_factory=dict)
    """Numbers pulled from the log that rule-based repairs use (max_seq_len, kv_tokens, port)."""


class HardwareProfile(BaseModel, frozen=True):
    """The docker host a fleet test targets."""

    name: str = "dgx"
    gpu_count: int = Field(default=8, ge=0)
    gpu_memory_gb: int = Field(default=80, ge=0)
    model_cache_dir: str = "/models/hf-cache"
    """Host directory mounted as the Hugging Face cache (must be inside a policy mount root)."""


Runtime = Literal["vllm", "tgi", "http"]


class ModelRow(BaseModel, frozen=True):
    """What the command writer needs from one manifest row."""

    model_name: str = Field(min_length=1, max_length=200)
    runtime: Runtime = "vllm"
    image: str | None = None
    gpus: int | None = Field(default=None, ge=0)
    port: int | None = Field(default=None, ge=1, le=65535)
    max_model_len: int | None = Field(default=None, ge=1)
