"""MCP tool servers: the tools of Model Context Protocol servers in a ``ToolEnv``, through
the official ``mcp`` SDK.

::

    env = relax_gym.make("relax/Dataset-v0", path="q.jsonl", mcp_servers=[
        {"name": "files", "command": ["python", "my_server.py"], "timeout_s": 10},
        {"name": "web", "url": "http://127.0.0.1:8931/mcp"},
    ])

* **Servers** -- ``command`` (a stdio server, started as a subprocess) or ``url`` (streamable
  HTTP). A stdio server runs with a memory ceiling (``memory_mb``, RLIMIT_AS) and its stderr goes
  to a file whose tail is quoted when it fails to start.
* **Tools** -- listed once when the server starts and declared to the model like our own
  (name, description, JSON schema); ``tools`` keeps only some, ``prefix`` renames them.
  Arguments are checked against the schema before the call.
* **Results** -- text parts become text, image (and audio) parts become observations; the text
  is capped at ``max_output_chars`` and images at ``max_images`` per call.
* **Failures** -- a call past ``timeout_s``, a crashed server, a closed pipe or a reply that is
  not MCP become a tool-error observation for that call. The server is then restarted before
  its next call (so the next episode gets a fresh one); :func:`stats` counts calls, errors,
  timeouts and restarts per server.

Each server is one connection per process, shared by every env that names the same config:
the rollout builds an env per episode and must not start a server each time. The connection
lives on its own thread with its own event loop (the SDK's session is bound to one loop), and
calls from any thread or loop are handed to it.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relax_gym.errors import MediaError, RelaxGymError
from relax_gym.media import load_audio, load_image
from relax_gym.types import AudioPart, ContentPart, ImagePart, TextPart, ToolSpec

from .declaration import Tool, ToolArgumentError, ToolContext, ToolResult, run_sync

log = logging.getLogger(__name__)


class MCPServerError(RelaxGymError):
    """An MCP server could not be started or listed (the message names the command and its stderr)."""


class MCPServerConfig(BaseModel):
    """One MCP server, as written in an env's ``mcp_servers`` list."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="shown in errors and metrics (default: the command or URL)")
    command: list[str] | str | None = Field(None, description="a stdio server: argv (a list) or a shell-like line")
    url: str | None = Field(None, description="a streamable-HTTP server, e.g. http://127.0.0.1:8931/mcp")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for a stdio server")
    cwd: str | None = None
    tools: list[str] | None = Field(None, description="offer only these tools (default: all)")
    prefix: str = Field("", description="put before each tool's name (to avoid clashes)")
    timeout_s: float = Field(30.0, gt=0, description="per call")
    startup_timeout_s: float = Field(60.0, gt=0)
    max_output_chars: int = Field(8000, ge=100)
    max_images: int = Field(4, ge=0)
    memory_mb: int | None = Field(4096, ge=64, description="address-space ceiling of a stdio server (None: none)")

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give command (a stdio server) or url (streamable HTTP), not both or neither")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        if isinstance(self.command, str):
            self.command = shlex.split(self.command)
        if self.command is not None and not self.command:
            raise ValueError("command is empty")
        return self

    @property
    def label(self) -> str:
        return self.name or (" ".join(self.command) if self.command else str(self.url))

    def key(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True)


def parse_servers(servers: Sequence[Any]) -> list[MCPServerConfig]:
    """Validate an ``mcp_servers`` list (dicts, configs, a URL or a command line each)."""
    if isinstance(servers, (str, Mapping)):
        servers = [servers]
    out = []
    for i, s in enumerate(servers):
        if isinstance(s, MCPServerConfig):
            out.append(s)
            continue
        if isinstance(s, str):
            s = {"url": s} if s.startswith(("http://", "https://")) else {"command": s}
        try:
            out.append(MCPServerConfig.model_validate(s))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'server'}: {e['msg']}" for e in exc.errors())
            raise MCPServerError(f"mcp_servers[{i}]: {problems}") from None
    return out


# ------------------------------------------------------------------------------------------------
# one connection: a thread with an event loop holding the SDK's client
# ------------------------------------------------------------------------------------------------
class _Stats:
    def __init__(self) -> None:
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.restarts = 0
        self.lock = threading.Lock()

    def add(self, **counts: int) -> None:
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def to_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "errors": self.errors, "timeouts": self.timeouts, "restarts": self.restarts}


class MCPConnection:
    """A started server and its SDK client; restarts itself after a failure."""

    def __init__(self, config: MCPServerConfig) -> None:
        self.config = config
        self.stats = _Stats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{config.label[:20]}", daemon=True)
        self._thread.start()
        self._lock = threading.Lock()
        self._client: Any = None
        self._stop: asyncio.Event | None = None
        self._runner: Future[None] | None = None
        self._broken = False
        self._errlog: Any = None
        self.tools: list[Any] = []
        self._start()

    # -- lifecycle ----------------------------------------------------------------------------
    def _transport(self) -> Any:
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        c = self.config
        if c.url is not None:
            return streamable_http_client(c.url)
        assert isinstance(c.command, list)
        argv = list(c.command)
        if c.memory_mb is not None:  # a launcher that sets the ceiling, then execs the server
            argv = [sys.executable, "-m", "relax_gym.tools._mcp_launch", str(c.memory_mb), "--", *argv]
        if self._errlog is not None:
            self._errlog.close()
        self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(c.env) or None, cwd=c.cwd)
        return stdio_client(params, errlog=self._errlog)

    async def _run(self, ready: asyncio.Future[Any]) -> None:
        """Hold the client open in one task (the SDK's scopes must close in the task that opened them)."""
        from mcp import Client

        self._stop = asyncio.Event()
        try:
            async with Client(self._transport(), read_timeout_seconds=self.config.timeout_s) as client:
                listed = await client.list_tools()
                self._client = client
                if not ready.done():
                    ready.set_result(listed.tools)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - report any startup failure to the waiting thread
            if not ready.done():
                ready.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                log.warning("MCP server %s closed with %s: %s", self.config.label, type(exc).__name__, exc)
        finally:
            self._client = None

    def _stderr_tail(self, n: int = 1500) -> str:
        if self._errlog is None:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            text = self._errlog.read()
        except (OSError, ValueError):
            return ""
        return text[-n:].strip()

    def _start(self) -> None:
        c = self.config

        async def begin() -> Any:
            ready: asyncio.Future[Any] = self._loop.create_future()
            self._runner_task = self._loop.create_task(self._run(ready))
            return await ready

        fut = asyncio.run_coroutine_threadsafe(begin(), self._loop)
        try:
            listed = fut.result(timeout=c.startup_timeout_s)
        except BaseException as exc:
            fut.cancel()
            self._shutdown_runner()
            what = f"command {' '.join(c.command)!r}" if c.command else f"url {c.url!r}"
            tail = self._stderr_tail()
            reason = "did not answer within %.0f s" % c.startup_timeout_s if isinstance(exc, TimeoutError) else \
                f"{type(_leaf(exc)).__name__}: {_first_line(exc)}"
            raise MCPServerError(
                f"MCP server {c.label!r} ({what}) did not start: {reason}" + (f"\nits stderr ends:\n{tail}" if tail else "")
            ) from None
        wanted = set(c.tools) if c.tools is not None else None
        self.tools = [t for t in listed if wanted is None or t.name in wanted]
        if wanted is not None and wanted - {t.name for t in listed}:
            self._shutdown_runner()
            raise MCPServerError(
                f"MCP server {c.label!r} has no tools {sorted(wanted - {t.name for t in listed})}; "
                f"it offers {[t.name for t in listed]}"
            )
        self._broken = False

    def _shutdown_runner(self, wait_s: float = 10.0) -> None:
        stop, task = self._stop, getattr(self, "_runner_task", None)

        def signal() -> None:
            if stop is not None:
                stop.set()

        if self._loop.is_running():
            self._loop.call_soon_threadsafe(signal)
            if task is not None:
                async def wait() -> None:
                    try:
                        await asyncio.wait_for(asyncio.shield(task), wait_s)
                    except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                        task.cancel()

                try:
                    asyncio.run_coroutine_threadsafe(wait(), self._loop).result(wait_s + 5)
                except Exception:  # noqa: BLE001 - best effort: the loop thread is a daemon
                    pass
        self._client = None

    def restart(self) -> None:
        """Stop the server and start it again (after a crash, a hang or garbage)."""
        with self._lock:
            self._shutdown_runner()
            self.stats.add(restarts=1)
            self._start()

    def close(self) -> None:
        self._shutdown_runner()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    # -- calls --------------------------------------------------------------------------------
    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool from any thread or loop; raises on timeout or a broken server."""
        if self._broken or self._client is None:
            await asyncio.to_thread(self.restart)
        client = self._client
        if client is None:
            raise MCPServerError(f"MCP server {self.config.label!r} is not connected")
        timeout = self.config.timeout_s
        fut = asyncio.run_coroutine_threadsafe(client.call_tool(name, arguments, read_timeout_seconds=timeout),
                                               self._loop)
        self.stats.add(calls=1)
        try:
            async with asyncio.timeout(timeout + 1.0):
                return await asyncio.wrap_future(fut)
        except TimeoutError:
            fut.cancel()
            self._broken = True
            self.stats.add(errors=1, timeouts=1)
            raise MCPCallError(f"did not answer within {timeout:g} s (the server is restarted)") from None
        except Exception as exc:  # noqa: BLE001 - a crash, a closed pipe, a protocol error
            self._broken = True
            self.stats.add(errors=1, timeouts=int("timed out" in str(exc)))
            raise MCPCallError(f"the server failed ({type(_leaf(exc)).__name__}: {_first_line(exc)}); "
                               "it is restarted") from None


class MCPCallError(RelaxGymError):
    """One call failed for a reason outside the tool (timeout, crash, protocol)."""


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside anyio's task-group wrappers."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _first_line(exc: BaseException) -> str:
    exc = _leaf(exc)
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


_CONNECTIONS: dict[str, MCPConnection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def connect(config: MCPServerConfig) -> MCPConnection:
    """The process's connection for this server config (started on first use)."""
    key = config.key()
    with _CONNECTIONS_LOCK:
        conn = _CONNECTIONS.get(key)
        if conn is None:
            conn = MCPConnection(config)
            _CONNECTIONS[key] = conn
        return conn


def stats() -> dict[str, dict[str, int]]:
    """Calls, errors, timeouts and restarts of every MCP server this process started."""
    out: dict[str, dict[str, int]] = {}
    with _CONNECTIONS_LOCK:
        for c in _CONNECTIONS.values():  # two configs of one server (other tools/prefix) add up
            mine = out.setdefault(c.config.label, dict.fromkeys(("calls", "errors", "timeouts", "restarts"), 0))
            for k, v in c.stats.to_dict().items():
                mine[k] += v
    return out


def close_all() -> None:
    """Stop every server (also run at exit)."""
    with _CONNECTIONS_LOCK:
        conns = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for c in conns:
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass


atexit.register(close_all)


# ------------------------------------------------------------------------------------------------
# tools
# ------------------------------------------------------------------------------------------------
class MCPTool(Tool):
    """A tool of an MCP server, declared with the server's own schema."""

    def __init__(self, conn: MCPConnection, remote: Any) -> None:  # noqa: D107 - no Tool.__init__: no function
        self.conn = conn
        self.remote_name = str(remote.name)
        self.name = conn.config.prefix + self.remote_name
        self.description = (remote.description or remote.title or f"the {self.remote_name} tool").strip()
        schema = dict(remote.input_schema or {"type": "object", "properties": {}})
        schema.setdefault("type", "object")
        self.schema = schema
        self.spec = ToolSpec(self.name, self.description, schema)
        self.parameter_names = list((schema.get("properties") or {}).keys())
        self.output_modalities: tuple[str, ...] = ()
        self.context_param = None
        self.is_async = True
        self.fn = self._call_plain
        self.__name__ = self.name
        self.__doc__ = self.description
        try:
            from jsonschema import Draft202012Validator

            self._validator: Any = Draft202012Validator(schema)
        except Exception:  # noqa: BLE001 - a server's odd schema: leave checking to the server
            self._validator = None

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r} on {self.conn.config.label!r})"

    def _call_plain(self, **kwargs: Any) -> ToolResult:
        return self.invoke(kwargs)

    def validate(self, arguments: Mapping[str, Any] | Any) -> dict[str, Any]:
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(
                f"invalid arguments for tool '{self.name}': expected a JSON object, got {type(arguments).__name__}"
            )
        if self._validator is not None:
            errors = sorted(self._validator.iter_errors(dict(arguments)), key=lambda e: list(e.path))
            if errors:
                where = ".".join(map(str, errors[0].path)) or "arguments"
                raise ToolArgumentError(f"invalid arguments for tool '{self.name}': {where}: {errors[0].message}")
        return dict(arguments)

    async def ainvoke(self, arguments: Mapping[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        try:
            args = self.validate(arguments)
        except ToolArgumentError as exc:
            return ToolResult.error(str(exc), "bad_arguments")
        try:
            result = await self.conn.call(self.remote_name, args)
        except asyncio.CancelledError:
            raise
        except (MCPCallError, MCPServerError) as exc:
            return ToolResult.error(f"tool '{self.name}' (MCP server {self.conn.config.label!r}): {exc}", "server_error")
        return self._convert(result)

    def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        return run_sync(self.ainvoke(arguments, ctx))

    def _convert(self, result: Any) -> ToolResult:
        """An MCP CallToolResult as content parts; anything malformed is a tool error."""
        c = self.conn.config
        try:
            blocks = list(result.content or [])
            is_error = bool(result.is_error)
        except AttributeError:
            self.conn.stats.add(errors=1)
            return ToolResult.error(f"tool '{self.name}': the server's reply is not an MCP tool result", "server_error")
        parts: list[ContentPart] = []
        texts: list[str] = []
        images = 0
        for block in blocks:
            kind = getattr(block, "type", None)
            try:
                if kind == "text":
                    texts.append(str(block.text))
                elif kind == "image":
                    if images >= c.max_images:
                        texts.append(f"[image left out: at most {c.max_images} per call]")
                        continue
                    parts.append(ImagePart(load_image(str(block.data))))
                    images += 1
                elif kind == "audio":
                    wave, sr = load_audio(str(block.data))
                    parts.append(AudioPart(wave, sr))
                elif kind == "resource" and getattr(block.resource, "text", None) is not None:
                    texts.append(str(block.resource.text))
                else:
                    texts.append(f"[{kind or 'unknown'} content not shown]")
            except (MediaError, ValueError) as exc:
                texts.append(f"[unreadable {kind}: {exc}]")
        if not blocks and getattr(result, "structured_content", None) is not None:
            texts.append(json.dumps(result.structured_content, default=str))
        text = "\n".join(texts)
        if len(text) > c.max_output_chars:
            half = c.max_output_chars // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
        content: list[ContentPart] = ([TextPart(text)] if text or not parts else []) + parts
        if is_error:
            self.conn.stats.add(errors=1)
            return ToolResult(content or [TextPart("the tool reported an error")], is_error=True, error_kind="tool_error")
        return ToolResult(content or [TextPart("(no output)")])


def mcp_tools(servers: Sequence[Any]) -> list[MCPTool]:
    """Start (or reuse) each server and return its tools, checked for name clashes."""
    tools: list[MCPTool] = []
    seen: dict[str, str] = {}
    for config in parse_servers(servers):
        conn = connect(config)
        for remote in conn.tools:
            t = MCPTool(conn, remote)
            if t.name in seen:
                raise MCPServerError(f"two MCP tools are named {t.name!r} (servers {seen[t.name]!r} and "
                                     f"{config.label!r}); give one server a prefix")
            seen[t.name] = config.label
            tools.append(t)
    return tools


def with_mcp_servers(env: Any, servers: Sequence[Any]) -> Any:
    """``env`` with the servers' tools offered: added to its ToolEnv, or wrapped in one."""
    from .env import ToolEnv

    tools = mcp_tools(servers)
    node = env
    while node is not None:
        if isinstance(node, ToolEnv):
            for t in tools:
                node._given_tools.append(t)
            node.registry = node._build_registry()
            return env
        node = getattr(node, "env", None)
    return ToolEnv(env, tools=tools)


def wait_for_port(host: str, port: int, timeout_s: float = 30.0) -> None:
    """Block until a TCP port accepts connections (for HTTP servers started by scripts/tests)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise MCPServerError(f"nothing listens on {host}:{port} after {timeout_s:g} s")


__all__ = ["MCPCallError", "MCPConnection", "MCPServerConfig", "MCPServerError", "MCPTool", "close_all",
           "connect", "mcp_tools", "parse_servers", "stats", "wait_for_port", "with_mcp_servers"]
