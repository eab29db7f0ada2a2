"""``relax-gym tools``: list the built-in tools and run them by hand, for debugging.

::

    relax-gym tools list                      # names, parameters, descriptions (--json: schemas)
    relax-gym tools run python --code 'print(2 ** 100)'
    relax-gym tools run calculator --args '{"expression": "2+3"}'
    relax-gym tools run zoom --image photo.png --args '{"image_id": "image", "bbox": [0, 0, 64, 64]}'
    relax-gym tools run search --docs docs.jsonl --args '{"query": "opening hours"}'
    relax-gym tools parse --parser hermes '<tool_call>{"name": "calculator", ...}</tool_call>'
    relax-gym tools sandbox                   # which isolation the sandbox gets on this machine
    relax-gym tools serve-mcp [--http PORT]   # calculator + python sandbox as an MCP server

Exit status: 0 on success, 1 when the tool reported an error (or the code failed), 2 for bad
command-line input.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from relax_gym.cli.common import fail
from relax_gym.errors import MediaError
from relax_gym.types import AudioPart, ImagePart, TextPart, VideoPart


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tools_command", metavar="ACTION")
    p_list = sub.add_parser("list", help="list the built-in tools and their parameters")
    p_list.add_argument("--json", action="store_true", help="print the OpenAI tool schemas as JSON")

    p_run = sub.add_parser("run", help="run one tool with JSON arguments")
    p_run.add_argument("name", help="tool name (see `relax-gym tools list`)")
    p_run.add_argument("--args", default=None, help="the arguments as a JSON object")
    p_run.add_argument("--code", help="python only: the code to run (instead of --args)")
    p_run.add_argument("--file", help="python only: run this file's contents")
    p_run.add_argument("--image", action="append", default=[], metavar="[ID=]PATH",
                       help="make an image available to image tools (id defaults to 'image')")
    p_run.add_argument("--docs", help="search only: documents, one per line, or JSON/JSONL of {id,title,text}")
    p_run.add_argument("--timeout", type=float, default=10.0, help="python only: wall-clock limit in seconds")
    p_run.add_argument("--memory-mb", type=int, default=1024, help="python only: address-space limit")
    p_run.add_argument("--out-dir", help="where to write media results (default: a new temp dir)")
    p_run.add_argument("--json", action="store_true", help="print the result as JSON")

    p_parse = sub.add_parser("parse", help="parse model output into tool calls (shows what ToolEnv sees)")
    p_parse.add_argument("text", help="the model output, or - to read stdin")
    p_parse.add_argument("--parser", default="hermes")

    sub.add_parser("sandbox", help="show which isolation the python sandbox gets here")

    p_mcp = sub.add_parser("serve-mcp", help="serve the calculator and the python sandbox as an MCP server")
    p_mcp.add_argument("--tools", nargs="+", metavar="NAME", help="tools to serve (default: calculator python)")
    p_mcp.add_argument("--http", type=int, metavar="PORT", help="streamable HTTP on 127.0.0.1:PORT/mcp (default: stdio)")
    p_mcp.add_argument("--timeout", type=float, default=60.0, help="seconds per call (default 60)")


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "tools_command", None)
    if command == "list":
        return _list(args)
    if command == "run":
        return _run(args)
    if command == "parse":
        return _parse(args)
    if command == "sandbox":
        return _sandbox()
    if command == "serve-mcp":
        from .mcp_serve import run as serve

        return serve(args)
    print("usage: relax-gym tools {list,run,parse,sandbox,serve-mcp} ...  (see --help)", file=sys.stderr)
    return 2


def _list(args: argparse.Namespace) -> int:
    from relax_gym.tools import builtin_tools

    registry = builtin_tools()
    if args.json:
        print(json.dumps([s.to_openai() for s in registry.specs()], indent=2, ensure_ascii=False))
        return 0
    for t in registry:
        props = t.spec.parameters.get("properties", {})
        required = set(t.spec.parameters.get("required", []))
        params = ", ".join(f"{n}{'' if n in required else '?'}: {_type_label(p)}" for n, p in props.items())
        print(f"{t.name}({params})")
        print(f"    {t.description.splitlines()[0]}")
    return 0


def _type_label(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(json.dumps(v) for v in schema["enum"])
    t = schema.get("type")
    if isinstance(t, list):
        return "|".join(t)
    if t == "array" and isinstance(schema.get("items"), dict):
        n = schema.get("minItems") if schema.get("minItems") == schema.get("maxItems") else None
        return f"{_type_label(schema['items'])}[{n or ''}]"
    if "anyOf" in schema:
        return "|".join(_type_label(s) for s in schema["anyOf"])
    return str(t or "any")


def _load_docs(path: str) -> list[Any]:
    text = Path(path).read_text(encoding="utf-8")
    stripped = text.strip()
    if stripped.startswith("["):
        return list(json.loads(stripped))
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and all(line.lstrip().startswith("{") for line in lines):
        return [json.loads(line) for line in lines]
    return lines


def _context(args: argparse.Namespace) -> Any:
    from relax_gym.tools import ToolContext

    from relax_gym.media import load_image

    ctx = ToolContext()
    for spec in args.image:
        image_id, sep, path = spec.partition("=")
        if not sep:
            image_id, path = "image", spec
        ctx.images[image_id] = ImagePart(load_image(path), id=image_id)
    if args.docs:
        ctx.env = SimpleNamespace(documents=_load_docs(args.docs))
    return ctx


def _run(args: argparse.Namespace) -> int:
    from relax_gym.tools import builtin_tools, run_python

    registry = builtin_tools()
    if args.name not in registry:
        return fail(registry.unknown_tool_message(args.name), 2)
    if args.name == "python" and (args.code is not None or args.file):
        code = args.code if args.code is not None else Path(args.file).read_text(encoding="utf-8")
        result = run_python(code, timeout_s=args.timeout, memory_mb=args.memory_mb)
        if args.json:
            print(json.dumps(result.__dict__, indent=2, ensure_ascii=False))
        else:
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            status = f"exit code {result.exit_code}, {result.duration_s * 1000:.1f} ms"
            if result.killed_reason:
                status += f", stopped: {result.killed_reason}"
            print(f"[{status}]", file=sys.stderr)
        return 0 if result.ok else 1
    try:
        arguments = json.loads(args.args) if args.args else {}
    except json.JSONDecodeError as exc:
        return fail(f"--args is not valid JSON: {exc}", 2)
    if not isinstance(arguments, dict):
        return fail("--args must be a JSON object", 2)
    try:
        ctx = _context(args)
    except (OSError, MediaError, ValueError) as exc:
        return fail(str(exc), 2)
    result = registry[args.name].invoke(arguments, ctx)
    out_dir = Path(args.out_dir) if args.out_dir else None
    records = _show(result.content, out_dir, quiet=args.json)
    if args.json:
        print(json.dumps({"is_error": result.is_error, "error_kind": result.error_kind,
                          "final_answer": result.final_answer, "content": records}, indent=2, ensure_ascii=False))
    return 1 if result.is_error else 0


def _show(parts: list[Any], out_dir: Path | None, *, quiet: bool) -> list[dict[str, Any]]:
    from relax_gym.transcript import MediaWriter

    writer: MediaWriter | None = None
    records: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            records.append({"type": "text", "text": part.text})
            if not quiet:
                print(part.text)
        elif isinstance(part, (ImagePart, AudioPart, VideoPart)):
            if writer is None:
                writer = MediaWriter(out_dir or Path(tempfile.mkdtemp(prefix="relax-tools-")))
            path = writer.folder / writer.save(part)
            records.append({"type": part.modality, "path": str(path)})
            if not quiet:
                size = f" {part.image.width}x{part.image.height}" if isinstance(part, ImagePart) else ""
                print(f"[{part.modality}{size} written to {path}]")
    return records


def _parse(args: argparse.Namespace) -> int:
    from relax_gym.tools import builtin_tools, get_parser

    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        parser = get_parser(args.parser)
    except ValueError as exc:
        return fail(str(exc), 2)
    action = parser.parse(text, tools=builtin_tools().specs())
    print(json.dumps({
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in action.tool_calls],
        "parse_errors": action.parse_errors,
    }, indent=2, ensure_ascii=False))
    return 1 if action.parse_errors else 0


def _sandbox() -> int:
    from relax_gym.tools import SandboxError, default_pool

    try:
        caps = default_pool().capabilities
    except SandboxError as exc:
        return fail(str(exc))
    labels = {
        "network": "network namespace (no network)",
        "filesystem": "mount namespace (read-only filesystem, private /tmp)",
        "pid": "PID namespace (all processes die with the call)",
        "uid": "per-call uid (cannot signal or read other calls)",
        "seccomp": "seccomp filter (no user or other namespaces, no SysV IPC or memfd)",
    }
    for key, label in labels.items():
        print(f"  [{'yes' if caps.get(key) else ' no'}] {label}")
    print("  [yes] rlimits: CPU time, address space (per process and in all), processes, open files, file size;")
    print("        wall-clock kill")
    return 0
