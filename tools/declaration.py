"""Declaring tools: ``@tool`` turns a typed, docstringed function into a :class:`Tool`.

::

    @tool
    def zoom(image_id: str, bbox: tuple[int, int, int, int], ctx: ToolContext) -> ImagePart:
        '''Crop a region of an image in the conversation and enlarge it.

        Args:
            image_id: id of an image shown earlier (e.g. "img_1").
            bbox: (left, top, right, bottom) in pixels.
        '''
        ...

* The schema the model sees (``zoom.spec``, a :class:`~relax_gym.types.ToolSpec`) comes from
  the type hints; the description and per-argument text come from the docstring (Google,
  reST or NumPy style).
* A parameter annotated :class:`ToolContext` is filled in by the caller (the ToolEnv) and
  left out of the schema: it gives the tool the episode's env, its images and a scratch dict.
* ``zoom(...)`` still calls the plain function; ``zoom.invoke(arguments, ctx)`` (or
  ``await zoom.ainvoke(...)``) validates the model's arguments first and never raises: every
  failure becomes a :class:`ToolResult` with ``is_error=True`` and a message for the model.
* A tool may return text, JSON-serialisable data (dicts, lists, numbers, pydantic models,
  dataclasses), media (``ImagePart``/``AudioPart``/``VideoPart`` or a PIL image), a list
  mixing those, or a :class:`ToolResult` for full control.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import enum
import functools
import inspect
import json
import re
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_args, get_origin

import docstring_parser
import numpy as np
from PIL import Image
from pydantic import BaseModel, ValidationError

from relax_gym.types import (
    AudioPart,
    ContentPart,
    ImagePart,
    TextPart,
    ToolSpec,
    VideoPart,
)

from .schema import (
    _FIELD_PREFIX,
    build_arguments_model,
    format_validation_error,
    parameters_schema,
    resolve_hints,
)

T = TypeVar("T")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


class ToolError(Exception):
    """Raise inside a tool for an expected failure: the message goes to the model verbatim."""


class ToolArgumentError(ToolError):
    """The model's arguments did not match the tool's schema."""


# ------------------------------------------------------------------------------------------------
# context
# ------------------------------------------------------------------------------------------------
@dataclass
class ToolContext:
    """What a tool may know about the episode it runs in.

    * ``env`` -- the inner environment (unwrapped), e.g. for a document collection;
    * ``images`` -- every image of the conversation so far, by :attr:`ImagePart.id`;
    * ``scratch`` -- a dict that lives for one episode (e.g. a python session);
    * ``turn`` / ``call_id`` -- where this call sits in the episode.

    Calls of one episode share ``images``, ``scratch`` and the end-of-episode callbacks.
    """

    env: Any = None
    images: dict[str, ImagePart] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
    turn: int = 0
    call_id: str = ""
    _cleanups: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    def image(self, image_id: str) -> ImagePart:
        """The image with this id, or a ToolError listing the ids that exist."""
        part = self.images.get(image_id)
        if part is None:
            known = ", ".join(sorted(self.images)) or "none"
            raise ToolError(f"no image with id {image_id!r} in this conversation (image ids: {known})")
        return part

    def on_episode_end(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` when the episode ends or the env resets (e.g. close a session)."""
        self._cleanups.append(callback)

    def for_call(self, call_id: str, turn: int) -> ToolContext:
        """A view for one call that shares every per-episode container with this context."""
        return dataclasses.replace(self, call_id=call_id, turn=turn)

    def close(self) -> None:
        """Run the end-of-episode callbacks (each at most once; errors are swallowed)."""
        while self._cleanups:
            callback = self._cleanups.pop()
            try:
                callback()
            except Exception:
                pass


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------
@dataclass
class ToolResult:
    """The outcome of one call, as content parts for a ``role="tool"`` message.

    ``error_kind`` names the failure when ``is_error``: ``parse_error``, ``unknown_tool``,
    ``bad_arguments``, ``tool_error`` (the tool refused), ``exception`` (the tool crashed) or
    ``budget``. ``final_answer`` is set by the answer tools (``finish`` / ``submit_answer``);
    ``end_episode`` by ``finish``.
    """

    content: list[ContentPart] = field(default_factory=list)
    is_error: bool = False
    error_kind: str | None = None
    final_answer: str | None = None
    end_episode: bool = False

    @classmethod
    def error(cls, message: str, kind: str = "tool_error") -> ToolResult:
        return cls([TextPart(message)], is_error=True, error_kind=kind)

    @classmethod
    def from_value(cls, value: Any) -> ToolResult:
        if isinstance(value, ToolResult):
            return value
        return cls(to_content(value))

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


def to_content(value: Any) -> list[ContentPart]:
    """Normalise a tool's return value to content parts."""
    if value is None:
        return [TextPart("(no output)")]
    if isinstance(value, str):
        return [TextPart(value)]
    if isinstance(value, (TextPart, ImagePart, AudioPart, VideoPart)):
        return [value]
    if isinstance(value, Image.Image):
        return [ImagePart(value)]
    if isinstance(value, (list, tuple)) and any(_is_media(v) for v in value):
        parts: list[ContentPart] = []
        for item in value:
            parts.extend(to_content(item))
        return parts
    return [TextPart(_to_json(value))]


def _is_media(value: Any) -> bool:
    return isinstance(value, (ImagePart, AudioPart, VideoPart, TextPart, Image.Image))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if isinstance(obj, enum.Enum):
        return obj.value
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _to_json(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=_json_default, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ToolError(f"the tool returned a value that cannot be shown to the model ({exc})") from None


# ------------------------------------------------------------------------------------------------
# the Tool object
# ------------------------------------------------------------------------------------------------
def _is_context_annotation(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return len(args) == 1 and args[0] is ToolContext
    return False


_MODALITY_OF = {ImagePart: "image", AudioPart: "audio", VideoPart: "video", Image.Image: "image"}


def _modalities_of(annotation: Any) -> set[str]:
    """Media modalities a return annotation can produce (``list[ImagePart]`` -> image, ...)."""
    if annotation in _MODALITY_OF:
        return {_MODALITY_OF[annotation]}
    if isinstance(annotation, type) and issubclass(annotation, Image.Image):
        return {"image"}
    out: set[str] = set()
    for arg in get_args(annotation):
        out |= _modalities_of(arg)
    return out


class Tool:
    """A function the model may call, with its schema and argument validation."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        modalities: Iterable[str] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or fn.__name__
        if not _NAME_RE.match(self.name):
            raise ValueError(f"tool name {self.name!r} must match {_NAME_RE.pattern}")
        self.is_async = inspect.iscoroutinefunction(fn)
        hints = resolve_hints(fn)
        self.context_param = next((p for p, a in hints.items() if p != "return" and _is_context_annotation(a)), None)
        doc = docstring_parser.parse(inspect.getdoc(fn) or "")
        text = description or "\n\n".join(x for x in (doc.short_description, doc.long_description) if x)
        if not text:
            raise TypeError(f"tool {self.name}: write a docstring; it is the description the model reads")
        self.description = text.strip()
        param_docs = {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}
        skip = {self.context_param} if self.context_param else set()
        self.arguments_model, self.parameter_names = build_arguments_model(
            fn, skip=skip, descriptions=param_docs, hints=hints
        )
        self.spec = ToolSpec(self.name, self.description, parameters_schema(self.arguments_model))
        self.output_modalities: tuple[str, ...] = tuple(
            sorted(set(modalities) if modalities is not None else _modalities_of(hints.get("return")))
        )
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the plain function (no validation), as if it were not decorated."""
        return self.fn(*args, **kwargs)

    # -- validation ------------------------------------------------------------------------------
    def validate(self, arguments: Mapping[str, Any] | Any) -> dict[str, Any]:
        """Check and convert the model's arguments; raises :class:`ToolArgumentError`."""
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(
                f"invalid arguments for tool '{self.name}': expected a JSON object, got {type(arguments).__name__}"
            )
        try:
            parsed = self.arguments_model.model_validate(dict(arguments))
        except ValidationError as exc:
            raise ToolArgumentError(format_validation_error(self.name, exc, self.parameter_names)) from None
        return {name: getattr(parsed, _FIELD_PREFIX + name) for name in self.parameter_names}

    # -- invocation ------------------------------------------------------------------------------
    def _kwargs(self, arguments: Mapping[str, Any], ctx: ToolContext | None) -> dict[str, Any]:
        kwargs = self.validate(arguments)
        if self.context_param:
            kwargs[self.context_param] = ctx if ctx is not None else ToolContext()
        return kwargs

    async def ainvoke(self, arguments: Mapping[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        """Validate and run; sync functions run in a worker thread. Never raises for the
        tool's own failures."""
        try:
            kwargs = self._kwargs(arguments, ctx)
        except ToolArgumentError as exc:
            return ToolResult.error(str(exc), "bad_arguments")
        try:
            if self.is_async:
                value = await self.fn(**kwargs)
            else:
                value = await _in_daemon_thread(self.fn, kwargs, self.name)
            return ToolResult.from_value(value)
        except asyncio.CancelledError:
            raise
        except ToolError as exc:
            return ToolResult.error(str(exc), "tool_error")
        except Exception as exc:
            return ToolResult.error(f"tool '{self.name}' failed: {type(exc).__name__}: {exc}", "exception")

    def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext | None = None) -> ToolResult:
        """Synchronous :meth:`ainvoke` (sync tools run in this thread)."""
        if self.is_async:
            return run_sync(self.ainvoke(arguments, ctx))
        try:
            kwargs = self._kwargs(arguments, ctx)
        except ToolArgumentError as exc:
            return ToolResult.error(str(exc), "bad_arguments")
        try:
            return ToolResult.from_value(self.fn(**kwargs))
        except ToolError as exc:
            return ToolResult.error(str(exc), "tool_error")
        except Exception as exc:
            return ToolResult.error(f"tool '{self.name}' failed: {type(exc).__name__}: {exc}", "exception")


async def _in_daemon_thread(fn: Callable[..., Any], kwargs: dict[str, Any], name: str) -> Any:
    """Run a sync tool on a daemon thread of its own. Unlike ``asyncio.to_thread``, nothing
    waits for the thread when the loop shuts down, so a tool that overruns its timeout cannot
    hold up the step (or the interpreter's exit); it just finishes in the background."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            (future.set_result if ok else future.set_exception)(value)

    def target() -> None:
        try:
            outcome = (True, fn(**kwargs))
        except BaseException as exc:
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # the loop is gone: the caller stopped waiting long ago

    threading.Thread(target=target, name=f"tool-{name}", daemon=True).start()
    return await future


def run_sync(coro: Awaitable[T]) -> T:
    """Run a coroutine to completion from sync code, even when this thread runs an event loop
    (then a helper thread runs it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="relax-gym-run-sync")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@typing.overload
def tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    modalities: Iterable[str] | None = None,
) -> Tool: ...
@typing.overload
def tool(
    *, name: str | None = None, description: str | None = None, modalities: Iterable[str] | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    modalities: Iterable[str] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool: ``@tool`` or ``@tool(name="search_docs")``."""
    if fn is not None:
        return Tool(fn, name=name, description=description, modalities=modalities)
    return lambda f: Tool(f, name=name, description=description, modalities=modalities)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    return obj if isinstance(obj, Tool) else Tool(obj)


# ------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------
class ToolRegistry:
    """An ordered set of tools with unique names."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, obj: Tool | Callable[..., Any], *, replace: bool = False) -> Tool:
        t = as_tool(obj)
        existing = self._tools.get(t.name)
        if existing is not None and existing is not t and not replace:
            raise ValueError(f"two different tools are named {t.name!r}; rename one (@tool(name=...))")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        t = self._tools.get(name)
        if t is None:
            raise KeyError(self.unknown_tool_message(name))
        return t

    def unknown_tool_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._tools), n=1, cutoff=0.6)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        return f"unknown tool '{name}'.{hint} Available tools: {', '.join(self._tools) or 'none'}."

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def merged(self, others: Iterable[Tool | Callable[..., Any]]) -> ToolRegistry:
        out = ToolRegistry(self)
        for t in others:
            out.add(t)
        return out


__all__ = [
    "Tool",
    "ToolArgumentError",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "as_tool",
    "run_sync",
    "to_content",
    "tool",
]
