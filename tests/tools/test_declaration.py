"""@tool: schema generation for each supported type, validation, invocation, results, registry."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from typing import Annotated, Literal, Optional

import numpy as np
import pytest
from PIL import Image
from pydantic import BaseModel, Field
from relax_gym.tools import Tool, ToolContext, ToolError, ToolRegistry, ToolResult, tool
from typing_extensions import TypedDict

from relax_gym.types import AudioPart, ImagePart, TextPart, ToolSpec


def props(t: Tool) -> dict:
    return t.spec.parameters["properties"]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(BaseModel):
    x: int
    y: int = 0


class Box(TypedDict):
    w: int
    h: int


@dataclasses.dataclass
class Span:
    start: int
    end: int


# ------------------------------------------------------------------------------------------------
# schema per type
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}),
        (Color, {"type": "string", "enum": ["red", "blue"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list[str], {"type": "array", "items": {"type": "string"}}),
        (tuple[int, int, int, int], {"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 4}),
        (tuple[float, ...], {"type": "array", "items": {"type": "number"}}),
        (
            tuple[int, str],
            {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2},
        ),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045 - the spelling under test
        (int | None, {"type": ["integer", "null"]}),
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (Annotated[int, Field(ge=1, le=5)], {"type": "integer", "minimum": 1, "maximum": 5}),
        (Point, {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}}, "required": ["x"]}),
    ],
    ids=lambda v: getattr(v, "__name__", None) or str(v)[:40],
)
def test_schema_for_each_supported_type(annotation: object, expected: dict) -> None:
    def fn(value):  # type: ignore[no-untyped-def]
        """Do something."""

    fn.__annotations__ = {"value": annotation, "return": str}
    t = tool(fn)
    assert props(t)["value"] == expected
    assert t.spec.parameters["required"] == ["value"]
    json.dumps(t.spec.to_openai())  # serialisable


def test_typed_dict_and_dataclass_parameters() -> None:
    @tool
    def measure(box: Box, span: Span) -> str:
        """Measure things."""
        return f"{box['w'] * box['h']} {span.end - span.start}"

    p = props(measure)
    assert p["box"]["type"] == "object" and p["box"]["required"] == ["w", "h"]
    assert p["span"]["properties"] == {"start": {"type": "integer"}, "end": {"type": "integer"}}
    assert "$ref" not in json.dumps(measure.spec.parameters) and "title" not in json.dumps(measure.spec.parameters)
    result = measure.invoke({"box": {"w": 2, "h": 3}, "span": {"start": 1, "end": 5}})
    assert result.text == "6 4"


def test_descriptions_defaults_and_required_from_docstring() -> None:
    @tool
    def book(city: str, nights: int = 1, *, smoking: bool = False) -> str:
        """Book a hotel room.

        Prefer central hotels.

        Args:
            city: Where to stay,
                e.g. "Paris".
            nights: How many nights.
            smoking: Whether smoking is allowed.
        """
        return city

    assert book.spec.name == "book"
    assert book.spec.description == "Book a hotel room.\n\nPrefer central hotels."
    p = props(book)
    assert p["city"] == {"type": "string", "description": 'Where to stay, e.g. "Paris".'}
    assert p["nights"] == {"type": "integer", "default": 1, "description": "How many nights."}
    assert p["smoking"]["default"] is False
    assert book.spec.parameters["required"] == ["city"]


def test_rest_and_numpy_docstrings() -> None:
    @tool
    def a(x: int) -> int:
        """Square.

        :param x: the number
        """
        return x * x

    @tool
    def b(x: int) -> int:
        """Cube.

        Parameters
        ----------
        x : int
            the number to cube
        """
        return x**3

    assert props(a)["x"]["description"] == "the number"
    assert props(b)["x"]["description"] == "the number to cube"


def test_annotated_string_is_a_description() -> None:
    @tool
    def f(q: Annotated[str, "what to look for"]) -> str:
        """Find."""
        return q

    assert props(f)["q"] == {"type": "string", "description": "what to look for"}


def test_context_parameter_is_excluded_and_injected() -> None:
    seen: list[ToolContext] = []

    @tool
    def peek(name: str, ctx: ToolContext) -> str:
        """Peek at the scratch dict."""
        seen.append(ctx)
        return str(ctx.scratch.get(name))

    assert list(props(peek)) == ["name"]
    assert peek.context_param == "ctx"
    ctx = ToolContext(scratch={"k": 7})
    assert peek.invoke({"name": "k"}, ctx).text == "7"
    assert seen[-1] is ctx
    assert peek.invoke({"name": "k"}).text == "None"  # a fresh context when none is given


def test_name_override_and_plain_call() -> None:
    @tool(name="add_numbers", description="Add two numbers.")
    def add(a: int, b: int) -> int:
        return a + b

    assert add.spec.name == "add_numbers" and add.spec.description == "Add two numbers."
    assert add(2, 3) == 5  # still a function
    assert isinstance(add.spec, ToolSpec)


def test_missing_docstring_or_annotation_or_varargs() -> None:
    def no_doc(x: int) -> int:
        return x

    def no_ann(x) -> int:  # type: ignore[no-untyped-def]
        """Doc."""
        return x

    def varargs(*xs: int) -> int:
        """Doc."""
        return 0

    with pytest.raises(TypeError, match="docstring"):
        tool(no_doc)
    with pytest.raises(TypeError, match="annotation"):
        tool(no_ann)
    with pytest.raises(TypeError, match="args"):
        tool(varargs)
    with pytest.raises(ValueError, match="name"):
        tool(name="has space", description="Doc.")(lambda: None)
    with pytest.raises(ValueError, match="name"):
        tool(lambda: None)  # '<lambda>' is no tool name


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
@tool
def place(label: str, bbox: tuple[int, int, int, int], color: Color = Color.RED, scale: float = 1.0) -> str:
    """Place a labelled box."""
    return f"{label}:{list(bbox)}:{color.value}:{scale}"


def test_valid_arguments_are_converted() -> None:
    assert place.validate({"label": "a", "bbox": [1, 2, 3, 4], "color": "blue", "scale": 2}) == {
        "label": "a",
        "bbox": (1, 2, 3, 4),
        "color": Color.BLUE,
        "scale": 2.0,
    }
    assert place.invoke({"label": "a", "bbox": [1, 2, 3, 4]}).text == "a:[1, 2, 3, 4]:red:1.0"


@pytest.mark.parametrize(
    ("arguments", "fragments"),
    [
        ({"bbox": [1, 2, 3, 4]}, ["missing required argument 'label'"]),
        ({"label": "a", "bbox": [1, 2, 3]}, ["bbox", "item 3 is missing"]),
        ({"label": "a", "bbox": [1, 2, 3, 4], "colour": "red"}, ["unexpected argument 'colour'", "label, bbox, color, scale"]),
        ({"label": "a", "bbox": [1, 2, 3, 4], "color": "green"}, ["argument 'color'", "'red' or 'blue'", "got 'green'"]),
        ({"label": 5, "bbox": "nope"}, ["argument 'label'", "valid string", "argument 'bbox'"]),
    ],
)
def test_bad_arguments_are_reported_not_raised(arguments: dict, fragments: list[str]) -> None:
    result = place.invoke(arguments)
    assert result.is_error and result.error_kind == "bad_arguments"
    assert result.text.startswith("invalid arguments for tool 'place'")
    for fragment in fragments:
        assert fragment in result.text, (fragment, result.text)


def test_non_object_arguments() -> None:
    result = place.invoke([1, 2])  # type: ignore[arg-type]
    assert result.is_error and "expected a JSON object" in result.text


def test_parameter_named_like_a_pydantic_attribute() -> None:
    @tool
    def fmt(json: str, copy: bool = False) -> str:
        """Echo."""
        return json + str(copy)

    assert fmt.invoke({"json": "x", "copy": True}).text == "xTrue"


# ------------------------------------------------------------------------------------------------
# invocation and results
# ------------------------------------------------------------------------------------------------
def test_tool_errors_and_exceptions_become_results() -> None:
    @tool
    def fragile(mode: str) -> str:
        """Fail on purpose."""
        if mode == "refuse":
            raise ToolError("I refuse.")
        raise RuntimeError("boom")

    refused = fragile.invoke({"mode": "refuse"})
    assert refused.is_error and refused.error_kind == "tool_error" and refused.text == "I refuse."
    crashed = fragile.invoke({"mode": "crash"})
    assert crashed.is_error and crashed.error_kind == "exception"
    assert crashed.text == "tool 'fragile' failed: RuntimeError: boom"


async def test_async_tool_both_ways() -> None:
    @tool
    async def slow_double(x: int) -> int:
        """Double slowly."""
        await asyncio.sleep(0.001)
        return 2 * x

    assert slow_double.is_async
    assert (await slow_double.ainvoke({"x": 4})).text == "8"
    # invoke from inside a running loop works too (a helper thread runs the coroutine)
    assert slow_double.invoke({"x": 5}).text == "10"


def test_sync_invoke_of_async_tool_without_loop() -> None:
    @tool
    async def triple(x: int) -> int:
        """Triple."""
        return 3 * x

    assert triple.invoke({"x": 2}).text == "6"


def test_results_normalise_every_supported_return() -> None:
    img = Image.new("RGB", (4, 3), "red")
    wave = np.zeros(160, dtype=np.float32)

    @tool
    def anything(kind: str) -> object:
        """Return something."""
        return {
            "text": "hello",
            "dict": {"a": 1, "b": [1.5, None]},
            "number": 3.25,
            "none": None,
            "model": Point(x=1),
            "dataclass": Span(1, 2),
            "numpy": np.arange(3),
            "pil": img,
            "mixed": ["look:", img, AudioPart(wave, 16000), {"n": 1}],
            "result": ToolResult([TextPart("custom")], final_answer="42"),
        }[kind]

    def content(kind: str) -> list:
        r = anything.invoke({"kind": kind})
        assert not r.is_error, r.text
        return r.content

    assert content("text") == [TextPart("hello")]
    assert json.loads(content("dict")[0].text) == {"a": 1, "b": [1.5, None]}
    assert content("number") == [TextPart("3.25")]
    assert content("none") == [TextPart("(no output)")]
    assert json.loads(content("model")[0].text) == {"x": 1, "y": 0}
    assert json.loads(content("dataclass")[0].text) == {"start": 1, "end": 2}
    assert json.loads(content("numpy")[0].text) == [0, 1, 2]
    (pil,) = content("pil")
    assert isinstance(pil, ImagePart) and pil.image.size == (4, 3)
    mixed = content("mixed")
    assert [type(p).__name__ for p in mixed] == ["TextPart", "ImagePart", "AudioPart", "TextPart"]
    assert anything.invoke({"kind": "result"}).final_answer == "42"


def test_unserialisable_result_is_an_error() -> None:
    @tool
    def odd() -> object:
        """Return an object the model cannot read."""
        return object()

    r = odd.invoke({})
    assert r.is_error and "cannot be shown to the model" in r.text


def test_output_modalities_from_return_annotation() -> None:
    @tool
    def pic() -> ImagePart:
        """A picture."""
        return ImagePart(Image.new("RGB", (1, 1)))

    @tool
    def pics() -> list[ImagePart | AudioPart]:
        """Pictures and sounds."""
        return []

    @tool
    def words() -> str:
        """Words."""
        return ""

    assert pic.output_modalities == ("image",)
    assert pics.output_modalities == ("audio", "image")
    assert words.output_modalities == ()


# ------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------
def test_registry() -> None:
    def helper(x: int) -> int:
        """A plain function becomes a tool when registered."""
        return x

    reg = ToolRegistry([place, helper])
    assert reg.names() == ["place", "helper"]
    assert "helper" in reg and len(reg) == 2
    assert [s.name for s in reg.specs()] == ["place", "helper"]
    assert "Did you mean 'place'?" in reg.unknown_tool_message("plase")
    with pytest.raises(KeyError, match="unknown tool 'nope'"):
        reg["nope"]
    reg.add(place)  # the same object again is fine
    with pytest.raises(ValueError, match="two different tools"):
        reg.add(tool(name="place", description="Other.")(lambda: 1))
