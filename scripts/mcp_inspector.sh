#!/usr/bin/env bash
# The MCP Inspector CLI (a client nobody here wrote) for tests/e2e/test_mcp_inspector.py: npm's
# @modelcontextprotocol/inspector, pinned, installed into .mcp-inspector/ (ignored by git). Node >= 20.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.mcp-inspector
VERSION=2.12.0
if [ ! -x "$DIR/node_modules/.bin/mcp-inspector" ]; then
  mkdir -p "$DIR"
  npm install --silent --no-audit --no-fund --prefix "$DIR" "@modelcontextprotocol/inspector@$VERSION" >/dev/null
fi
echo "$PWD/$DIR/node_modules/.bin/mcp-inspector"
