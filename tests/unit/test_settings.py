"""Settings come from FLEETFORGE_* variables only; defaults match DESIGN.md's public interface."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FLEETFORGE_LLM", "FLEETFORGE_LLM_BASE_URL", "FLEETFORGE_LLM_API_KEY", "OPENAI_API_KEY",
                "FLEETFORGE_STORE_URL", "FLEETFORGE_STATE_DIR", "FLEETFORGE_QUEUE_PREFIX"):
        monkeypatch.delenv(var, raising=False)


def test_defaults_follow_the_public_interface():
    s = Settings()
    assert s.temporal_address == "127.0.0.1:7233" and s.namespace == "default" and s.ui_port == 8233
    assert s.state_dir == Path(".fleetforge")
    assert s.resolved_store_url == (Path(".fleetforge").resolve() / "artifacts").as_uri()
    assert s.llm_provider == "offline"
    assert s.queues.workflows == "fleetforge-workflows" and s.queues.containers == "fleetforge-containers"


def test_llm_provider_is_openai_when_a_key_or_base_url_is_set(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    s = Settings()
    assert s.llm_provider == "openai"
    assert s.llm_api_key is not None and s.llm_api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(s), "secrets must never appear in reprs or logs"
    monkeypatch.setenv("FLEETFORGE_LLM", "offline")
    assert Settings().llm_provider == "offline"


def test_queue_prefix_renames_every_queue(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FLEETFORGE_QUEUE_PREFIX", "gpu-east")
    assert Settings().queues.all() == sorted(
        f"gpu-east-{k}" for k in ("workflows", "llm", "toolchain", "kernels", "containers")
    )
