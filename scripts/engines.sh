#!/usr/bin/env bash
# The machine-level engines fleetforge runs, installed with apt as root on a machine that lacks them.
#   scripts/engines.sh demo   what `make demo` runs: bubblewrap, the sandbox of every untrusted child
#                             (activities/sandbox), and libatomic1, which onnxruntime-qnn's QNN backend
#                             loads (without it every HTP compile fails). Not root and missing: exit 2
#                             before anything starts, printing the one command to run.
#   scripts/engines.sh        what `make test` runs: that, plus a docker engine (no bridge, no iptables:
#                             containers use --network host/none), busybox for the test images, Debian's
#                             headless chromium; not root: says what is missing and leaves the tests that
#                             need it to fail saying so. Node.js >= 20 with npm (the MCP client tests) is
#                             not installed here: Debian 12's nodejs is 18.
#   scripts/engines.sh build  what scripts/local_llm.sh runs before it builds llama.cpp from source: a C++
#                             compiler (g++). Not root and missing: exit 2, printing the one command to run.
# Idempotent.
set -uo pipefail
SET=${1:-test}
STATE="${FLEETFORGE_STATE_DIR:-.fleetforge}"
mkdir -p "$STATE"

has_lib() { { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q "$1"; }
missing=()
if [[ $SET == build ]]; then
    command -v g++ >/dev/null || command -v c++ >/dev/null || missing+=(g++)
else
    command -v bwrap >/dev/null || missing+=(bubblewrap)
    has_lib libatomic.so.1 || missing+=(libatomic1)
fi
if [[ $SET == test ]]; then
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v busybox >/dev/null || missing+=(busybox-static)
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
fi

if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "engines: installing ${missing[*]} (apt-get, log: $STATE/apt.log)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >"$STATE/apt.log" 2>&1
        if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1; then
            echo "engines: apt-get install failed, see $STATE/apt.log"; tail -5 "$STATE/apt.log"
            [[ $SET != test ]] && exit 1
        fi
    elif [[ $SET == build ]]; then
        echo "building llama.cpp from source needs a C++ compiler (${missing[*]}); nothing was built."
        echo "Install it as root, then run the make command again:"
        echo "    sudo apt-get install -y ${missing[*]}"
        exit 2
    elif [[ $SET == demo ]]; then
        echo "make demo needs the system package(s) ${missing[*]} (the sandbox, the QNN backend's libatomic); nothing was started."
        echo "Install as root, then run make demo again:"
        echo "    sudo apt-get install -y ${missing[*]}"
        exit 2
    else
        echo "engines: missing ${missing[*]} (install them as root; the sandbox/docker/browser tests fail without them)"
    fi
fi
[[ $SET != test ]] && exit 0

command -v npm >/dev/null || echo "engines: npm not found: the MCP client tests need Node.js >= 20 with npm"
if command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
    if [[ $(id -u) == 0 ]]; then
        echo "engines: starting dockerd (log: $STATE/dockerd.log)"
        nohup dockerd --bridge=none --iptables=false --ip-masq=false >"$STATE/dockerd.log" 2>&1 &
        for _ in $(seq 1 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
        docker info >/dev/null 2>&1 || { echo "engines: dockerd did not come up in 60 s"; tail -20 "$STATE/dockerd.log"; }
    else
        echo "engines: docker engine not running and not root: start dockerd yourself"
    fi
fi
exit 0
