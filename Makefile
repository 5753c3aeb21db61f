# fleetforge: `make demo` and `make test` work on a fresh machine with only Python 3.11.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= toolchains,kernels,torch-export,test
# The demo converts an ONNX model: the toolchains extra is all it runs (about 240 MiB from PyPI). EXTRAS adds
# torch, whose PyPI wheel is the CUDA build: with its NVIDIA libraries about 3 GiB more.
DEMO_EXTRAS ?= toolchains

.PHONY: setup local-llm sandbox engines demo test test-fast bench clean

define install
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(1)]"
	touch $@
endef

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(call install,$(EXTRAS))

$(VENV)/.demo-installed: pyproject.toml
	$(call install,$(DEMO_EXTRAS))

# FLEETFORGE_LLM=local: llama.cpp's server built for a portable x86-64 baseline (no AVX-512, no AMX: a native
# build dies with SIGILL on Xeons that report AMX) and the SmolLM2-135M GGUF. The flags and the pinned version
# live in scripts/local_llm.sh; the first build takes 4-30 min on 2 cores, then its cached wheel is instant.
local-llm: $(VENV)/.local-llm

$(VENV)/.local-llm: $(VENV)/.installed scripts/local_llm.sh
	bash scripts/local_llm.sh $(BIN)/pip
	touch $@

# The demo's system package first (bubblewrap, apt as root; not root and missing: stop, saying the command).
demo: sandbox $(VENV)/.demo-installed
	$(BIN)/python examples/demo.py

sandbox:
	bash scripts/engines.sh demo

engines:
	bash scripts/engines.sh

TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
# pytest-xdist processes for `make test`: one per core, at most 4 (each starts its own Temporal dev server); a
# test file runs whole in one process, so its module fixtures (a llama.cpp server, a dev stack) start once.

test: setup local-llm engines
	$(BIN)/ruff check --no-cache .
	bash scripts/mcp_inspector.sh >/dev/null  # the MCP Inspector CLI (npm) for the MCP client test
	bash scripts/mcp_clients.sh >/dev/null  # the official MCP TypeScript clients (npm, pinned) for the conformance suite
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

FAST_TESTS := tests/unit tests/golden tests/replay

test-fast: setup  # between edits: lint + unit, golden and replay tests (no server, container or LLM; about 2 minutes on 2 cores)
	$(BIN)/ruff check --no-cache .
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=5 $(FAST_TESTS)

BENCHES ?= storage convert kernel kernelbench fleet llm sandbox

bench: setup local-llm  # every benchmark, one after the other (about 25 minutes; kernelbench alone about 12); BENCHES="kernel llm" for some
	@set -e; for b in $(BENCHES); do echo "== bench_$$b"; $(BIN)/python -m bench.bench_$$b; done

clean:
	rm -rf $(VENV) .fleetforge test-artifacts
