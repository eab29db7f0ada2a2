"""A real MCP server written with the official SDK, started by the MCP tests over stdio (or
streamable HTTP with ``--http PORT``). Besides two working tools it has ones that crash the
server, hang, or write garbage to the protocol stream."""

from __future__ import annotations

import io
import os
import sys
import time

from PIL import Image as PILImage

from mcp.server.mcpserver import Image, MCPServer

server = MCPServer("relax-test")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def swatch(color: str, size: int = 16) -> Image:
    """A square image filled with one colour (red, green or blue)."""
    rgb = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}[color]
    buf = io.BytesIO()
    PILImage.new("RGB", (size, size), rgb).save(buf, format="PNG")
    return Image(data=buf.getvalue(), format="png")


@server.tool()
def fail(message: str) -> str:
    """Raise an error inside the tool."""
    raise ValueError(message)


@server.tool()
def crash() -> str:
    """Kill the server process."""
    os._exit(3)


@server.tool()
def hang(seconds: float = 600.0) -> str:
    """Sleep (the client must time out)."""
    time.sleep(seconds)
    return "woke up"


@server.tool()
def garbage() -> str:
    """Write bytes that are not JSON-RPC to stdout, then exit."""
    sys.stdout.write("this is not json\n\x00\xff\n")
    sys.stdout.flush()
    os._exit(0)


@server.tool()
def pid() -> str:
    """The server's process id (to see restarts)."""
    return str(os.getpid())


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--fail-start":
        print("boom: cannot open the database at /nonexistent", file=sys.stderr)
        sys.exit(4)
    else:
        server.run()
