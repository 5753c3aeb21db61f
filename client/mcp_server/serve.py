"""Running the MCP server: stdio (a client starts `fleetforge mcp`), or streamable HTTP on
127.0.0.1 by default. Bound anywhere else it requires a bearer token (FLEETFORGE_MCP_TOKEN or
--token): every HTTP request must carry `Authorization: Bearer <token>`."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

import anyio

from contracts.errors import Err, FleetforgeError
from contracts.settings import Settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """A server reachable from other machines is never open: refuse to bind it without a token."""
    if not is_loopback(host) and not token:
        raise FleetforgeError(Err.BAD_INPUT, f"--host {host} makes the MCP server reachable from other machines: "
                                             "set a bearer token (FLEETFORGE_MCP_TOKEN or --token)")


class BearerAuth:
    """ASGI middleware: 401 unless `Authorization: Bearer <token>` matches (constant-time compare)."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token\n"})
                return
        await self.app(scope, receive, send)


def http_app(server: Any, host: str, token: str | None) -> Any:
    app = server.streamable_http_app(host=host)
    return BearerAuth(app, token) if token else app


def serve(transport: str, *, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          settings: Settings | None = None) -> None:
    from client.mcp_server.server import build_server

    server = build_server(settings)
    if transport == "stdio":
        anyio.run(server.run_stdio_async)
        return
    check_binding(host, token)
    import uvicorn

    config = uvicorn.Config(http_app(server, host, token), host=host, port=port, log_level="warning")
    anyio.run(uvicorn.Server(config).serve)
