#!/usr/bin/env bash
# The machine-level engines the tests need: a docker engine (no bridge, no iptables: containers use
# --network host/none), Debian's headless chromium, and bubblewrap (the sandbox of untrusted children).
# Idempotent. Installs with apt only when running as root on a machine that lacks them;
# otherwise says what is missing and leaves the tests that need it to report it.
set -uo pipefail
STATE="${FLEETFORGE_STATE_DIR:-.fleetforge}"
mkdir -p "$STATE"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v busybox >/dev/null || missing+=(busybox-static)
command -v bwrap >/dev/null || missing+=(bubblewrap)  # the sandbox of every untrusted child (activities/sandbox)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)

if ((${#missing[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "engines: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >"$STATE/apt.log" 2>&1
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1 \
            || { echo "engines: apt-get install failed, see $STATE/apt.log"; tail -5 "$STATE/apt.log"; }
    else
        echo "engines: missing ${missing[*]} (install them as root; the docker/browser tests will fail without them)"
    fi
fi

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
