"""Attacks on the model-text boundary: what a policy writes reaches every env's ``step``, the
tool-call parsers and the reward parsers. A policy under RL pressure finds whatever is slow or
raises, so each of them must run in linear time and never raise:

* a flood of ``\\boxed{`` (1.4M characters), boxes nested 200k deep, escaped braces, an
  unclosed last box, 10k-digit numbers, NUL bytes, lone surrogates, Unicode digits;
* tool calls with invalid JSON, JSON nested 10k deep (in the arguments and in the name),
  10k-digit numbers, 100k unterminated tags, 100k ``<think>`` openers, 20k calls in one reply;
* ``Action(text=None)``, bytes and wrong types.

Time is measured as CPU time of this process (``time.process_time``), so other jobs on a loaded
machine do not make the bounds flaky; linear time is shown by comparing n and 4n.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

import relax_gym
from relax_gym import Action, ToolCall
from relax_gym.envs import SHIPPED
from relax_gym.rewards import RewardInput, evaluate_reward, extract_answer, find_boxed, math_equal
from relax_gym.rewards.judge_templates import parse_correctness, parse_score_0_10
from relax_gym.rewards.math_extract import strip_math_delimiters
from relax_gym.rewards.math_normalize import normalize
from relax_gym.tools import get_parser, list_parsers
from relax_gym.types import ToolSpec

# the matcher's module is imported inside the tests that need it, so that every test here runs
# (and fails) against the code before the fix, which had no relax_gym.answers

BIG = 1_400_000  # the size of the reply that hung the old matcher
MID = 140_000  # per-env attacks: the old quadratic matcher needed minutes for this


def cpu_seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    """CPU of this thread only, with the collector off: in a full test run other threads (engines,
    pools) and collections walking earlier tests' objects landed in process_time and broke the
    linearity ratio; the checked code is single-threaded pure Python."""
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        out = fn()
        return time.thread_time() - start, out
    finally:
        gc.enable()


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": {name}, "arguments": {arguments}}}</tool_call>'


ENV_ATTACKS: dict[str, Any] = {
    "box_flood": "\\boxed{" * (MID // 7),
    "box_nesting_closed": "\\boxed{" * (MID // 8) + "x" + "}" * (MID // 8),
    "brace_flood": "\\boxed{" + "{" * MID,
    "escaped_braces": "\\boxed{" + "\\{" * (MID // 2) + "}",
    "digits_10k_boxed": "\\boxed{" + "9" * 10_000 + "}",
    "digits_10k_bare": "9" * 10_000,
    "digits_past_int_limit": "\\boxed{" + "9" * 4301 + "}",
    "nul_bytes": "\\boxed{1\x00}\x00<tool_call>\x00</tool_call>",
    "lone_surrogates": "\\boxed{\ud800}\udfff",
    "unicode_digits": "\\boxed{\u00b2\u00b2\u00b2\u00b2}",
    "invalid_json": "<tool_call>{not json</tool_call>",
    "deep_json_arguments": _call('"submit_answer"', "[" * 10_000 + "]" * 10_000),
    "deep_json_name": _call("{" * 10_000, "{}"),
    "bigint_json": _call('"submit_answer"', '{"answer": ' + "9" * 10_000 + "}"),
    "bigint_answer_string": _call('"submit_answer"', '{"answer": "' + "9" * 10_000 + '"}'),
    "inf_tool_argument": _call('"search_products"', '{"max_price": 1e999}'),
    "huge_tool_argument": _call('"zoom"', '{"image_id": "chart", "bbox": [' + "9" * 4000 + ", 0, 1, 1]}"),
    "unterminated_tags": "<tool_call>" * 20_000,
    "think_flood": "<think>" * 20_000 + "\\boxed{x}",
    "function_flood": "<tool_call><function=" * 5_000,
    "none": None,
    "bytes": b"\xff\\boxed{x}",
}


# Two envs run by default (tool calls, and an image env's text answer); the other shipped envs
# (about 15 s each: audio, multi-turn tools, games...) run in the slow step.
_DEFAULT_ADVERSARIAL = {"relax/CalcArithmetic-v0", "relax/SceneQuery-v0"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("env_id", [e.id if e.id in _DEFAULT_ADVERSARIAL else pytest.param(e.id, marks=pytest.mark.slow)
                                    for e in SHIPPED])
def test_every_shipped_env_survives_adversarial_actions(env_id: str) -> None:
    """step() never raises on hostile text and each step stays well under a second of CPU."""
    env = relax_gym.make(env_id)
    try:
        for name, action in ENV_ATTACKS.items():
            env.reset(seed=0)
            spent, (obs, reward, terminated, truncated, info) = cpu_seconds(lambda a=action: env.step(a))
            assert spent < 3.0, (name, spent)
            assert isinstance(obs, relax_gym.Observation) and isinstance(info["success"], bool), name
            assert not info["success"], name
            assert reward == reward and abs(reward) <= 1.0, (name, reward)
            for msg in obs.messages:  # the next observation must be encodable for a tokenizer
                msg.text.encode("utf-8")
                assert "failed: " not in msg.text, (name, msg.text[:300])  # a tool's own crash
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("env_id", [e.id for e in SHIPPED])
def test_every_shipped_env_takes_a_1_4m_char_reply(env_id: str) -> None:
    env = relax_gym.make(env_id)
    try:
        for action in ("\\boxed{" * (BIG // 7), "\\boxed{" * (BIG // 8) + "}" * (BIG // 8), "<think>" * (BIG // 7)):
            env.reset(seed=0)
            spent, _ = cpu_seconds(lambda a=action: env.step(a))
            assert spent < 5.0
    finally:
        env.close()


# -- the one \boxed matcher -----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_box_flood_of_1_4m_chars_is_linear() -> None:
    """The old last-\\boxed{} extraction re-scanned to the end for every opener: 56k characters
    took 34 s and 1.4M hung."""
    from relax_gym.answers import last_boxed, scan_boxes

    spent, answer = cpu_seconds(lambda: last_boxed("\\boxed{" * (BIG // 7)))
    assert answer is None and spent < 5.0
    small, _ = cpu_seconds(lambda: [scan_boxes("\\boxed{" * (BIG // 28)) for _ in range(4)])
    large, _ = cpu_seconds(lambda: scan_boxes("\\boxed{" * (BIG // 7)))
    assert large < 2.5 * small + 0.2, (small, large)  # 4 x n costs about 4 x n's time, not 16 x


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * (BIG // 8) + "}" * (BIG // 8),
        "\\boxed{" + "{}" * (BIG // 2),
        "\\boxed{" + "\\{" * (BIG // 2),
        "\\boxed{1} " * (BIG // 10),
        "\\boxed 1 " * (BIG // 9),
    ],
    ids=["nesting", "brace_pairs", "escapes", "many_boxes", "space_form"],
)
def test_other_box_floods_are_linear(text: str) -> None:
    from relax_gym.answers import scan_boxes

    spent, _ = cpu_seconds(lambda: scan_boxes(text))
    assert spent < 5.0


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("\\boxed{a\\}b}", "a\\}b"),  # an escaped brace does not close the box
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{a\\{b}", "a\\{b"),  # ... nor open a group
        ("\\boxed{1} and then \\boxed{2", "1"),  # an unclosed box is passed over
        ("\\boxed{ \\boxed{3} and more", "3"),  # ... also one that encloses a complete box
        ("\\boxed{\\boxed{5}}", "5"),
        ("\\fbox{7}", "7"),
        ("\\\\boxed{7}", None),  # a line break, then the word "boxed"
        ("\\boxed{" * 50 + "x", None),
    ],
)
def test_box_rule(text: str, answer: str | None) -> None:
    from relax_gym.envs._answers import last_boxed

    assert last_boxed(text) == answer


@pytest.mark.parametrize(
    "text",
    ["x \\boxed{a\\}b}", "\\boxed{1} then \\boxed{2", "\\boxed{\\boxed{5}}", "\\fbox{7}", "so \\boxed{42}."],
)
def test_envs_and_rewards_read_the_same_box(text: str) -> None:
    """One matcher: an env and a reward never disagree on which box is the answer."""
    from relax_gym.answers import last_boxed
    from relax_gym.envs import _answers

    assert _answers.last_boxed is last_boxed
    expected = last_boxed(text)
    got, how = extract_answer(text, fallback="none")
    assert got == (expected or None)
    assert how == ("boxed" if expected else "none")
    env = relax_gym.make("relax/MorseDecode-v0")
    env.reset(seed=0)
    *_, info = env.step(text)
    assert info["answer"] == expected
    assert find_boxed(text) == last_boxed.__globals__["find_boxed"](text)


# -- integers -------------------------------------------------------------------------------------
def test_huge_integers_are_not_answers_and_never_raise() -> None:
    from relax_gym.answers import MAX_INT_DIGITS
    from relax_gym.envs._answers import parse_int

    assert parse_int("9" * 10_000) is None  # int() would raise past 4300 digits
    assert parse_int("9" * MAX_INT_DIGITS) == int("9" * MAX_INT_DIGITS)
    assert parse_int("1,024") == 1024 and parse_int(None) is None and parse_int("\u00b2") is None
    env = relax_gym.make("relax/ArithmeticWord-v0")
    env.reset(seed=0)
    _, reward, _, _, info = env.step("\\boxed{" + "9" * 10_000 + "}")
    assert reward == 0.0 and not info["well_formed"]


def test_mastermind_refuses_unicode_digits() -> None:
    """'²'.isdigit() is True but int('²') raises: the guess must be refused, not crash."""
    env = relax_gym.make("relax/Mastermind-v0")
    env.reset(seed=0)
    obs, *_ = env.step("\\boxed{" + "\u00b2" * env.unwrapped.level.pegs + "}")
    assert "This turn is used up" in obs.text


# -- JSON from model text -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" * 10_000 + "]" * 10_000, "nested deeper"),
        ('{"a": ' * 100 + "1" + "}" * 100, "nested deeper"),
        ("9" * 10_000, "digits"),
        ("{not json", "Expecting"),
    ],
)
def test_loads_json_raises_only_value_error(text: str, reason: str) -> None:
    from relax_gym.answers import loads_json

    with pytest.raises(ValueError, match=reason):
        loads_json(text)


def test_loads_json_cleans_lone_surrogates() -> None:
    from relax_gym.answers import loads_json

    value = loads_json('{"\\ud800k": ["\\udc00"]}')
    json.dumps(value, ensure_ascii=False).encode("utf-8")


# -- tool-call parsers ----------------------------------------------------------------------------
SPECS = [ToolSpec("f", "", {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "array"}, "z": {"type": "number"}}})]
PARSER_ATTACKS = {
    "unterminated_100k": "<tool_call>" * 100_000,
    "stray_close_100k": "</tool_call>" * 100_000,
    "think_100k": "<think>" * 100_000,
    "function_100k": "<tool_call><function=" * 100_000,
    "parameter_100k": "<tool_call><function=f>" + "<parameter=" * 100_000 + "</function></tool_call>",
    "deep_arguments": _call('"f"', "[" * 10_000 + "]" * 10_000),
    "deep_name": _call("{" * 10_000, "{}"),
    "deep_in_string": _call('"f"', '"' + "[" * 10_000 + '"'),
    "bigint": _call('"f"', '{"x": ' + "9" * 10_000 + "}"),
    "surrogates": _call('"f\\ud800"', '{"x": "\\udc00"}') + "\ud800",
    "nul": "<tool_call>\x00" + _call('"f\x00"', "{}") + "</tool_call>",
    "calls_in_one_block": "<tool_call>[" + ",".join(['{"name": "f", "arguments": {}}'] * 20_000) + "]</tool_call>",
    "blocks_20k": _call('"f"', "{}") * 20_000,
    "qwen_bigint": "<tool_call><function=f><parameter=x>" + "9" * 10_000 + "</parameter></function></tool_call>",
    "qwen_huge_float": "<tool_call><function=f><parameter=z>" + "9" * 10_000 + "</parameter></function></tool_call>",
    "qwen_deep": "<tool_call><function=f><parameter=y>" + "[" * 50_000 + "</parameter></function></tool_call>",
    "qwen_long_literal": "<tool_call><function=f><parameter=y>(" + "1," * 100_000 + ")</parameter></function></tool_call>",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parser", list_parsers())
@pytest.mark.parametrize("name", list(PARSER_ATTACKS))
def test_tool_call_parsers_are_linear_and_never_raise(parser: str, name: str) -> None:
    from relax_gym.tools.parsers import MAX_CALL_ATTEMPTS

    spent, action = cpu_seconds(lambda: get_parser(parser).parse(PARSER_ATTACKS[name], tools=SPECS))
    assert spent < 3.0, spent
    assert isinstance(action, Action)
    assert len(action.tool_calls) + len(action.parse_errors) <= MAX_CALL_ATTEMPTS + 1  # a flood of errors is one
    for call in action.tool_calls:  # what a sandbox, a tokenizer or a JSON writer will get
        call.arguments_json().encode("utf-8")
        call.name.encode("utf-8")
        assert call.arguments.get("z") not in (float("inf"), float("-inf"))
    for error in action.parse_errors:
        assert len(error) < 500 and "could not parse the output" not in error, error
        error.encode("utf-8")


def test_a_bad_call_does_not_take_the_good_ones_with_it() -> None:
    """A 10k-digit number once made json.loads raise ValueError (not JSONDecodeError), which
    turned the whole reply into one error; now only that call fails."""
    text = _call('"f"', '{"x": 1}') + _call('"f"', '{"x": ' + "9" * 10_000 + "}") + _call('"f"', "[" * 5000)
    action = get_parser("hermes").parse(text)
    assert [c.arguments for c in action.tool_calls] == [{"x": 1}]
    assert len(action.parse_errors) == 2
    assert "more than 4000 digits" in action.parse_errors[0] and "call_0_1" in action.parse_errors[0]


def test_openai_structured_calls_get_the_same_limits() -> None:
    from relax_gym.tools.parsers import MAX_CALL_ATTEMPTS

    deep: Any = []
    for _ in range(200):
        deep = [deep]
    message = {
        "content": [{"type": "text", "text": 5}, {"type": "text", "text": "ok\ud800"}],
        "tool_calls": [{"id": "x" * 10_000, "type": "function", "function": {"name": "f", "arguments": {"a": deep}}}]
        + [{"type": "function", "function": {"name": "f", "arguments": "{}"}}] * 1000,
    }
    action = get_parser("openai").parse(message)
    assert action.text == "ok\ufffd"  # one text part was not text; the other had a lone surrogate
    assert len(action.tool_calls) == MAX_CALL_ATTEMPTS - 1 and len(action.parse_errors) == 2
    assert "nested deeper" in action.parse_errors[0] and "ignored" in action.parse_errors[1]
    assert all(len(c.id) < 100 for c in action.tool_calls)


# -- Action ---------------------------------------------------------------------------------------
def test_action_normalises_what_clients_hand_over() -> None:
    assert Action(text=None).text == ""  # type: ignore[arg-type]  # an OpenAI reply that only calls tools
    assert Action.coerce(None) == Action()
    assert Action(b"\xff1").text == "\ufffd1"  # type: ignore[arg-type]
    assert Action("a\ud800b").text == "a\ufffdb"
    assert Action("x", None, None).tool_calls == []  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Action.text must be str"):
        Action(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Action.tool_calls must hold ToolCall"):
        Action("x", [{"name": "f"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="ToolCall.name must be str"):
        ToolCall(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="relax_gym.Action or str"):
        Action.coerce(5)  # type: ignore[arg-type]


def test_step_with_none_is_an_empty_turn() -> None:
    env = relax_gym.make("relax/ArithmeticWord-v0")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(None)  # type: ignore[arg-type]
    assert terminated and reward == 0.0 and not info["success"]
    env.reset(seed=0)
    _, reward, *_ = env.step(Action(text=None))  # type: ignore[arg-type]
    assert reward == 0.0


# -- reward parsers -------------------------------------------------------------------------------
class _NoSympy:
    """A sympy pool that must not be reached."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a long model answer reached sympy")


@pytest.mark.timeout(120)
def test_reward_extraction_is_linear() -> None:
    for text in ("\\boxed{" * (BIG // 7), "$" * BIG, "\\boxed{" + "$" * (BIG // 2) + "}", "\\(" * (BIG // 2)):
        spent, _ = cpu_seconds(lambda t=text: extract_answer(t))
        assert spent < 5.0
    spent, out = cpu_seconds(lambda: strip_math_delimiters("$" * 1_000_000 + "x" + "$" * 1_000_000))
    assert out == "x" and spent < 5.0  # the old loop copied the string once per "$$": O(n^2)
    spent, _ = cpu_seconds(lambda: normalize("$" * BIG))  # math_equiv normalises the boxed answer
    assert spent < 5.0


def test_long_answers_never_reach_sympy() -> None:
    eq = math_equal("x+" * 3000 + "1", "1", pool=_NoSympy())  # type: ignore[arg-type]
    assert not eq.equal and eq.method != "sympy"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{" * (MID // 7),
        "\\boxed{" + "[" * 50_000 + "]" * 50_000 + "}",  # JSON nested past the recursion limit
        "\\boxed{[" + "9" * 400 + ", 0, 1, 1]}",  # a number too large for a float
        "\\boxed{" + "9" * 10_000 + "}",
        "answer: " + "9" * 10_000,
        "\\boxed{\ud800}\x00",
    ],
    ids=["box_flood", "deep_json", "float_overflow", "digits", "marker_digits", "surrogate_nul"],
)
def test_rule_rewards_survive(response: str) -> None:
    """No rule reward raises (a raise is recorded as an "exception" failure) or stalls."""
    for name in ("math_equiv", "format_boxed", "exact_match", "token_f1", "iou"):
        sample = RewardInput.from_text("q", response, label="[0, 0, 1, 1]")
        spent, res = cpu_seconds(lambda n=name, s=sample: evaluate_reward(n, s, call_timeout_s=30))
        assert spent < 5.0, (name, spent)
        assert not res.failed, (name, res.error)


def test_judge_verdicts_in_boxes_use_the_one_matcher() -> None:
    assert parse_correctness("so \\boxed{\\text{Correct}}") == 1.0
    assert parse_score_0_10("\\boxed{ 7 / 10 }") == 0.7
    spent, _ = cpu_seconds(lambda: pytest.raises(ValueError, parse_score_0_10, "\\boxed{" * 100_000))
    assert spent < 3.0


# -- the leaderboard agents read model text too ----------------------------------------------------
@pytest.mark.timeout(120)
def test_agent_thinking_split_is_linear() -> None:
    """split_thinking used a lazy <think>(.*?)</think> regex: 20k unclosed openers took a minute."""
    from relax_gym.leaderboards.agents.base import split_thinking

    spent, (answer, reasoning) = cpu_seconds(lambda: split_thinking("<think>" * 200_000))
    assert answer == "" and spent < 3.0
    assert split_thinking("<think>a</think>b<think>c</think>d") == ("bd", "a\nc")


def test_openai_agent_tool_arguments_never_raise() -> None:
    from relax_gym.leaderboards.agents.openai_agent import tool_calls_from_reply
    from relax_gym.protocol import ChatToolCall

    def call(arguments: str) -> ChatToolCall:
        return ChatToolCall.model_validate({"id": "a", "type": "function", "function": {"name": "f", "arguments": arguments}})

    calls, errors = tool_calls_from_reply([call('{"x": ' + "9" * 5000 + "}"), call("[" * 10_000), call('{"x": 1}')])
    assert [c.arguments for c in calls] == [{"x": 1}]
    assert "more than 4000 digits" in errors[0] and "nested deeper" in errors[1]
