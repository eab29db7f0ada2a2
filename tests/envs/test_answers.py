"""Answer parsing and grading of the one-turn envs, and the GridRules transformations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import relax_gym
from relax_gym.envs import SHIPPED, arithmetic, clock, dtmf, frame_order, grid_rules
from relax_gym.envs._answers import last_boxed, parse_int
from relax_gym.envs._base import FORMAT_REWARD

ONE_TURN = [e.id for e in SHIPPED if e.max_turns == 1 and e.id != "relax/SenseCount-v0"]


@pytest.mark.parametrize(
    ("text", "inner"),
    [
        ("so \\boxed{12}", "12"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{open", None),
        ("none", None),
    ],
)
def test_last_boxed(text: str, inner: str | None) -> None:
    assert last_boxed(text) == inner


def test_parsers() -> None:
    assert parse_int("1,024") == 1024 and parse_int("12.5") is None
    assert clock.parse_time("03:05") == clock.parse_time("15:05") == (3, 5)
    assert clock.parse_time("0:30") == (12, 30) and clock.parse_time("3:5") is None and clock.parse_time("25:00") is None
    assert grid_rules.parse_grid("01 2\n3 45") == ("012", "345")
    assert grid_rules.parse_grid("012/34") is None and grid_rules.parse_grid("0a/12") is None
    assert dtmf.parse_keys("1-2 #, *") == "12#*" and dtmf.parse_keys("12A") is None
    assert frame_order.parse_order("C -> A, B") == "CAB" and frame_order.parse_order("1 2") is None
    assert arithmetic.ArithmeticWordEnv().parse_answer("\\$1,200") == 1200


def test_arithmetic_last_number_format_reads_the_box_first_then_the_last_number() -> None:
    strict = relax_gym.make("relax/ArithmeticWord-v0", difficulty="easy")
    flexible = relax_gym.make("relax/ArithmeticWord-v0", difficulty="easy", answer_format="last_number")
    for seed in range(6):
        strict.reset(seed=seed)
        flexible.reset(seed=seed)
        target = strict.unwrapped.task.target
        wrong = target + 1
        cases = {  # reply: (strict reward, flexible reward, flexible answer_source)
            f"{wrong} + 1 = {target}.": (0.0, 1.0, "last_number"),
            f"\\boxed{{{target}}} but maybe {wrong}": (1.0, 1.0, "boxed"),
            f"it is {target}, so \\boxed{{{wrong}}}": (FORMAT_REWARD, FORMAT_REWARD, "boxed"),
            f"{target} is \\boxed{{N}}": (0.0, 1.0, "last_number"),  # a box with no number in it
            f"{target}.5 apples": (0.0, 0.0, "last_number"),  # a decimal is not the integer
            "I do not know": (0.0, 0.0, None),
        }
        for reply, (strict_reward, flexible_reward, source) in cases.items():
            strict.reset(seed=seed)
            flexible.reset(seed=seed)
            assert strict.step(reply)[1] == pytest.approx(strict_reward), reply
            _, reward, done, _, info = flexible.step(reply)
            assert (reward, done, info["answer_source"]) == (pytest.approx(flexible_reward), True, source), reply
            assert info["success"] == (flexible_reward == 1.0)
    assert arithmetic.last_integer("total 1,024 apples, then 3,4") == "4"
    assert arithmetic.last_integer("9" * 50_000 + " end") is not None  # long input: bounded, no error
    with pytest.raises(ValueError, match="answer_format must be one of"):
        relax_gym.make("relax/ArithmeticWord-v0", answer_format="loose")


@pytest.mark.parametrize("env_id", ONE_TURN)
def test_grading_right_wrong_and_malformed(env_id: str) -> None:
    """The oracle's answer scores 1 (success), a random well-formed wrong answer 0.1, junk 0."""
    env = relax_gym.make(env_id, difficulty="medium")
    rng = np.random.default_rng(0)
    for seed in range(5):
        env.reset(seed=seed)
        *_, info = env.step(next(iter(env.oracle())))
        assert info["success"] and info["reward_components"] == {"correct": 1.0, "format": 0.0}
        env.reset(seed=seed)
        wrong = next(a for a in (env.random_action(rng) for _ in range(200)) if a != next(iter(env.oracle())))
        _, reward, terminated, _, info = env.step(wrong)
        assert terminated and info["well_formed"], (env_id, wrong)
        if not info["success"]:  # a different text can still be right (e.g. "3:05" vs "03:05")
            assert reward == pytest.approx(FORMAT_REWARD)
        env.reset(seed=seed)
        _, reward, _, _, info = env.step("The answer is \\boxed{???}")
        assert reward == 0.0 and not info["success"] and not info["well_formed"]


def test_random_answers_are_well_formed_everywhere() -> None:
    for env_id in ONE_TURN:
        for difficulty in ("easy", "hard"):
            env = relax_gym.make(env_id, difficulty=difficulty)
            rng = np.random.default_rng(1)
            for seed in range(5):
                env.reset(seed=seed)
                *_, info = env.step(env.random_action(rng))
                assert info["well_formed"], (env_id, difficulty)


def test_also_correct_answers_count_as_success() -> None:
    env = relax_gym.make("relax/GridRules-v0")
    env.reset(seed=0)
    inner = env.unwrapped
    inner.task = dataclasses.replace(inner.task, also_correct=frozenset({("000", "000", "000")}))
    *_, info = env.step("\\boxed{000/000/000}")
    assert info["success"]


def test_grid_rule_transformations() -> None:
    g = np.array([[1, 0, 2], [0, 3, 0], [4, 0, 0]], dtype=np.int8)
    rot = grid_rules.Rule(("rotate 90 clockwise",))(g)
    assert rot.tolist() == [[4, 0, 1], [0, 3, 0], [0, 0, 2]]
    assert grid_rules.Rule(("gravity down",))(g).tolist() == [[0, 0, 0], [1, 0, 0], [4, 3, 2]]
    assert grid_rules.Rule(("shift right with wrap",))(g).tolist() == [[2, 1, 0], [0, 0, 3], [0, 4, 0]]
    swap = grid_rules.Rule(("swap colours", "flip up-down"), swap=(1, 4))
    assert swap(g).tolist() == [[1, 0, 0], [0, 3, 0], [4, 0, 2]]
    assert swap.name == "swap colours 1 and 4 then flip up-down"
    assert grid_rules.grid_to_text(g) == "102/030/400"


def test_grid_rules_answer_is_the_rule_applied_and_unique() -> None:
    env = grid_rules.GridRulesEnv("hard")
    for seed in range(10):
        env.reset(seed=seed)
        assert env.task.also_correct == frozenset()
        catalogue = env.catalogue(env.level, env._colors)
        outputs = {grid_rules.grid_to_text(r(env._test_input)) for r in catalogue}
        assert env.task.answer in outputs


def test_arithmetic_answers_follow_from_the_text() -> None:
    """Spot-check templates against a hand-solved reading of the generated numbers."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        text, answer = arithmetic._boxes(rng)
        nums = [int(t) for t in text.replace(".", " ").split() if t.isdigit()]
        assert answer == nums[0] * nums[1]
        text, answer = arithmetic._teams(rng)
        total, extra, per = [int(t) for t in text.replace(".", " ").replace(",", " ").split() if t.isdigit()]
        assert answer * per + extra == total
        text, answer = arithmetic._orchard(rng)
        rows, trees, apples, rotten, bag = [int(t) for t in text.replace(".", " ").split() if t.isdigit()]
        assert answer == (rows * trees * apples - rotten) // bag and (rows * trees * apples - rotten) % bag == 0
