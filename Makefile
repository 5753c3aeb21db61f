# fleetforge: `make demo` and `make test` work on a fresh machine with only Python 3.11.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= toolchains,kernels,test

.PHONY: setup engines demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: setup
	$(BIN)/python examples/demo.py

engines:
	bash scripts/engines.sh

test: setup engines
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: setup
	$(BIN)/python -m bench.bench_storage --size-mib 1024

clean:
	rm -rf $(VENV) .fleetforge test-artifacts
