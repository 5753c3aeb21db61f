"""Fleet test vocabulary: a parsed `docker run` (DockerRunSpec), the policy it is checked against,
the error taxonomy (ErrorCategory, Remedy, Classification) and the inputs of the command writer.

Pure data; imports nothing else of ours except contracts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, model_validator


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
    images: tuple[str, ...] = ()
    """When non-empty, the image must be one of these exactly (the row's declared image: a verdict is about
    the image the manifest names, not one the writer picked)."""
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
    TIMEOUT = "timeout"
    """The command was still running at the test's deadline (`--test-timeout`) and was killed."""
    IDENTITY = "identity"
    """A server answered on the row's port, but it is not provably the row's own (another process's)."""
    MISMATCH = "mismatch"
    """The row's own server answered, but `GET /v1/models` lists other models than the row's."""
    HIDDEN = "hidden"
    """The process runner's command failed on a path its sandbox hides from it (the host's /tmp, the home, ...)."""


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
    TIMEOUT = "TIMEOUT"
    """The test did not finish within `--test-timeout` (the command was killed)."""
    POLICY_REJECTED = "POLICY_REJECTED"
    NO_COMMAND = "NO_COMMAND"
    """No writer produced a usable command (LLM down or refused, offline writer has no template)."""
    FOREIGN_SERVER = "FOREIGN_SERVER"
    """The server answering on the row's port is not provably the row's own."""
    MODEL_MISMATCH = "MODEL_MISMATCH"
    """The row's own server lists other models than the row's: its command deployed the wrong thing."""
    SANDBOX_HIDDEN = "SANDBOX_HIDDEN"
    """The process runner's command failed on a path the sandbox hides from it: share its folder (`--share DIR`)."""
    RUNNER_UNAVAILABLE = "RUNNER_UNAVAILABLE"
    TRANSIENT = "TRANSIENT"
    """Infrastructure hiccup (registry rate limit, a connection reset, a worker lost)."""
    DOCKER_UNREACHABLE = "DOCKER_UNREACHABLE"
    """The containers worker cannot talk to the docker daemon (not running, wrong DOCKER_HOST, no permission)."""
    DOCKER_ENGINE = "DOCKER_ENGINE"
    """The engine refused to create or start the container (`docker run` exit 125/126/127: OCI runtime error,
    name conflict, invalid option): the model never ran."""
    GPU_UNAVAILABLE = "GPU_UNAVAILABLE"
    """The row asked for GPUs the docker host cannot give (no GPU, no NVIDIA runtime or device)."""
    HOST_LIMIT = "HOST_LIMIT"
    """A limit of the host, not of the model: no space left, no memory for the engine, no more processes."""
    TIER_UNPROVABLE = "TIER_UNPROVABLE"
    """`--require-tier` asks for more than this row's test can prove (MATCHES without a reference answer;
    SENSIBLE or more from a runner or probe URL that only says pass/fail)."""
    UNKNOWN = "UNKNOWN"


HARNESS_CATEGORIES = frozenset({
    ErrorCategory.POLICY_REJECTED, ErrorCategory.NO_COMMAND, ErrorCategory.FOREIGN_SERVER,
    ErrorCategory.RUNNER_UNAVAILABLE, ErrorCategory.TRANSIENT, ErrorCategory.AUTH, ErrorCategory.IMAGE_NOT_FOUND,
    ErrorCategory.PORT_IN_USE, ErrorCategory.UNKNOWN, ErrorCategory.DOCKER_UNREACHABLE, ErrorCategory.DOCKER_ENGINE,
    ErrorCategory.GPU_UNAVAILABLE, ErrorCategory.HOST_LIMIT, ErrorCategory.TIER_UNPROVABLE,
    ErrorCategory.SANDBOX_HIDDEN,
})
"""Failures that say we could not test the model (no usable command, policy, runner, credentials, the
image missing on the host, the row's port held by someone else, the docker engine or the host refusing,
our sandbox hiding a path the command needs, an unexplained failure): the row ends
`Error` and the next run on the CSV tests it again. Every other category is the model's own failure
(`No`): it did not deploy, crashed, never became healthy, did not answer, or did not finish in time."""


class RowStatus(StrEnum):
    """What the CSV's status column says about a tested row."""

    YES = "Yes"
    """The model served and answered the probe."""
    NO = "No"
    """The model itself failed to deploy or serve (a category outside HARNESS_CATEGORIES)."""
    ERROR = "Error"
    """We failed to test it (a category in HARNESS_CATEGORIES); the next run tests it again."""


def row_status(passed: bool, category: str) -> RowStatus:
    """Yes / No / Error from a row's outcome and its last failure's category."""
    if passed:
        return RowStatus.YES
    try:
        harness = ErrorCategory(category) in HARNESS_CATEGORIES
    except ValueError:
        harness = True  # a category we do not know is nobody's verdict about the model
    return RowStatus.ERROR if harness else RowStatus.NO


class Tier(StrEnum):
    """How far a tested row got, each tier on positive evidence only (a 404 or an empty answer proves nothing)."""

    NONE = "NONE"
    """Not even healthy."""
    BOOTS = "BOOTS"
    """The server became healthy on the row's port."""
    SERVES = "SERVES"
    """It lists the row's model and answered every request of the probe (a self-test, a script or a probe
    URL: the row's own test passed)."""
    SENSIBLE = "SENSIBLE"
    """It answered a small fixed prompt set with non-empty, non-degenerate text within the latency bound."""
    MATCHES = "MATCHES"
    """Its greedy answer to the first prompt equals the reference answer given for the row."""

    @property
    def rank(self) -> int:
        return list(Tier).index(self)


class Evidence(BaseModel, frozen=True):
    """What a test saw, the reason for its tier (compact: it rides in history with the outcome)."""

    healthy: bool = False
    lists_model: bool = False
    """`GET /v1/models` listed the row's model (its id, a `--served-model-name` of it, or its path)."""
    listed: tuple[str, ...] = ()
    """The ids `GET /v1/models` listed (at most 5; empty in tests recorded before issue 40)."""
    asked: str = ""
    """The listed id the prompt set was sent to (the row's model under the name its server gives it)."""
    owner: bool = False
    """The row's container (or command) was seen holding the port's listening socket."""
    requests: int = 0
    answered: int = 0
    """Requests answered 2xx with a completion."""
    errors: int = 0
    sensible: int = 0
    """Answers with non-empty, non-degenerate text within the latency bound."""
    slowest_s: float = 0.0
    matched: bool | None = None
    """None: no reference for the row."""
    own_test: bool = False
    """The row's own test (process/script runner, or its probe URL) passed: no prompt set was sent."""
    check: str = ""
    """What the row's own test asked and was answered (`GET URL -> 200`, `exit 0`)."""
    note: str = ""
    """The first thing that kept it from the next tier."""

    def line(self) -> str:
        """One line a person reads in the table and the CSV's evidence column: what was asked, what answered."""
        if self.own_test and not (self.listed or self.lists_model or self.owner):
            parts = ["own test passed" + (f": {self.check}" if self.check else "")]
        else:
            parts = ["healthy" if self.healthy else "not healthy"]
            if self.healthy:
                parts.append(self._identity())
            if self.own_test:
                parts.append("own test passed" + (f": {self.check}" if self.check else ""))
            elif self.check:
                parts.append(f"own test: {self.check}")
            if self.requests:
                whom = "it" if self.lists_model and self.asked else (self.asked or "its model")
                parts.append(f"asked {whom} {self.requests} prompts: {self.answered}/{self.requests} answered, "
                             f"{self.errors} errors, {self.sensible} sensible, slowest {self.slowest_s:.1f}s")
            if self.matched is not None:
                parts.append("matches the reference" if self.matched else "differs from the reference")
        return "; ".join(parts) + (f" ({self.note})" if self.note else "")

    def _identity(self) -> str:
        names = ", ".join(self.listed)
        if self.lists_model:
            return f"lists its model as {self.asked}" if self.asked else "lists its model"
        if self.listed:
            return f"lists {names}, not its model"
        return "lists no model" + ("; its own process holds the port" if self.owner else "")


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
    port_range: tuple[int, int] = (8000, 8999)
    """Loopback ports the fleet hands out, one per running row (inclusive); also a cap on concurrency."""
    source: str = ""
    """Where the GPU figures come from: `discovered on HOST (nvidia-smi: ...)` for the default profile, a
    file's path, or empty (a profile built in code)."""

    @model_validator(mode="after")
    def _ports_in_order(self) -> "HardwareProfile":
        lo, hi = self.port_range
        if not 1024 <= lo <= hi <= 65535:
            raise ValueError(f"port_range {list(self.port_range)} must be [low, high] with 1024 <= low <= high <= 65535")
        return self

    @property
    def port_count(self) -> int:
        return self.port_range[1] - self.port_range[0] + 1

    def gpus_for(self, asked: int | None) -> int:
        """GPUs a row gets: what its `gpus` cell asks for (at most the host's), else 1 on a GPU host."""
        return min(asked, self.gpu_count) if asked is not None else min(1, self.gpu_count)

    def first_slot(self, asked: int | None) -> "Slot":
        """The slot of a row tested alone: the range's first port, the first GPUs."""
        return Slot(port=self.port_range[0], devices=tuple(range(self.gpus_for(asked))))


class Slot(BaseModel, frozen=True):
    """What one running row may use on the host: its own loopback port and its own GPUs. The fleet
    hands out slots so concurrent rows never share a port or a device; the writers are told the slot,
    the policy rejects a command that uses anything else, the runner probes only the slot's port."""

    port: int = Field(ge=1, le=65535)
    devices: tuple[int, ...] = ()
    """GPU indices (docker `--gpus '"device=2,3"'`); empty = no GPU."""

    @property
    def gpus_flag(self) -> str | None:
        return '"device=' + ",".join(map(str, self.devices)) + '"' if self.devices else None


Runtime = Literal["vllm", "tgi", "http"]


class ModelRow(BaseModel, frozen=True):
    """What the command writer needs from one manifest row."""

    model_name: str = Field(min_length=1, max_length=200)
    runtime: Runtime = "vllm"
    image: str | None = None
    gpus: int | None = Field(default=None, ge=0)
    port: int | None = Field(default=None, ge=1, le=65535)
    """Ignored by the writers: a fleet row serves on its slot's port (kept so old CSVs still parse)."""
    max_model_len: int | None = Field(default=None, ge=1)
