"""The one settings object, read from FLEETFORGE_* environment variables at process start.

Workflows never read it: the client copies what a workflow needs (task queues) into the request.
Secrets (LLM key, AWS credentials) are only ever read here or by boto3 from the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, computed_field
from pydantic_settings import BaseSettings, SettingsConfigDict

from contracts.common import TaskQueues


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETFORGE_", extra="ignore")

    state_dir: Path = Path(".fleetforge")
    temporal_address: str = "127.0.0.1:7233"
    namespace: str = "default"
    temporal_tls: bool = False
    temporal_tls_cert: Path | None = None
    temporal_tls_key: Path | None = None
    ui_port: int = 8233
    metrics_port: int | None = None

    queue_prefix: str = "fleetforge"
    """Task queues are `<prefix>-workflows`, `<prefix>-llm`, ... (one prefix per deployment)."""

    store_url: str | None = None
    """`file:///abs/path` or `s3://bucket/prefix`; default: file://<state_dir>/artifacts."""
    s3_endpoint: str | None = None
    catalog: Path | None = None
    """Model catalog YAML: `models: {name: {path: ..., description: ...}}`."""

    llm: Literal["offline", "openai"] | None = None
    llm_base_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("FLEETFORGE_LLM_API_KEY", "OPENAI_API_KEY")
    )

    qairt_sdk_root: Path | None = Field(default=None, validation_alias=AliasChoices("QAIRT_SDK_ROOT"))

    process_programs: str = "python,python3"
    """Programs a fleet's `process` runner may start (comma-separated; a containers worker's own choice)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def llm_provider(self) -> Literal["offline", "openai"]:
        """`openai` when an endpoint or key is configured, else the deterministic offline agents."""
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
        host = self.temporal_address.rsplit(":", 1)[0]
        return f"http://{host}:{self.ui_port}"

    @property
    def cache_dir(self) -> Path:
        """Local disk cache (workspaces, downloaded artifacts). Never the source of truth."""
        return self.state_dir.resolve() / "cache"
