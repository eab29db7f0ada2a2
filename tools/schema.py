"""Type hints -> OpenAI function-parameter JSON schema, and argument validation.

Pydantic does the type work: each tool gets an argument model built from its signature, whose
JSON schema is then tidied into the form chat templates and OpenAI-compatible servers expect
(``$ref``s inlined, no ``title`` noise, fixed-length homogeneous tuples as ``items`` with
``minItems``/``maxItems``). The same model validates the model's arguments, so the schema the
model sees and the check its call must pass can never disagree.

Supported parameter types: ``str``, ``int``, ``float``, ``bool``, ``None``, ``Literal[...]``,
``enum.Enum`` subclasses, ``list[T]`` / ``Sequence[T]`` / ``set[T]``, ``tuple[T, ...]`` and
fixed tuples, ``dict[str, T]``, ``T | None`` / ``Optional[T]``, unions, ``Annotated[T, "doc"]``
or ``Annotated[T, Field(ge=..., description=...)]``, pydantic models, dataclasses and
TypedDicts.
"""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import pydantic
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

_FIELD_PREFIX = "a_"  # field names are prefixed so a parameter may be called `json` or `copy`


class ArgumentsModel(BaseModel):
    """Base of the per-tool argument models: unknown arguments are an error."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False, arbitrary_types_allowed=False)


def build_arguments_model(
    fn: Callable[..., Any],
    *,
    skip: set[str],
    descriptions: dict[str, str],
    hints: dict[str, Any],
) -> tuple[type[ArgumentsModel], list[str]]:
    """The pydantic model of ``fn``'s parameters (minus ``skip``) and their names in order."""
    sig = inspect.signature(fn)
    fields: dict[str, Any] = {}
    names: list[str] = []
    for name, param in sig.parameters.items():
        if name in skip:
            continue
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described to a model; name every parameter")
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} is positional-only; tools are called by keyword")
        if name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} needs a type annotation")
        annotation = hints[name]
        default = ... if param.default is inspect.Parameter.empty else param.default
        description = descriptions.get(name)
        annotation, extra_desc = _split_annotated_doc(annotation)
        field = Field(default=default, alias=name, description=description or extra_desc)
        fields[_FIELD_PREFIX + name] = (annotation, field)
        names.append(name)
    try:
        model = create_model(f"{fn.__name__}_arguments", __base__=ArgumentsModel, **fields)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError, NameError) as exc:
        raise TypeError(f"tool {fn.__name__}: unsupported parameter type: {exc}") from exc
    return model, names


def _split_annotated_doc(annotation: Any) -> tuple[Any, str | None]:
    """``Annotated[T, "text"]``: the plain string is a description; other metadata stays."""
    if get_origin(annotation) is not Annotated:
        return annotation, None
    base, *meta = get_args(annotation)
    docs = [m for m in meta if isinstance(m, str)]
    rest = [m for m in meta if not isinstance(m, str)]
    if rest:
        base = Annotated[(base, *rest)]
    return base, (docs[0] if docs else None)


def parameters_schema(model: type[ArgumentsModel]) -> dict[str, Any]:
    """The OpenAI ``parameters`` object for an arguments model."""
    raw = model.model_json_schema(by_alias=True)
    defs = raw.pop("$defs", {})
    schema = _clean(raw, defs, seen=())
    schema.setdefault("properties", {})
    schema["required"] = list(schema.get("required", []))
    schema.pop("additionalProperties", None)
    return {"type": "object", "properties": schema["properties"], "required": schema["required"]}


def _clean(node: Any, defs: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_clean(x, defs, seen) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:  # recursive type: leave an object placeholder rather than loop
            return {"type": "object"}
        target = copy.deepcopy(defs.get(name, {}))
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _clean(merged, defs, seen + (name,))
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {k: _clean(v, defs, seen) for k, v in value.items()}
        else:
            out[key] = _clean(value, defs, seen)
    # fixed-length tuples of one type read better as items + min/max
    prefix = out.get("prefixItems")
    if isinstance(prefix, list) and prefix and all(p == prefix[0] for p in prefix) and "items" not in out:
        out["items"] = prefix[0]
        del out["prefixItems"]
    # Optional[T] = None: pydantic gives anyOf [T, null]; simple types collapse to a type list
    any_of = out.get("anyOf")
    if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of:
        other = next(x for x in any_of if x != {"type": "null"})
        if set(other) == {"type"} and isinstance(other["type"], str):
            del out["anyOf"]
            out["type"] = [other["type"], "null"]
    return out


def format_validation_error(tool_name: str, exc: ValidationError, expected: list[str]) -> str:
    """One readable line per problem, in terms the model used (argument names, not fields)."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0].startswith(_FIELD_PREFIX):
            loc[0] = loc[0][len(_FIELD_PREFIX) :]
        where = ".".join(loc) or "(arguments)"
        kind = err.get("type", "")
        if kind == "missing" and len(loc) > 1:
            lines.append(f"argument '{loc[0]}': item {'.'.join(loc[1:])} is missing (too few items?)")
        elif kind == "missing":
            lines.append(f"missing required argument '{where}'")
        elif kind == "extra_forbidden":
            lines.append(f"unexpected argument '{where}' (this tool takes: {', '.join(expected) or 'no arguments'})")
        else:
            got = err.get("input")
            shown = repr(got)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            lines.append(f"argument '{where}': {err.get('msg', 'invalid')} (got {shown})")
    return f"invalid arguments for tool '{tool_name}': " + "; ".join(lines)


def resolve_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Type hints with ``Annotated`` kept; a clear error when an annotation cannot resolve."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(f"tool {fn.__name__}: cannot resolve a type annotation ({exc})") from exc


__all__ = [
    "ArgumentsModel",
    "FieldInfo",
    "build_arguments_model",
    "format_validation_error",
    "parameters_schema",
    "resolve_hints",
]
