"""Parsers on a corpus of well-formed and malformed outputs; ids, limits, rendering, fuzzing."""

from __future__ import annotations

import random
from typing import Any

import pytest
from relax_gym.tools import Tool, get_parser, list_parsers, strip_thinking, tool

from relax_gym.types import Action, ToolCall

from .parser_corpus import HERMES_CASES, QWEN3_CODER_CASES, Case


@tool
def get_weather(city: str, days: int = 1, unit: str = "celsius") -> str:
    """Weather forecast."""
    return city


@tool
def configure(verbose: bool, limit: int | None = None, options: dict[str, int] | None = None) -> str:
    """Configure."""
    return ""


@tool
def python(code: str) -> str:
    """Run code."""
    return code


@tool
def zoom(image_id: str, bbox: tuple[int, int, int, int], factor: float = 2.0) -> str:
    """Zoom."""
    return image_id


SPECS = [t.spec for t in (get_weather, configure, python, zoom)]


def check_case(parser_name: str, case: Case, **kwargs: Any) -> Action:
    _, text, want_calls, want_errors = case
    action = get_parser(parser_name).parse(text, turn=2, **kwargs)
    assert isinstance(action, Action)
    assert action.text == text  # the raw output is kept
    assert [(c.name, c.arguments) for c in action.tool_calls] == want_calls
    assert len(action.parse_errors) == len(want_errors), action.parse_errors
    for err, fragments in zip(action.parse_errors, want_errors):
        for fragment in fragments if isinstance(fragments, list) else [fragments]:
            assert fragment in err, (fragment, err)
    return action


@pytest.mark.parametrize("case", HERMES_CASES, ids=[c[0] for c in HERMES_CASES])
def test_hermes_corpus(case: Case) -> None:
    check_case("hermes", case)


@pytest.mark.parametrize("case", QWEN3_CODER_CASES, ids=[c[0] for c in QWEN3_CODER_CASES])
def test_qwen3_coder_corpus(case: Case) -> None:
    check_case("qwen3_coder", case, tools=SPECS)


def test_ids_are_deterministic_and_shared_by_calls_and_errors() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>{broken</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    parser = get_parser("hermes")
    result = parser.parse_detailed(text, turn=5)
    assert [getattr(i, "id", None) or i.call_id for i in result.items] == ["call_5_0", "call_5_1", "call_5_2"]
    action = parser.parse(text, turn=5)
    assert [c.id for c in action.tool_calls] == ["call_5_0", "call_5_2"]
    assert action.parse_errors[0].startswith("call_5_1: malformed JSON")
    assert parser.parse(text, turn=5) == action  # same input, same action


def test_too_many_calls() -> None:
    text = "".join(f'<tool_call>{{"name": "t{i}", "arguments": {{}}}}</tool_call>' for i in range(4))
    action = get_parser("hermes").parse(text, max_calls=2)
    assert [c.name for c in action.tool_calls] == ["t0", "t1"]
    assert len(action.parse_errors) == 2
    assert action.parse_errors[0] == "call_0_2: too many tool calls in one turn: at most 2 allowed; call #3 was not run"


def test_strip_thinking() -> None:
    assert strip_thinking("<think>a</think>b<think>c</think>d") == "bd"
    assert strip_thinking("reasoning</think>answer") == "answer"
    assert strip_thinking("answer<think>unfinished") == "answer"
    assert strip_thinking("plain") == "plain"


# ------------------------------------------------------------------------------------------------
# openai
# ------------------------------------------------------------------------------------------------
def _oa_call(name: str, args: Any, cid: str | None = "call_abc") -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        call["id"] = cid
    return call


def test_openai_message_and_completion() -> None:
    parser = get_parser("openai")
    message = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [_oa_call("get_weather", '{"city": "Oslo"}'), _oa_call("zoom", {"image_id": "x", "bbox": [0, 0, 1, 1]}, None)],
    }
    action = parser.parse(message, turn=3)
    assert action.text == "Let me check."
    assert action.tool_calls == [
        ToolCall("get_weather", {"city": "Oslo"}, "call_abc"),  # the server's id is kept
        ToolCall("zoom", {"image_id": "x", "bbox": [0, 0, 1, 1]}, "call_3_1"),
    ]
    completion = {"id": "cmpl", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    assert parser.parse(completion, turn=3) == action


def test_openai_sdk_like_object_and_legacy_function_call() -> None:
    class Msg:
        def model_dump(self) -> dict[str, Any]:
            return {"content": None, "function_call": {"name": "finish", "arguments": "{}"}}

    action = get_parser("openai").parse(Msg())
    assert action.text == "" and action.tool_calls == [ToolCall("finish", {}, "call_0_0")]


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"tool_calls": [_oa_call("a", "{not json")]}, 'the "arguments" string is not valid JSON'),
        ({"tool_calls": [_oa_call("a", "[1]")]}, '"arguments" must be a JSON object'),
        ({"tool_calls": [{"id": "x", "type": "function"}]}, 'needs a "function" object'),
        ({"tool_calls": [_oa_call("", "{}")]}, '"name" must be a non-empty string'),
        ({"tool_calls": "nope"}, '"tool_calls" must be a list'),
        ({"choices": []}, "has no choices"),
        (12, "expected an assistant message"),
    ],
)
def test_openai_malformed(message: Any, fragment: str) -> None:
    action = get_parser("openai").parse(message)
    assert action.tool_calls == []
    assert len(action.parse_errors) == 1 and fragment in action.parse_errors[0]


def test_openai_text_falls_back_to_hermes() -> None:
    text = '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
    assert get_parser("openai").parse(text).tool_calls == [ToolCall("a", {"x": 1}, "call_0_0")]
    from relax_gym.tools import OpenAIParser

    assert OpenAIParser(fallback=None).parse(text).tool_calls == []


# ------------------------------------------------------------------------------------------------
# registry, rendering, robustness
# ------------------------------------------------------------------------------------------------
def test_parser_registry() -> None:
    assert {"hermes", "qwen3_coder", "openai"} <= set(list_parsers())
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'"):
        get_parser("nope")
    parser = get_parser("hermes")
    assert get_parser(parser) is parser


CALLS = [
    ToolCall("get_weather", {"city": "Zürich", "days": 2}, "call_1_0"),
    ToolCall("python", {"code": "print('<b>')\nx = {'a': [1, 2]}"}, "call_1_1"),
    ToolCall("configure", {"verbose": False, "limit": None, "options": {"k": 3}}, "call_1_2"),
]


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder"])
def test_render_round_trip(name: str) -> None:
    parser = get_parser(name)
    text = parser.render(CALLS, text="Calling tools.")
    action = parser.parse(text, turn=1, tools=SPECS)
    assert action.parse_errors == []
    assert action.tool_calls == CALLS


def test_openai_render_round_trip() -> None:
    parser = get_parser("openai")
    assert parser.parse(parser.render(CALLS, text="x"), turn=1).tool_calls == CALLS


FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<function=", "<function=a>", "</function>",
    "<parameter=", "<parameter=x>", "</parameter>", '{"name": "a"', ', "arguments": ', "{", "}", "[", "]",
    '"', "\\", "null", "1e999", "\x00", "🙃", "\n", " ", "NaN", '{"name": "calculator", "arguments": {"expression": "1"}}',
]


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "openai"])
def test_parsers_never_raise_on_random_output(name: str) -> None:
    parser = get_parser(name)
    rng = random.Random(1234)
    for _ in range(400):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 30)))
        action = parser.parse(text, turn=rng.randint(0, 9), max_calls=rng.choice([None, 1, 3]), tools=SPECS)
        assert isinstance(action, Action)
        assert all(isinstance(e, str) and e for e in action.parse_errors)
        assert all(isinstance(c.arguments, dict) for c in action.tool_calls)
    for junk in (None, 3.5, ["x"], {"content": 5}, b"bytes"):
        assert isinstance(parser.parse(junk), Action)


def test_tools_are_tools() -> None:
    assert all(isinstance(t, Tool) for t in (get_weather, configure, python, zoom))
