"""The MCP SDK's own server with four tools, for the MCP client tests.

``python -m tests.tools.mcp_server stdio`` speaks over stdin/stdout;
``python -m tests.tools.mcp_server http PORT [KEY]`` serves streamable HTTP on loopback
and, given KEY, answers 401 to any request without ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("duet-test")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def echo(text: str) -> str:
    """Give the text back."""
    return text


@server.tool()
def broken() -> str:
    """Always fail, saying why (an exception of another type is reported without its text)."""
    raise ToolError("the tool broke on purpose")


@server.tool()
def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "done"


@server.tool()
def pid() -> str:
    """The server's process id (the client tests see whether a session was reused)."""
    return str(os.getpid())


def _guarded(app: Any, key: str) -> Any:
    """``app`` behind a bearer-key check (the real servers' usual front door)."""
    expected = f"Bearer {key}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


def main(argv: list[str]) -> None:
    if argv[0] == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app()
    if len(argv) > 2:
        app = _guarded(app, argv[2])
    uvicorn.run(app, host="127.0.0.1", port=int(argv[1]), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
