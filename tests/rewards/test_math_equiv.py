"""Math answer equivalence: a table of equivalent / non-equivalent pairs in real LaTeX, answer
extraction, the reward's details, and the hard timeout on pathological input."""

from __future__ import annotations

import time

import pytest

from relax_gym.rewards import RewardComposer, RewardInput, extract_answer, find_boxed, math_equal
from relax_gym.rewards.sympy_pool import SympyConfigError, SympyPool, SympyTimeout

# (model answer, reference, equivalent?)
PAIRS: list[tuple[str, str, bool]] = [
    # fractions
    (r"\frac{1}{2}", "0.5", True),
    (r"\dfrac{3}{4}", r"\frac34", True),
    (r"\tfrac{6}{8}", r"\frac{3}{4}", True),
    (r"-\frac{2}{3}", r"\frac{-2}{3}", True),
    (r"\frac{2}{3}", r"\frac{3}{2}", False),
    ("7/2", "3.5", True),
    (r"\frac{1}{3}", "0.333", False),
    ("0.3333333", r"\frac13", True),
    (r"\frac{10}{4}", r"\frac{5}{2}", True),
    # roots
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"2\sqrt{3}", r"\sqrt{12}", True),
    (r"\sqrt2", r"\sqrt{2}", True),
    (r"\sqrt[3]{8}", "2", True),
    (r"3\sqrt{2}", r"\sqrt{18}", True),
    (r"\sqrt{8}", r"3\sqrt{2}", False),
    (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}", True),
    # pi and constants
    (r"\frac{\pi}{2}", r"\pi/2", True),
    (r"2\pi r", r"2 r \pi", True),
    (r"\pi", "3.14", False),
    (r"\frac{3\pi}{4}", r"0.75\pi", True),
    (r"e^{2}", r"\exp(2)", True),
    (r"\frac{\pi}{3}", r"\frac{\pi}{6}", False),
    # symbolic
    (r"x^2+2x+1", r"(x+1)^2", True),
    (r"(x-1)(x+1)", r"x^2-1", True),
    (r"\frac{x^2-1}{x-1}", "x+1", True),
    (r"2x+3", "3x+2", False),
    (r"\sin^2 x + \cos^2 x", "1", True),
    (r"\log_2 8", "3", True),
    (r"a^2 b", r"b a^2", True),
    # numbers with units and thousands separators
    ("1,000", "1000", True),
    (r"1{,}000{,}000", "1000000", True),
    ("1 000 000", "1000000", True),
    (r"5\text{ cm}", "5", True),
    (r"12 \mathrm{m}^2", "12", True),
    (r"30^\circ", "30", True),
    (r"30^{\circ}", "60", False),
    (r"\$5.00", "5", True),
    ("5 apples", "5", True),
    (r"12\text{ inches}", "13", False),
    ("1,234.5", "1234.5", True),
    # percentages
    (r"50\%", "0.5", True),
    (r"50\%", "50", True),
    ("25%", "0.3", False),
    (r"12.5\%", r"\frac{1}{8}", True),
    (r"40\%", r"40\%", True),
    (r"40\%", r"45\%", False),
    # intervals and sets
    (r"[0, \infty)", r"[0,\infty)", True),
    (r"(1, 2]", "(1,2)", False),
    (r"\left(-\infty, 3\right)", r"(-\infty,3)", True),
    (r"(-\infty, -1) \cup (1, \infty)", r"(1,\infty)\cup(-\infty,-1)", True),
    (r"[1, 2] \cup [3, 4]", r"[1, 2] \cup [3, 5]", False),
    (r"\{1, 2, 3\}", r"\{3,2,1\}", True),
    (r"\{1, 2\}", r"\{1, 2, 3\}", False),
    ("1, 2", "2, 1", True),
    (r"x = 1 \text{ or } x = 2", "2, 1", True),
    (r"1 \pm \sqrt{2}", r"1+\sqrt{2}, 1-\sqrt{2}", True),
    (r"\left[\frac{1}{2}, 1\right]", "[0.5, 1]", True),
    # tuples and points (ordered)
    ("(1, 2)", "(2, 1)", False),
    (r"(\frac{1}{2}, 3)", "(0.5, 3)", True),
    (r"(3, -4)", "(3,-4)", True),
    # equations
    ("x=3", "3", True),
    ("x = 3", "4", False),
    (r"y = 2x+1", "2x + 1", True),
    (r"x^2 + y^2 = 1", r"y^2 + x^2 = 1", True),
    ("2y = 4x + 2", "y = 2x + 1", True),
    ("y = x + 1", "y = x - 1", False),
    (r"\theta = \frac{\pi}{4}", r"\frac{\pi}{4}", True),
    (r"x \in [0, 1]", "[0, 1]", True),
    # words and text answers
    (r"\text{Monday}", "Monday", True),
    ("Yes", "yes", True),
    ("yes", "no", False),
    (r"\text{(B)}", "(B)", True),
    # negatives, decimals, scientific
    ("-5", r"-5.0", True),
    ("0.1", r"\frac{1}{10}", True),
    ("0.1", "0.2", False),
    (r"2.5 \times 10^{3}", "2500", True),
    (r"3 \cdot 10^2", "300", True),
    (r"\infty", r"\infty", True),
    (r"-\infty", r"\infty", False),
    ("(0, 1)", "[0, 1]", False),
    (r"\{1, 2\}", "(1, 2)", False),
    (r"\sqrt{2}", "1.41", False),
    (r"x^2", "2x", False),
    (r"\frac{x}{2}", "2x", False),
    ("x=2, y=1", "x=1, y=2", False),
    ("y=2, x=1", "x=1, y=2", True),
    ("π/2", r"\frac{\pi}{2}", True),
    ("−3", "-3", True),
    (r"2^{10}", "1024", True),
    (r"10^{-3}", "0.001", True),
    (r"\varnothing", r"\emptyset", True),
    (r"x \geq 3", r"x \ge 3", True),
    (r"x > 3", r"(3, \infty)", False),
]


def test_table_is_large_and_balanced() -> None:
    assert len(PAIRS) >= 60
    assert sum(1 for *_, eq in PAIRS if eq) >= 30
    assert sum(1 for *_, eq in PAIRS if not eq) >= 20


@pytest.mark.parametrize(("pred", "ref", "equal"), PAIRS, ids=[f"{i}" for i in range(len(PAIRS))])
def test_math_equal_table(pred: str, ref: str, equal: bool) -> None:
    assert math_equal(pred, ref, timeout_s=10).equal is equal, (pred, ref)


@pytest.mark.parametrize(("pred", "ref", "equal"), PAIRS[::7])
def test_math_equal_is_symmetric(pred: str, ref: str, equal: bool) -> None:
    assert math_equal(ref, pred, timeout_s=10).equal is equal


@pytest.mark.parametrize(
    ("text", "answer", "how"),
    [
        (r"So the result is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}", "boxed"),
        (r"first \boxed{1} then \boxed{\{1, 2\}}", r"\{1, 2\}", "boxed"),
        (r"nested \boxed{\frac{\sqrt{\frac{1}{2}}}{2}} done", r"\frac{\sqrt{\frac{1}{2}}}{2}", "boxed"),
        ("We get x.\nAnswer: $x = 3$.", "x = 3", "marker"),
        ("Work...\nThe final answer is 42.", "42", "marker"),
        ("Natalia sold 72 clips.\n#### 72", "72", "marker"),
        ("  7  ", "7", "whole"),
        ("line one\nline two without an answer", None, "none"),
        (r"\boxed 5 is it", "5", "boxed"),
        (r"unbalanced \boxed{1", None, "none"),
    ],
)
def test_extract_answer(text: str, answer: str | None, how: str) -> None:
    assert extract_answer(text) == (answer, how)


def test_find_boxed_handles_many_boxes_quickly() -> None:
    text = r"\boxed{1} " * 20_000
    start = time.perf_counter()
    boxes = find_boxed(text)
    assert time.perf_counter() - start < 2.0
    assert boxes and boxes[-1] == "1"


def test_math_equiv_reward_scores_and_details() -> None:
    composer = RewardComposer(["math_equiv"])
    samples = [
        RewardInput.from_text("q", r"Thus \boxed{\frac{\sqrt{2}}{2}}", label=r"\frac{1}{\sqrt{2}}"),
        RewardInput.from_text("q", r"Thus \boxed{3}", label="4"),
        RewardInput.from_text("q", "I do not know.\nSorry.", label="4"),
    ]
    right, wrong, missing = composer.score_sync(samples)
    assert (right.total, wrong.total, missing.total) == (1.0, 0.0, 0.0)
    assert right.details["math_equiv"]["extracted"] == r"\frac{\sqrt{2}}{2}"
    assert right.details["math_equiv"]["method"] == "sympy"
    assert missing.details["math_equiv"]["how"] == "none"
    assert not any(r.failed for r in (right, wrong, missing))


def test_math_equiv_without_label_is_a_config_failure() -> None:
    [res] = RewardComposer(["math_equiv"]).score_sync([RewardInput.from_text("q", r"\boxed{1}")])
    assert res.failed and res.total is None
    assert res.errors["math_equiv"].kind == "config"


def test_pathological_answer_times_out_without_hanging_the_caller() -> None:
    pool = SympyPool(size=1)
    try:
        # Start the worker first, so the bound below measures the budget and the kill, not a
        # process start (which took 9 s on a loaded 2-core box).
        assert math_equal("1", "1", timeout_s=60, pool=pool).equal
        start = time.perf_counter()
        with pytest.raises(SympyTimeout):
            math_equal(r"10^{10^{10^{10}}}", "1", timeout_s=1.0, pool=pool)
        assert time.perf_counter() - start < 6.0  # 1 s budget + the kill
        assert pool.timeouts == 1
        # the pool recovers with a fresh worker
        assert math_equal(r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", timeout_s=10, pool=pool).equal
    finally:
        pool.close()


def test_reward_timeout_is_a_recorded_failure() -> None:
    sample = RewardInput.from_text("q", r"\boxed{10^{10^{10^{10}}}}", label="1")
    [res] = RewardComposer([{"name": "math_equiv", "kwargs": {"timeout_s": 1.0}}]).score_sync([sample])
    assert res.failed and res.total is None
    assert res.errors["math_equiv"].kind == "timeout"
    assert res.details["math_equiv"]["extracted"] == r"10^{10^{10^{10}}}"


def test_missing_antlr_runtime_is_a_loud_config_error(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "antlr4"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('antlr4 hidden for this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    pool = SympyPool(size=1)
    try:
        assert pool.latex_error()  # the worker reports why LaTeX parsing is off
        assert math_equal("1,000", "1000", pool=pool).equal  # settled before sympy: still works
        with pytest.raises(SympyConfigError, match="antlr4-python3-runtime==4.11"):
            math_equal(r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", pool=pool)
    finally:
        pool.close()


def test_missing_sympy_is_a_config_error_not_a_crash(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "sympy"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('sympy hidden for this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    pool = SympyPool(size=1)
    try:
        with pytest.raises(SympyConfigError, match="pip install sympy"):
            math_equal(r"\sqrt{2}", r"\frac{2}{\sqrt{2}}", pool=pool)
    finally:
        pool.close()
