"""Settings: fleetforge's own FLEETFORGE_* variables, and the Temporal connection read like the
`temporal` CLI reads it (temporalio.envconfig: TEMPORAL_* variables and profiles)."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.connection import connect_options
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings

TEMPORAL_VARS = ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_PROFILE", "TEMPORAL_TLS",
                 "TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH", "FLEETFORGE_TEMPORAL_ADDRESS",
                 "FLEETFORGE_NAMESPACE", "FLEETFORGE_TEMPORAL_TLS", "FLEETFORGE_TEMPORAL_TLS_CERT",
                 "FLEETFORGE_TEMPORAL_TLS_KEY", "FLEETFORGE_UI_URL")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("FLEETFORGE_LLM", "FLEETFORGE_LLM_BASE_URL", "FLEETFORGE_LLM_API_KEY", "OPENAI_API_KEY",
                "FLEETFORGE_STORE_URL", "FLEETFORGE_STATE_DIR", "FLEETFORGE_QUEUE_PREFIX", *TEMPORAL_VARS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "no-such-temporal.toml"))  # not the user's profiles


def test_defaults_follow_the_public_interface():
    s = Settings()
    assert s.temporal_address == "127.0.0.1:7233" and s.namespace == "default" and s.ui_port == 8233
    assert s.ui_url == "http://127.0.0.1:8233"
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


def test_the_temporal_clis_variables_configure_the_connection(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TEMPORAL_ADDRESS", "localhost:7300")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "team-a")
    s = Settings()
    assert (s.temporal_address, s.namespace) == ("localhost:7300", "team-a")
    assert s.ui_url == "http://localhost:8233"
    opts = connect_options(s)
    assert opts["target_host"] == "localhost:7300" and opts["namespace"] == "team-a" and "tls" not in opts


def test_a_temporal_profile_gives_address_namespace_and_api_key_with_tls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    config = tmp_path / "temporal.toml"
    config.write_text('[profile.staging]\naddress = "10.0.0.5:7233"\nnamespace = "stage"\napi_key = "key-123"\n')
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    monkeypatch.setenv("TEMPORAL_PROFILE", "staging")
    s = Settings()
    assert (s.temporal_address, s.namespace) == ("10.0.0.5:7233", "stage")
    opts = connect_options(s)
    assert opts["api_key"] == "key-123" and opts["tls"] is True
    assert "key-123" not in repr(s) and "key-123" not in s.model_dump_json(), "the API key is never a settings field"


def test_an_unknown_profile_is_a_one_line_bad_input(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TEMPORAL_PROFILE", "nonesuch")
    with pytest.raises(FleetforgeError) as e:
        Settings()
    assert e.value.code is Err.BAD_INPUT and "nonesuch" in e.value.message


def test_the_old_fleetforge_variables_still_work_as_deprecated_aliases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:7233")
    monkeypatch.setenv("FLEETFORGE_TEMPORAL_ADDRESS", "127.0.0.1:7999")
    monkeypatch.setenv("FLEETFORGE_NAMESPACE", "legacy")
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(b"CERT")
    key.write_bytes(b"KEY")
    monkeypatch.setenv("FLEETFORGE_TEMPORAL_TLS", "true")
    monkeypatch.setenv("FLEETFORGE_TEMPORAL_TLS_CERT", str(cert))
    monkeypatch.setenv("FLEETFORGE_TEMPORAL_TLS_KEY", str(key))
    s = Settings()
    assert (s.temporal_address, s.namespace) == ("127.0.0.1:7999", "legacy")
    tls = connect_options(s)["tls"]
    assert tls.client_cert == b"CERT" and tls.client_private_key == b"KEY"


def test_explicit_values_win_and_a_ui_url_can_point_elsewhere(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TEMPORAL_ADDRESS", "localhost:7300")
    monkeypatch.setenv("FLEETFORGE_UI_URL", "https://cloud.temporal.io/")
    s = Settings(temporal_address="127.0.0.1:7444")
    assert s.temporal_address == "127.0.0.1:7444" and s.ui_url == "https://cloud.temporal.io"
