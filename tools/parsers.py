"""Tool-call parsers: model output -> :class:`~relax_gym.types.Action`, selected by name.

* ``hermes`` (default; Qwen2.5, Qwen3, Qwen3-VL): ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` blocks; ``arguments`` may be an object or a JSON string (``parameters``
  is accepted as a synonym, and one block may hold a JSON list of calls).
* ``qwen3_coder``: ``<tool_call><function=NAME><parameter=P>value</parameter></function>
  </tool_call>``; values are converted with the tool's schema when the parser is given the
  tool specs (otherwise JSON where it parses, text where it does not).
* ``openai``: structured ``tool_calls`` from an OpenAI-compatible server (a message dict, a
  full chat-completion response, or an SDK object); plain text falls back to ``hermes``.

Rules shared by all of them:

* ``<think>...</think>`` is removed before parsing (also the form where the chat template
  opened the block and the output starts inside it); calls inside an unclosed ``<think>`` are
  ignored: the model was still thinking.
* Parsing never raises, and runs in time linear in the output's length: the output is model
  text, so it may be adversarial. Every problem -- malformed JSON, JSON nested deeper than
  :data:`~relax_gym.answers.MAX_JSON_DEPTH` levels or with a number of more than
  :data:`~relax_gym.answers.MAX_INT_DIGITS` digits, a missing name, arguments that are not an
  object, an unclosed or stray tag, too many calls -- becomes a :class:`ParseError` (a string
  in ``Action.parse_errors``) that ToolEnv turns into a tool-error message. At most
  :data:`MAX_CALL_ATTEMPTS` attempts are read from one output; one error stands for the rest.
* Every call attempt in a turn -- parsed or not -- gets the id ``call_{turn}_{i}`` in order,
  so episodes are deterministic and an error can answer the attempt it belongs to. The
  ``openai`` parser keeps the server's ids when it sends them.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from relax_gym.answers import loads_json
from relax_gym.types import Action, ToolCall, ToolSpec, clean_text

MAX_CALL_ATTEMPTS = 64  # per output: more would flood the next observation with error messages
MAX_NAME_CHARS = 80  # of a tool name quoted back in an error message
MAX_LITERAL_CHARS = 20_000  # the longest <parameter> value ast.literal_eval will try

# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParseError:
    """One failed call attempt (``call_id`` is the id the attempt would have had)."""

    message: str
    call_id: str | None = None

    def __str__(self) -> str:
        return f"{self.call_id}: {self.message}" if self.call_id else self.message


@dataclass
class ParseResult:
    """Calls and errors in the order the model wrote them."""

    text: str
    items: list[ToolCall | ParseError] = field(default_factory=list)
    ignored: int = 0  # attempts past MAX_CALL_ATTEMPTS that were not decoded at all

    @property
    def calls(self) -> list[ToolCall]:
        return [x for x in self.items if isinstance(x, ToolCall)]

    @property
    def errors(self) -> list[ParseError]:
        return [x for x in self.items if isinstance(x, ParseError)]

    def action(self) -> Action:
        return Action(text=self.text, tool_calls=self.calls, parse_errors=[str(e) for e in self.errors])


def call_id(turn: int, index: int) -> str:
    """The deterministic id of call attempt ``index`` in turn ``turn``."""
    return f"call_{turn}_{index}"


# ------------------------------------------------------------------------------------------------
# shared helpers
# ------------------------------------------------------------------------------------------------
_OPEN_THINK, _CLOSE_THINK = "<think>", "</think>"


def strip_thinking(text: str) -> str:
    """Remove reasoning: whole ``<think>`` blocks, a leading block the template opened (text
    up to the first ``</think>``), and an unclosed trailing ``<think>``. Linear time (``str.find``
    from left to right; a lazy ``<think>.*?</think>`` regex rescans to the end for every
    unclosed ``<think>``)."""
    if not isinstance(text, str):
        return ""
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(_OPEN_THINK, pos)
        end = text.find(_CLOSE_THINK, start + len(_OPEN_THINK)) if start >= 0 else -1
        if end < 0:  # no more whole blocks: the rest is handled below
            kept.append(text[pos:])
            break
        kept.append(text[pos:start])
        pos = end + len(_CLOSE_THINK)
    text = "".join(kept)
    if "</think>" in text:
        text = text.partition("</think>")[2]
    if "<think>" in text:
        text = text.partition("<think>")[0]
    return text


_TAG = re.compile(r"<tool_call>|</tool_call>")


def _scan_blocks(body: str) -> list[tuple[str | None, str | None]]:
    """``<tool_call>`` blocks in order, each as (content, None) or (None, error message)."""
    out: list[tuple[str | None, str | None]] = []
    open_at: int | None = None
    for m in _TAG.finditer(body):
        if m.group() == "<tool_call>":
            if open_at is not None:
                out.append((None, "unclosed <tool_call> tag: a new <tool_call> began before </tool_call>"))
            open_at = m.end()
        elif open_at is None:
            out.append((None, "stray </tool_call> without an opening <tool_call>"))
        else:
            out.append((body[open_at : m.start()], None))
            open_at = None
    if open_at is not None:
        snippet = body[open_at : open_at + 60].strip()
        out.append((None, f"unclosed <tool_call> tag: the output ended before </tool_call> (after {snippet!r})"))
    return out


BlockDecoder = Callable[[str, int, int], tuple[list[ToolCall | ParseError], int]]


def _parse_blocks(output: Any, turn: int, decode: BlockDecoder) -> ParseResult:
    """The ``<tool_call>`` blocks of a text output, each decoded by ``decode(content, first, room)``.

    ``first`` is the index of the block's first attempt (its id), ``room`` how many attempts
    may still be decoded; ``decode`` returns the attempts and how many more it skipped. Scan
    errors (stray or unclosed tags) become parse errors in place, and blocks past
    :data:`MAX_CALL_ATTEMPTS` are only counted.
    """
    if not isinstance(output, str):
        return ParseResult("", [ParseError(f"expected the model's text, got {type(output).__name__}")])
    items: list[ToolCall | ParseError] = []
    ignored = 0
    for content, error in _scan_blocks(strip_thinking(output)):
        if len(items) >= MAX_CALL_ATTEMPTS:  # cap_attempts reports the rest; stop decoding
            ignored += 1
        elif error is not None:
            items.append(ParseError(error, call_id(turn, len(items))))
        else:
            assert content is not None
            decoded, skipped = decode(content, len(items), MAX_CALL_ATTEMPTS - len(items))
            items.extend(decoded)
            ignored += skipped
    return ParseResult(output, items, ignored)


def _quote(name: str) -> str:
    """A model-chosen name for an error message: cut to :data:`MAX_NAME_CHARS` characters."""
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + "..."


def cap_attempts(items: list[ToolCall | ParseError], ignored: int = 0) -> list[ToolCall | ParseError]:
    """The first :data:`MAX_CALL_ATTEMPTS` attempts, and one error that counts the rest
    (``ignored``: attempts a parser already skipped without decoding them)."""
    if len(items) <= MAX_CALL_ATTEMPTS and not ignored:
        return items
    dropped = len(items) - MAX_CALL_ATTEMPTS + ignored
    return items[:MAX_CALL_ATTEMPTS] + [
        ParseError(f"{dropped} more tool-call attempts were ignored: at most {MAX_CALL_ATTEMPTS} are read from one reply")
    ]


def limit_calls(items: list[ToolCall | ParseError], max_calls: int | None) -> list[ToolCall | ParseError]:
    """Keep the first ``max_calls`` attempts; the rest become "too many calls" errors."""
    if max_calls is None or len(items) <= max_calls:
        return items
    out = items[:max_calls]
    for i, item in enumerate(items[max_calls:], start=max_calls):
        cid = item.id if isinstance(item, ToolCall) else item.call_id
        out.append(
            ParseError(
                f"too many tool calls in one turn: at most {max_calls} allowed; call #{i + 1} was not run",
                cid,
            )
        )
    return out


def _coerce_arguments(raw: Any) -> dict[str, Any] | str:
    """The ``arguments`` value as a dict, or an error message."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = loads_json(raw)
        except ValueError as exc:
            return f'the "arguments" string is not valid JSON: {_json_error(exc)}'
    if not isinstance(raw, dict):
        return f'"arguments" must be a JSON object, got {_json_type(raw)}'
    try:  # an object handed over as such (openai) gets the same limits as decoded text
        return loads_json(json.dumps(raw, ensure_ascii=False))  # type: ignore[no-any-return]
    except (ValueError, TypeError, RecursionError) as exc:
        return f'"arguments" is not usable JSON: {str(exc)[:200]}'



def _json_error(exc: ValueError) -> str:
    """One line for a JSON failure: where the syntax broke, or what limit was hit."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
    return str(exc)


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


def _call_from_object(obj: Any, cid: str) -> ToolCall | ParseError:
    if not isinstance(obj, dict):
        return ParseError(f'a tool call must be a JSON object like {{"name": ..., "arguments": {{...}}}}, got {_json_type(obj)}', cid)
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]  # OpenAI-shaped call written as text
    name = obj.get("name")
    if name is None:
        return ParseError('the tool call has no "name"', cid)
    if not isinstance(name, str) or not name.strip():
        return ParseError(f'"name" must be a non-empty string, got {_quote(json.dumps(name))}', cid)
    name = clean_text(name.strip())
    raw_args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    args = _coerce_arguments(raw_args)
    if isinstance(args, str):
        return ParseError(f"tool call '{_quote(name)}': {args}", cid)
    return ToolCall(name, args, cid)


# ------------------------------------------------------------------------------------------------
# parser interface and registry
# ------------------------------------------------------------------------------------------------
class ToolCallParser:
    """Turns one model output into calls and errors. Subclasses implement ``parse_detailed``."""

    name: ClassVar[str] = ""

    def parse(
        self,
        output: Any,
        *,
        turn: int = 0,
        max_calls: int | None = None,
        tools: Sequence[ToolSpec] | None = None,
    ) -> Action:
        """The :class:`Action` for ``output``; never raises."""
        return self.parse_detailed(output, turn=turn, max_calls=max_calls, tools=tools).action()

    def parse_detailed(
        self,
        output: Any,
        *,
        turn: int = 0,
        max_calls: int | None = None,
        tools: Sequence[ToolSpec] | None = None,
    ) -> ParseResult:
        """Calls and errors in order; never raises (an internal failure is a parse error)."""
        if isinstance(output, str):
            output = clean_text(output)
        text = output if isinstance(output, str) else ""
        try:
            result = self._parse(output, turn=turn, tools=tools)
        except Exception as exc:  # a parser bug must not end an episode
            reason = str(exc)[:200]
            return ParseResult(text, [ParseError(f"could not parse the output ({type(exc).__name__}: {reason})")])
        result.items = limit_calls(cap_attempts(result.items, result.ignored), max_calls)
        return result

    def _parse(self, output: Any, *, turn: int, tools: Sequence[ToolSpec] | None) -> ParseResult:
        raise NotImplementedError

    def render(self, calls: Sequence[ToolCall], text: str = "") -> Any:
        """The model output that parses back to ``calls`` (for oracles, SFT data and tests)."""
        raise NotImplementedError


_PARSERS: dict[str, type[ToolCallParser]] = {}


def register_parser(cls: type[ToolCallParser]) -> type[ToolCallParser]:
    """Class decorator: make a parser selectable by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a `name`")
    _PARSERS[cls.name] = cls
    return cls


def get_parser(name: str | ToolCallParser = "hermes") -> ToolCallParser:
    """A parser by name (``hermes``, ``qwen3_coder``, ``openai``) or the instance given."""
    if isinstance(name, ToolCallParser):
        return name
    cls = _PARSERS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool-call parser {name!r}; available: {', '.join(sorted(_PARSERS))}")
    return cls()


def list_parsers() -> list[str]:
    return sorted(_PARSERS)


# ------------------------------------------------------------------------------------------------
# hermes
# ------------------------------------------------------------------------------------------------
@register_parser
class HermesParser(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5/Qwen3/Qwen3-VL)."""

    name = "hermes"

    def _parse(self, output: Any, *, turn: int, tools: Sequence[ToolSpec] | None) -> ParseResult:
        return _parse_blocks(output, turn, lambda content, first, room: self._decode_block(content, turn, first, room))

    @staticmethod
    def _decode_block(content: str, turn: int, first: int, room: int) -> tuple[list[ToolCall | ParseError], int]:
        """One block's JSON: a call or a list of calls (the first ``room`` decoded, the rest counted)."""
        body = _strip_fence(content.strip())
        if not body:
            return [ParseError("empty <tool_call> block", call_id(turn, first))], 0
        try:
            obj = loads_json(body)
        except ValueError as exc:
            message = (
                f"malformed JSON in <tool_call>: {_json_error(exc)}; "
                'expected {"name": "<tool name>", "arguments": {...}}'
            )
            return [ParseError(message, call_id(turn, first))], 0
        calls = obj if isinstance(obj, list) and obj else [obj]
        decoded = [_call_from_object(one, call_id(turn, first + j)) for j, one in enumerate(calls[:room])]
        return decoded, max(0, len(calls) - room)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = [
            "<tool_call>\n" + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) + "\n</tool_call>"
            for c in calls
        ]
        return "\n".join(([text] if text else []) + blocks)


def _strip_fence(body: str) -> str:
    """Some models wrap the JSON in a Markdown code fence inside the tag."""
    if body.startswith("```") and body.endswith("```") and len(body) >= 6:
        inner = body[3:-3]
        first_newline = inner.find("\n")
        if first_newline >= 0 and inner[:first_newline].strip().isalpha():
            inner = inner[first_newline + 1 :]
        return inner.strip()
    return body


# ------------------------------------------------------------------------------------------------
# qwen3_coder (XML)
# ------------------------------------------------------------------------------------------------
# "<" is excluded from names so that a flood of "<function=" without ">" costs one pass, not one
# pass per opener
_FUNCTION_OPEN = re.compile(r"<function=([^<>\n]*)>")
_PARAM_OPEN = re.compile(r"<parameter=([^<>\n]*)>")


@register_parser
class Qwen3CoderParser(ToolCallParser):
    """``<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>``."""

    name = "qwen3_coder"

    def _parse(self, output: Any, *, turn: int, tools: Sequence[ToolSpec] | None) -> ParseResult:
        schemas = {t.name: t.parameters.get("properties", {}) for t in tools or ()}
        return _parse_blocks(
            output, turn, lambda content, first, room: ([self._parse_block(content, call_id(turn, first), schemas)], 0)
        )

    def _parse_block(self, content: str, cid: str, schemas: dict[str, dict[str, Any]]) -> ToolCall | ParseError:
        fm = _FUNCTION_OPEN.search(content)
        if fm is None:
            return ParseError("expected <function=NAME> inside <tool_call>", cid)
        name = _quote(fm.group(1).strip())
        if not name:
            return ParseError("empty function name in <function=...>", cid)
        end = content.find("</function>", fm.end())
        if end < 0:
            return ParseError(f"unclosed <function={name}> tag: missing </function>", cid)
        inner = content[fm.end() : end]
        props = schemas.get(name, {})
        args: dict[str, Any] = {}
        for pm in _PARAM_OPEN.finditer(inner):
            pname = _quote(pm.group(1).strip())
            close = inner.find("</parameter>", pm.end())
            next_open = inner.find("<parameter=", pm.end())
            if close < 0 or 0 <= next_open < close:
                return ParseError(f"tool call '{name}': unclosed <parameter={pname}> tag: missing </parameter>", cid)
            if not pname:
                return ParseError(f"tool call '{name}': empty parameter name in <parameter=...>", cid)
            if pname in args:
                return ParseError(f"tool call '{name}': parameter '{pname}' is given twice", cid)
            raw = inner[pm.end() : close]
            raw = raw.removeprefix("\n")
            raw = raw.removesuffix("\n")
            args[pname] = convert_parameter(raw, props.get(pname))
        return ToolCall(name, args, cid)

    def render(self, calls: Sequence[ToolCall], text: str = "") -> str:
        blocks = []
        for c in calls:
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
                for k, v in c.arguments.items()
            )
            blocks.append(f"<tool_call>\n<function={c.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(([text] if text else []) + blocks)


def _schema_types(schema: Mapping[str, Any] | None) -> set[str]:
    if not schema:
        return set()
    types: set[str] = set()
    t = schema.get("type")
    if isinstance(t, str):
        types.add(t)
    elif isinstance(t, list):
        types.update(x for x in t if isinstance(x, str))
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, []) or []:
            if isinstance(sub, Mapping):
                types |= _schema_types(sub)
    if not types and "enum" in schema:
        types |= {_json_type_name(v) for v in schema["enum"]}
    return types


def _json_type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "null" if value is None else "object"


def convert_parameter(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A ``<parameter>`` value (always text) converted to its schema type; unconvertible
    values stay text so that validation can say what was wrong."""
    types = _schema_types(schema)
    stripped = raw.strip()
    if "null" in types and stripped.lower() in ("null", "none"):
        return None
    if types == {"string"} or types == {"string", "null"}:
        return raw
    if "integer" in types:
        try:
            return int(stripped)  # past 4300 digits Python raises ValueError: the text stays
        except ValueError:
            pass
    if "number" in types:
        try:
            value = float(stripped)
            if math.isfinite(value):  # "9" * 400 is inf as a float: not a number a tool can use
                return int(value) if value.is_integer() and "." not in stripped and "e" not in stripped.lower() else value
        except ValueError:
            pass
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if types & {"object", "array"} or not types:
        try:
            return loads_json(stripped)
        except ValueError:
            if types and len(stripped) <= MAX_LITERAL_CHARS:
                try:
                    return _checked_literal(ast.literal_eval(stripped))
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    pass
    return raw


def _checked_literal(value: Any) -> Any:
    """A Python literal as JSON data (so a tuple, set or 5000-digit int cannot slip through)."""
    return loads_json(json.dumps(value))


# ------------------------------------------------------------------------------------------------
# openai (structured tool_calls)
# ------------------------------------------------------------------------------------------------
@register_parser
class OpenAIParser(ToolCallParser):
    """Structured ``tool_calls`` from an OpenAI-compatible server.

    Accepts an assistant message (``{"content": ..., "tool_calls": [...]}``), a whole chat
    completion (``{"choices": [{"message": ...}]}``) or an SDK object with ``model_dump()``.
    Plain text goes to the ``fallback`` parser (``hermes``; ``None`` for none).
    """

    name = "openai"

    def __init__(self, fallback: str | None = "hermes") -> None:
        self.fallback = get_parser(fallback) if fallback else None

    def _parse(self, output: Any, *, turn: int, tools: Sequence[ToolSpec] | None) -> ParseResult:
        if isinstance(output, str):
            if self.fallback is not None:
                return self.fallback._parse(output, turn=turn, tools=tools)
            return ParseResult(output, [])
        if hasattr(output, "model_dump"):
            output = output.model_dump()
        if not isinstance(output, Mapping):
            return ParseResult("", [ParseError(f"expected an assistant message or a chat completion, got {type(output).__name__}")])
        message: Any = output
        if "choices" in output:
            choices = output.get("choices")
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
                return ParseResult("", [ParseError("the chat completion has no choices")])
            message = choices[0].get("message") or {}
            if not isinstance(message, Mapping):
                return ParseResult("", [ParseError("choices[0].message is not an object")])
        text = _content_text(message.get("content"))
        raw_calls = message.get("tool_calls") or []
        if not raw_calls and isinstance(message.get("function_call"), Mapping):
            raw_calls = [{"type": "function", "function": message["function_call"]}]  # legacy form
        if not isinstance(raw_calls, list):
            return ParseResult(text, [ParseError('"tool_calls" must be a list')])
        items: list[ToolCall | ParseError] = []
        for raw in raw_calls[:MAX_CALL_ATTEMPTS]:  # cap_attempts reports the rest
            index = len(items)
            given_id = raw.get("id") if isinstance(raw, Mapping) else None
            usable = isinstance(given_id, str) and 0 < len(given_id) <= MAX_NAME_CHARS
            cid = clean_text(given_id) if usable else call_id(turn, index)
            if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
                items.append(ParseError('each tool call needs a "function" object with "name" and "arguments"', cid))
                continue
            items.append(_call_from_object(dict(raw["function"]), cid))
        return ParseResult(text, items, max(0, len(raw_calls) - MAX_CALL_ATTEMPTS))

    def render(self, calls: Sequence[ToolCall], text: str = "") -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
                for c in calls
            ],
        }


def _content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string or text parts); anything else is empty."""
    if isinstance(content, str):
        return clean_text(content)
    if isinstance(content, list):  # content parts
        return clean_text("".join(
            p["text"] for p in content if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ))
    return ""


__all__ = [
    "MAX_CALL_ATTEMPTS",
    "HermesParser",
    "OpenAIParser",
    "ParseError",
    "ParseResult",
    "Qwen3CoderParser",
    "ToolCallParser",
    "call_id",
    "cap_attempts",
    "convert_parameter",
    "get_parser",
    "limit_calls",
    "list_parsers",
    "register_parser",
    "strip_thinking",
]
