"""Rule rewards: exact / normalised / regex match, token F1, multiple choice, IoU, format tags,
boxed format, tool-call format, DAPO overlong shaping."""

from __future__ import annotations

import time

import pytest

import relax_gym.rewards as R
from relax_gym.rewards import RewardInput
from relax_gym.rewards.grounding import iou, parse_boxes
from relax_gym.rewards.shaping import dapo_overlong_penalty
from relax_gym.rewards.text import f1_tokens


def score(name: str, response: str, label=None, **kwargs):
    return R.evaluate_reward(name, RewardInput.from_text("q", response, label=label), **kwargs)


def total(name: str, response: str, label=None, **kwargs) -> float | None:
    res = score(name, response, label, **kwargs)
    assert not res.failed, res.error
    return res.total


# -- matching -------------------------------------------------------------------------------------
def test_exact_match() -> None:
    assert total("exact_match", " Paris \n", "Paris") == 1.0
    assert total("exact_match", "paris", "Paris") == 0.0
    assert total("exact_match", " Paris", " Paris", strip=False) == 1.0
    assert total("exact_match", "Lyon", ["Paris", "Lyon"]) == 1.0
    assert total("exact_match", r"so \boxed{Paris}", "Paris", extract="answer") == 1.0


def test_normalized_match() -> None:
    assert total("normalized_match", "The Eiffel  Tower!", "eiffel tower") == 1.0
    assert total("normalized_match", "Answer: the Louvre.", "Louvre") == 1.0
    assert total("normalized_match", "Answer: Orsay", "Louvre") == 0.0
    assert total("normalized_match", "blah\nblah", "Louvre") == 0.0  # no answer found


def test_regex_match_modes_and_bad_patterns() -> None:
    assert total("regex_match", "order #12345 shipped", r"#\d{5}\b") == 1.0
    assert total("regex_match", "order #12345 shipped", r"#\d{5}", mode="fullmatch") == 0.0
    assert total("regex_match", "YES", "yes", ignore_case=True) == 1.0
    assert total("regex_match", "anything", pattern=r"^any") == 1.0
    bad = score("regex_match", "x", "(unclosed")
    assert bad.failed and bad.errors["regex_match"].kind == "config"


def test_regex_match_catastrophic_pattern_times_out() -> None:
    pytest.importorskip("regex")
    start = time.perf_counter()
    res = score("regex_match", "a" * 36 + "b", r"^(a|aa)+$", timeout_s=0.2)
    assert time.perf_counter() - start < 3.0
    assert res.failed and res.errors["regex_match"].kind == "timeout"


def test_token_f1() -> None:
    assert f1_tokens("the cat sat", "cat sat down") == pytest.approx(2 * (1.0 * 2 / 3) / (1.0 + 2 / 3))
    assert f1_tokens("", "") == 1.0 and f1_tokens("x", "") == 0.0
    assert total("token_f1", "Answer: New York City", ["new york", "NYC"]) == pytest.approx(0.8)
    assert total("token_f1", "Answer: Boston", "new york") == 0.0


# -- multiple choice ------------------------------------------------------------------------------
CHOICES = ["red", "green", "blue", "yellow"]


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (r"\boxed{C}", "C", 1.0),
        ("The answer is (B).", "B", 1.0),
        ("Answer: b", "B", 1.0),
        ("C", "B", 0.0),
        ("I pick (D) because...\nlonger reasoning here\nmore", "D", 1.0),
        ("Answer: blue", "C", 1.0),  # option text
        ("Answer: blue", "blue", 1.0),  # label as option text
        ("Answer: green", "blue", 0.0),
        ("the answer is a triangle", "A", 0.0),  # the article "a" is not option A
        ("no idea\nreally", "A", 0.0),
    ],
)
def test_multiple_choice(response: str, label: str, expected: float) -> None:
    s = RewardInput.from_text("q", response, label=label, metadata={"choices": CHOICES})
    res = R.evaluate_reward("multiple_choice", s)
    assert not res.failed, res.error
    assert res.total == expected, res.details


def test_multiple_choice_bad_label_is_config_failure() -> None:
    s = RewardInput.from_text("q", "A", label="purple", metadata={"choices": CHOICES})
    res = R.evaluate_reward("multiple_choice", s)
    assert res.failed and res.errors["multiple_choice"].kind == "config"


# -- grounding ------------------------------------------------------------------------------------
def test_iou_geometry() -> None:
    assert iou((0, 0, 2, 2), (0, 0, 2, 2)) == 1.0
    assert iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
    assert iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0
    assert iou((2, 2, 0, 0), (0, 0, 2, 2)) == 0.0  # inverted box has no area


def test_parse_boxes_formats() -> None:
    assert parse_boxes('```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "cat"}]\n```') == [[1, 2, 3, 4]]
    assert parse_boxes('{"bbox_2d": [10.5, 20, 30, 40]}') == [[10.5, 20, 30, 40]]
    assert parse_boxes("the box is [1, 2, 3, 4] and (5, 6, 7, 8)") == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert parse_boxes("no box") == []


def test_iou_reward() -> None:
    assert total("iou", "[0, 0, 2, 2]", [1, 1, 3, 3]) == pytest.approx(1 / 7)
    assert total("iou", "[0, 0, 2, 2]", [1, 1, 3, 3], threshold=0.5) == 0.0
    assert total("iou", r"\boxed{[0, 0, 10, 10]}", [[0, 0, 10, 10]], threshold=0.5) == 1.0
    # two labelled boxes, one found: the missing one counts as 0
    assert total("iou", '[{"bbox_2d": [0, 0, 2, 2]}]', [[0, 0, 2, 2], [5, 5, 6, 6]]) == 0.5
    assert total("iou", "[0, 0, 2, 2]", [0, 0, 2, 2], box_format="xywh") == 1.0
    assert total("iou", "no idea", [0, 0, 1, 1]) == 0.0
    res = score("iou", "[0, 0, 1, 1]", "not a box")
    assert res.failed and res.errors["iou"].kind == "config"


# -- format ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>hmm</think><answer>4</answer>", 1.0),
        ("<think>hmm</think>\n<answer>4</answer>\n", 1.0),
        ("<answer>4</answer><think>hmm</think>", 0.0),  # wrong order
        ("<think>hmm<answer>4</answer></think>", 0.0),  # nested
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0),  # repeated
        ("<think>hmm<answer>4</answer>", 0.0),  # unclosed
        ("</think>hmm<think><answer>4</answer>", 0.0),  # closed before opened
        ("just 4", 0.0),
    ],
)
def test_format_tags(response: str, expected: float) -> None:
    assert total("format_tags", response) == expected


def test_format_tags_partial_and_custom() -> None:
    assert total("format_tags", "<think>x</think> 4", partial=True) == 0.5
    assert total("format_tags", "<plan>x</plan>", tags=["plan"]) == 1.0
    bad = score("format_tags", "x", tags="think")
    assert bad.failed and bad.errors["format_tags"].kind == "config"


def test_format_boxed() -> None:
    assert total("format_boxed", r"so \boxed{3}") == 1.0
    assert total("format_boxed", r"so \boxed{}") == 0.0
    assert total("format_boxed", "so 3") == 0.0


def test_tool_call_format_without_tools_package_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_tools(name, *args, **kwargs):
        if name.startswith("relax_gym.tools"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tools)
    res = score("tool_call_format", '<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert res.failed and res.errors["tool_call_format"].kind == "config"
    assert "relax_gym.tools.get_parser" in res.errors["tool_call_format"].message


GOOD_CALL = '<tool_call>{"name": "zoom", "arguments": {"x": 1}}</tool_call>'


@pytest.mark.parametrize(
    ("response", "kwargs", "expected"),
    [
        (GOOD_CALL, {}, 1.0),
        ("<think>let me zoom</think>" + GOOD_CALL, {}, 1.0),
        ('<tool_call>{"name": "zoom", "arguments": {"x": 1}</tool_call>', {}, 0.0),  # broken JSON
        ("<tool_call>" + GOOD_CALL[11:-12], {}, 0.0),  # unclosed
        ("no call at all", {}, 1.0),
        ("no call at all", {"require_call": True}, 0.0),
        (GOOD_CALL, {"allowed_tools": ["crop"]}, 0.0),
        (GOOD_CALL, {"allowed_tools": ["zoom", "crop"]}, 1.0),
    ],
)
def test_tool_call_format_with_hermes(response: str, kwargs: dict, expected: float) -> None:
    pytest.importorskip("relax_gym.tools.parsers", reason="the tools package has no parsers yet")
    res = score("tool_call_format", response, **kwargs)
    assert not res.failed, res.error
    assert res.total == expected, res.details


def test_tool_call_format_checks_every_assistant_turn() -> None:
    pytest.importorskip("relax_gym.tools.parsers", reason="the tools package has no parsers yet")
    from relax_gym.types import Message

    convo = [Message.user("zoom twice"), Message.assistant(GOOD_CALL), Message.tool("ok"),
             Message.assistant('<tool_call>{"arguments": {}}</tool_call>'), Message.tool("error"),
             Message.assistant("done")]
    s = RewardInput(prompt=convo[:1], response="done", messages=convo)
    res = R.evaluate_reward("tool_call_format", s)
    assert res.total == 0.0 and res.details["tool_call_format"]["calls"] == 1
    assert res.details["tool_call_format"]["errors"][0].startswith("turn 1:")


# -- length shaping -------------------------------------------------------------------------------
def test_dapo_overlong_penalty_shape() -> None:
    assert dapo_overlong_penalty(100, 1000, 200) == 0.0
    assert dapo_overlong_penalty(800, 1000, 200) == 0.0
    assert dapo_overlong_penalty(900, 1000, 200) == pytest.approx(-0.5)
    assert dapo_overlong_penalty(1000, 1000, 200) == pytest.approx(-1.0)
    assert dapo_overlong_penalty(1500, 1000, 200) == -1.0
    with pytest.raises(ValueError):
        dapo_overlong_penalty(1, 10, 0)


def test_dapo_overlong_reward() -> None:
    s = RewardInput.from_text("q", "x" * 10, num_response_tokens=950, finish_reason="length")
    res = R.evaluate_reward("dapo_overlong", s, max_length=1000, buffer=100)
    assert res.total == pytest.approx(-0.5) and res.details["dapo_overlong"]["truncated"] is True
    assert R.evaluate_reward("dapo_overlong", s, max_length=10, buffer=5, unit="chars").total == -1.0
    missing = R.evaluate_reward("dapo_overlong", RewardInput.from_text("q", "x"), max_length=10, buffer=5)
    assert missing.failed and missing.errors["dapo_overlong"].kind == "config"
