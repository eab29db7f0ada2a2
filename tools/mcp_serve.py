"""``relax-gym tools serve-mcp``: our built-in tools as an MCP server, so other agent
frameworks can use the python sandbox (and the calculator) through the official SDK.

::

    relax-gym tools serve-mcp                           # stdio: calculator + python
    relax-gym tools serve-mcp --tools python --http 8931   # streamable HTTP on 127.0.0.1:8931/mcp

Each call runs the tool exactly as a ``ToolEnv`` would (argument validation, the sandbox's
limits, the per-call timeout); a failure is an MCP tool result with ``isError`` set, never a
crashed server. Per-episode state (``ToolContext``) lives as long as the server.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any

from relax_gym.media import encode_image
from relax_gym.types import ImagePart, TextPart

from .builtin import builtin_tools
from .declaration import ToolContext, ToolRegistry, ToolResult

DEFAULT_TOOLS = ("calculator", "python")
# the image tools need the conversation's images, search an env's documents, and the answer
# tools end episodes: none of them means anything to an outside caller
SERVABLE = ("calculator", "python")


def select_tools(names: Sequence[str] | None) -> ToolRegistry:
    """The built-in tools to serve (default: calculator and python)."""
    every = builtin_tools()
    names = list(names or DEFAULT_TOOLS)
    unknown = [n for n in names if n not in SERVABLE]
    if unknown:
        raise ValueError(f"cannot serve {unknown}: choose from {list(SERVABLE)}")
    return ToolRegistry([every[n] for n in names])


def to_mcp_result(result: ToolResult) -> Any:
    """A ToolResult as an MCP CallToolResult (text and PNG images)."""
    import mcp_types as types

    content: list[Any] = []
    for part in result.content:
        if isinstance(part, TextPart):
            content.append(types.TextContent(type="text", text=part.text))
        elif isinstance(part, ImagePart):
            data = base64.b64encode(encode_image(part.image)).decode()
            content.append(types.ImageContent(type="image", data=data, mime_type="image/png"))
        else:
            content.append(types.TextContent(type="text", text=f"[{part.modality} output not sent over MCP]"))
    return types.CallToolResult(content=content or [types.TextContent(type="text", text="(no output)")],
                                is_error=result.is_error)


def build_server(registry: ToolRegistry, *, timeout_s: float = 60.0) -> Any:
    """A low-level MCP ``Server`` whose tools are ``registry``'s."""
    import mcp_types as types
    from mcp.server import Server

    ctx = ToolContext()

    async def list_tools(_ctx: Any, _params: Any) -> Any:
        return types.ListToolsResult(tools=[
            types.Tool(name=t.name, description=t.description, input_schema=t.spec.parameters) for t in registry
        ])

    async def call_tool(_ctx: Any, params: Any) -> Any:
        tool = registry.get(params.name)
        if tool is None:
            return to_mcp_result(ToolResult.error(registry.unknown_tool_message(params.name), "unknown_tool"))
        try:
            result = await asyncio.wait_for(tool.ainvoke(dict(params.arguments or {}), ctx), timeout_s)
        except TimeoutError:
            result = ToolResult.error(f"tool '{tool.name}' did not finish within {timeout_s:g} s", "timeout")
        return to_mcp_result(result)

    server = Server("relax-gym-tools", on_list_tools=list_tools, on_call_tool=call_tool)
    server._relax_ctx = ctx  # closed when serving ends
    return server


async def serve_stdio(registry: ToolRegistry, timeout_s: float) -> None:
    from mcp.server.stdio import stdio_server

    server = build_server(registry, timeout_s=timeout_s)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        server._relax_ctx.close()


def serve_http(registry: ToolRegistry, port: int, timeout_s: float) -> None:
    import uvicorn

    server = build_server(registry, timeout_s=timeout_s)
    app = server.streamable_http_app()
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    finally:
        server._relax_ctx.close()


def run(args: Any) -> int:
    """The ``serve-mcp`` action of ``relax-gym tools``."""
    from relax_gym.cli.common import fail

    try:
        registry = select_tools(args.tools)
    except ValueError as exc:
        return fail(str(exc), 2)
    try:
        import mcp  # noqa: F401
    except ImportError:
        return fail("serve-mcp needs the MCP SDK: pip install 'relax-gym[mcp]'", 2)
    if args.http is not None:
        serve_http(registry, args.http, args.timeout)
    else:
        asyncio.run(serve_stdio(registry, args.timeout))
    return 0

