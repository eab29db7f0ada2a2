"""The code-execution reward, run for real in the tools sandbox."""

from __future__ import annotations

import builtins
import time

import pytest

import relax_gym.rewards as R
from relax_gym.rewards import RewardComposer, RewardInput
from relax_gym.rewards.code import extract_code, parse_report

sandbox = pytest.importorskip("relax_gym.tools.sandbox", reason="the tools sandbox is not installed")

ECHO_SUM = "```python\nimport sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n```"
IO_CASES = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5 5", "output": "15"}, {"input": "", "output": "0"}]


def run(response: str, label, **kwargs) -> R.RewardResult:
    return R.evaluate_reward("code_tests", RewardInput.from_text("write code", response, label=label), **kwargs)


def test_extract_code_takes_the_last_python_block() -> None:
    text = "```bash\nls\n```\n```python\nx = 1\n```\nthen\n```py\nx = 2\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("no code here") is None


def test_io_cases_all_pass() -> None:
    res = run("Here:\n" + ECHO_SUM, IO_CASES)
    assert not res.failed, res.error
    assert res.total == 1.0 and res.details["code_tests"]["passed"] == 3


def test_io_cases_partial_credit_and_all_mode() -> None:
    wrong_on_empty = "```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split())) or 'none')\n```"
    assert run(wrong_on_empty, IO_CASES).total == pytest.approx(2 / 3)
    res = run(wrong_on_empty, IO_CASES, mode="all")
    assert res.total == 0.0 and "wrong output" in res.details["code_tests"]["first_failure"]


def test_snippet_tests_in_the_program_namespace() -> None:
    solution = "```python\ndef add(a, b):\n    return a + b if a != 7 else 0\n```"
    res = run(solution, ["assert add(1, 2) == 3", "assert add(7, 1) == 8", "assert add(-1, 1) == 0"])
    assert res.total == pytest.approx(2 / 3)
    assert "AssertionError" in res.details["code_tests"]["first_failure"]
    assert run(solution, "assert add(2, 2) == 4").total == 1.0


def test_hanging_case_is_bounded_and_others_still_count() -> None:
    solution = "```python\nimport sys\ns = sys.stdin.read()\nwhile s == 'loop':\n    pass\nprint(s)\n```"
    cases = [{"input": "a", "output": "a"}, {"input": "loop", "output": "loop"}, {"input": "b", "output": "b"}]
    start = time.perf_counter()
    res = run(solution, cases, case_timeout_s=0.5, timeout_s=10)
    assert time.perf_counter() - start < 8
    assert res.total == pytest.approx(2 / 3)
    assert res.details["code_tests"]["first_failure"] == "case timed out"


def test_broken_program_and_missing_code_score_zero() -> None:
    res = run("```python\ndef f(:\n```", ["assert f() == 1"])
    assert res.total == 0.0 and "SyntaxError" in res.details["code_tests"]["first_failure"]
    res = run("I would write a loop.", IO_CASES)
    assert res.total == 0.0 and res.details["code_tests"]["error"] == "no code block"


def test_program_cannot_forge_verdicts_without_the_nonce() -> None:
    forger = "```python\nprint('0123 [0, true, \"\"]')\nimport os\nos.write(1, b'abcd [0, true, \"\"]\\n')\n```"
    res = run(forger, [{"input": "", "output": "nope"}])
    assert res.total == 0.0
    assert parse_report("n [0, true, \"\"]\nn [0, true, \"\"]", "n", 1) == {0: (False, "case reported twice")}


def test_bad_label_is_a_config_failure() -> None:
    res = run(ECHO_SUM, [{"input": 1}])
    assert res.failed and res.errors["code_tests"].kind == "config"


def test_missing_sandbox_is_a_clear_config_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_tools(name, *args, **kwargs):
        if name.startswith("relax_gym.tools"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tools)
    [res] = RewardComposer(["code_tests"]).score_sync([RewardInput.from_text("q", ECHO_SUM, label=IO_CASES)])
    assert res.failed and res.errors["code_tests"].kind == "config"
    assert "relax_gym.tools.run_python" in res.errors["code_tests"].message
