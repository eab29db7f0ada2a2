"""The tool-using envs as a family: the issue's counts, oracles that really call tools in
model-style text, the answer conventions, and a random agent that only makes well-formed moves."""

from __future__ import annotations

import numpy as np
import pytest
from relax_gym.envs import SHIPPED, shipped
from relax_gym.envs._tool_task import ToolTaskEnv, answer_text
from relax_gym.tools import HermesParser

import relax_gym
from relax_gym.types import Action, ToolCall

TOOL_ENVS = [e.id for e in shipped("tools")]
HERMES = HermesParser()


def call(name: str, **arguments: object) -> str:
    return HERMES.render([ToolCall(name, dict(arguments))])


def test_issue_counts_for_the_tool_envs() -> None:
    assert len(TOOL_ENVS) >= 5
    for env_id in TOOL_ENVS:
        env = relax_gym.make(env_id)
        assert "tools" in env.tags and "multi-turn" in env.tags
        assert isinstance(env.env, ToolTaskEnv)  # make() -> EpisodeGuard(ToolEnv(task))
    image_tools = [
        env_id for env_id in TOOL_ENVS
        if any("image" in t.output_modalities for t in relax_gym.make(env_id).env.registry)
    ]
    assert image_tools, "at least one env's tool must return an image"
    text_or_tools = [e for e in SHIPPED if e.modalities == ("text",) and (e.family in ("text", "tools"))]
    assert len(text_or_tools) >= 4
    assert "relax/tools-v0" in {s.name for s in relax_gym.list_suites()}
    assert set(relax_gym.make_suite("relax/tools-v0").env_ids) == set(TOOL_ENVS)


@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_oracle_calls_tools_in_model_text_then_answers(env_id: str) -> None:
    env = relax_gym.make(env_id, difficulty="medium")
    env.reset(seed=5)
    actions, info = [], {}
    for action in env.oracle():
        actions.append(action)
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    assert info["success"] and terminated and not truncated
    assert all(isinstance(a, str) and a.count("<tool_call>") >= 1 for a in actions)
    parsed = [HERMES.parse(a) for a in actions]
    assert all(not p.parse_errors for p in parsed)
    answer_tools = {"submit_answer", "finish"}
    assert {c.name for c in parsed[-1].tool_calls} <= answer_tools
    worked = [c.name for p in parsed[:-1] for c in p.tool_calls]
    assert worked and not set(worked) & answer_tools  # tools first, the answer last
    stats = info["tools"]
    assert stats["tool_errors"] == 0 and stats["parse_errors"] == 0 and stats["tool_calls"] == len(worked) + 1


@pytest.mark.parametrize("env_id", [i for i in TOOL_ENVS if i != "relax/ShopDB-v0"])
def test_answer_conventions(env_id: str) -> None:
    """submit_answer, a boxed reply and a bare short reply all reach the grader; thinking is
    ignored; prose without a box is malformed."""
    env = relax_gym.make(env_id, difficulty="easy")
    env.reset(seed=1)
    right = env.unwrapped.require_task().answer
    for reply in (call("submit_answer", answer=right), f"<think>hmm \\boxed{{0}}</think>So \\boxed{{{right}}}.", right):
        env.reset(seed=1)
        _, reward, terminated, _, info = env.step(reply)
        assert terminated and info["success"] and reward == 1.0, reply
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step("I think the answer is probably quite large, but I am not sure. " * 4)
    assert terminated and not info["success"] and not info["well_formed"] and reward == 0.0
    assert answer_text("<think>x</think> \\boxed{ 7 }") == "7" and answer_text("  ") is None


@pytest.mark.parametrize("env_id", TOOL_ENVS)
def test_random_agent_makes_only_well_formed_moves(env_id: str) -> None:
    """Every random turn is a known tool with valid arguments or an answer in the env's format."""
    env = relax_gym.make(env_id, difficulty="hard")
    rng = np.random.default_rng(0)
    answered = 0
    for seed in range(6):
        env.reset(seed=seed)
        for _ in range(env.max_turns):
            action = env.random_action(rng)
            assert isinstance(action, (str, Action))
            obs, _, terminated, truncated, info = env.step(action)
            assert info["tools"]["parse_errors"] == 0
            for msg in obs.messages:
                assert "unknown tool" not in msg.text and "invalid arguments" not in msg.text, msg.text
            if terminated or truncated:
                if terminated:
                    answered += 1
                    assert info.get("well_formed", True), action  # ShopDB grades state, not text
                break
    assert answered >= 4


def test_every_tool_env_offers_its_tools_on_the_first_observation() -> None:
    expected = {
        "relax/CalcArithmetic-v0": {"calculator", "submit_answer"},
        "relax/ShopDB-v0": {
            "search_products", "list_orders", "get_order", "view_cart", "update_cart", "place_order",
            "cancel_order", "refund_item", "finish",
        },
        "relax/PyPuzzle-v0": {"python", "submit_answer"},
        "relax/ChartZoom-v0": {"zoom", "calculator", "submit_answer"},
        "relax/DocSearch-v0": {"search", "submit_answer"},
    }
    for env_id, names in expected.items():
        obs, _ = relax_gym.make(env_id).reset(seed=0)
        assert {t.name for t in obs.tools} == names, env_id


def test_budget_and_turn_limit_agree_with_the_registry() -> None:
    for e in shipped("tools"):
        env = relax_gym.make(e.id)
        inner = env.env
        assert inner.max_tool_calls == type(inner).tool_budget
        assert e.max_turns == env.max_turns == 1 + inner.max_tool_calls + 1


@pytest.mark.parametrize("parser", ["qwen3_coder", "openai"])
def test_other_tool_call_formats(parser: str) -> None:
    """``parser=`` switches the format the env reads, and the oracle writes the same one."""
    env = relax_gym.make("relax/ShopDB-v0", difficulty="hard", parser=parser)
    env.reset(seed=2)
    info: dict[str, object] = {}
    for action in env.oracle():
        if parser == "qwen3_coder":
            assert isinstance(action, str) and "<function=" in action
        else:  # an OpenAI-style server returns structured calls, not text
            assert isinstance(action, Action) and action.tool_calls
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    assert info["success"] and info["tools"]["tool_errors"] == 0  # type: ignore[index]
    with pytest.raises(relax_gym.RelaxGymError, match="unknown tool-call parser"):
        relax_gym.make("relax/ShopDB-v0", parser="nope")
