"""`fleetforge mcp`: serve fleetforge to MCP clients (client/mcp_server/)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from client.cli.app import app, settings
from contracts.errors import Err, FleetforgeError


@app.command()
def mcp(
    transport: Annotated[str, typer.Option("--transport", help="stdio (a client starts this command) or http "
                                           "(streamable HTTP at http://HOST:PORT/mcp).")] = "stdio",
    host: Annotated[str, typer.Option("--host", help="HTTP: the address to bind; anything but loopback needs "
                                      "--token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="HTTP: the port.")] = 8765,
    token: Annotated[Optional[str], typer.Option("--token", envvar="FLEETFORGE_MCP_TOKEN", show_default=False,
                                                 help="HTTP: bearer token every request must carry.")] = None,
) -> int:
    """Serve fleetforge to MCP clients (Claude Code, Cursor, ...): tools, tasks, artifacts as resources."""
    from client.mcp_server.serve import check_binding, serve

    if transport not in ("stdio", "http"):
        raise FleetforgeError(Err.BAD_INPUT, f"--transport {transport}: use stdio or http")
    if transport == "http":
        check_binding(host, token)
    serve(transport, host=host, port=port, token=token, settings=settings())
    return 0
