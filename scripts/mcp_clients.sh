#!/usr/bin/env bash
# The official MCP TypeScript clients for tests/e2e/test_mcp_conformance.py (clients nobody here wrote):
# @modelcontextprotocol/sdk 1.x (protocol 2025-11-25) and @modelcontextprotocol/client 2.x with
# @modelcontextprotocol/ext-tasks (protocol 2026-07-28, the tasks extension), pinned with their whole tree by
# tests/e2e/mcp_clients/package-lock.json and installed into tests/e2e/mcp_clients/node_modules (ignored by git).
# Node >= 20. Prints the folder the client scripts run from.
set -euo pipefail
cd "$(dirname "$0")/../tests/e2e/mcp_clients"
STAMP=node_modules/.fleetforge-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  npm ci --silent --no-audit --no-fund >/dev/null
  echo "$want" > "$STAMP"
fi
echo "$PWD"
