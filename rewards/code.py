"""Code-execution reward: run the model's program against test cases in the tools sandbox.

The program is the last fenced code block of the response (```python ... ```). The label holds
the tests, in one of three forms:

* a list of ``{"input": str, "output": str}`` cases -- the program runs once per case with that
  stdin; it passes when its stdout matches (trailing whitespace per line ignored);
* a list of Python test snippets (``"assert add(1, 2) == 3"``) -- the program runs once, then
  each snippet in its namespace;
* one string of test code -- run after the program as a single test.

All cases run in **one** sandboxed process (``relax_gym.tools.run_python``) under a harness
that bounds each case with ``case_timeout_s`` and reports each verdict as soon as it is known,
so a program that hangs on case 3 still gets credit for cases 1 and 2. The score is the
fraction of cases passed (``mode="fraction"``) or 1.0 only when all pass (``mode="all"``).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from typing import Any

from relax_gym.rewards.registry import Score, reward
from relax_gym.rewards.types import RewardError, RewardInput

MAX_CASES = 1000
_PLACEHOLDER = re.compile(r"\{(SOLUTION|CASES|KIND|NONCE|CASE_TIMEOUT)\}")
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)  # info string, then the body

# The harness: {SOLUTION}, {CASES}, {KIND}, {NONCE}, {CASE_TIMEOUT} are filled with literals.
_HARNESS = r'''
import contextlib, io, json, os, signal, sys
_out = os.fdopen(os.dup(1), "w")
SOLUTION = {SOLUTION}
CASES = {CASES}
KIND = {KIND}
NONCE = {NONCE}
CASE_TIMEOUT = {CASE_TIMEOUT}

class _CaseTimeout(BaseException):
    pass

def _alarm(signum, frame):
    raise _CaseTimeout()

signal.signal(signal.SIGALRM, _alarm)

def _report(i, ok, why=""):
    _out.write(NONCE + " " + json.dumps([i, ok, why[-300:]]) + "\n")
    _out.flush()

def _norm(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)

def _run(code, ns, stdin_text=""):
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin_text.encode()), encoding="utf-8")
    buf = io.StringIO()
    signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT)
    try:
        with contextlib.redirect_stdout(buf):
            try:
                exec(compile(code, "<solution>", "exec"), ns)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return buf.getvalue()

def _why(exc):
    if isinstance(exc, _CaseTimeout):
        return "case timed out"
    return type(exc).__name__ + ": " + str(exc)

if KIND == "io":
    for i, case in enumerate(CASES):
        try:
            got = _run(SOLUTION, {"__name__": "__main__"}, case["input"])
            ok = _norm(got) == _norm(case["output"])
            _report(i, ok, "" if ok else "wrong output: " + repr(got[-200:]))
        except BaseException as exc:
            _report(i, False, _why(exc))
else:
    ns = {"__name__": "__solution__"}
    try:
        _run(SOLUTION, ns)
        loaded = None
    except BaseException as exc:
        loaded = _why(exc)
    for i, test in enumerate(CASES):
        if loaded is not None:
            _report(i, False, "program failed: " + loaded)
            continue
        try:
            _run(test, ns)
            _report(i, True)
        except BaseException as exc:
            _report(i, False, _why(exc))
'''


def extract_code(text: str, language: str = "python") -> str | None:
    """The last fenced block tagged ``language`` (or untagged); None when there is none."""
    blocks = [((info.split() or [""])[0].lower(), body) for info, body in _FENCE.findall(text[-200_000:])]
    wanted = [body for lang, body in blocks if lang in (language, "py" if language == "python" else language, "")]
    return wanted[-1] if wanted else None


def _cases(label: Any) -> tuple[str, list[Any]]:
    """(kind, cases) from a label; kind is ``io`` or ``snippets``."""
    if isinstance(label, str) and label.strip():
        return "snippets", [label]
    if isinstance(label, list) and label:
        if all(isinstance(c, dict) and isinstance(c.get("input"), str) and isinstance(c.get("output"), str) for c in label):
            return "io", [{"input": c["input"], "output": c["output"]} for c in label]
        if all(isinstance(c, str) for c in label):
            return "snippets", list(label)
    raise RewardError(
        "config",
        "code_tests needs a label of test code: a string, a list of snippets, or a list of "
        "{'input': str, 'output': str} cases",
    )


def _sandbox() -> Callable[..., Any]:
    try:
        from relax_gym.tools import run_python  # type: ignore[attr-defined]
    except ImportError:
        try:
            from relax_gym.tools.sandbox import run_python
        except ImportError as exc:
            raise RewardError(
                "config", f"code_tests needs the sandbox relax_gym.tools.run_python, which is not available ({exc})"
            ) from None
    return run_python


def build_harness(solution: str, kind: str, cases: list[Any], nonce: str, case_timeout_s: float) -> str:
    """The program the sandbox runs. One pass over the template, so text inside the solution
    that looks like a placeholder is never substituted."""
    values = {
        "SOLUTION": repr(solution),
        "CASES": repr(cases),
        "KIND": repr(kind),
        "NONCE": repr(nonce),
        "CASE_TIMEOUT": repr(float(case_timeout_s)),
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], _HARNESS)


def parse_report(stdout: str, nonce: str, n_cases: int) -> dict[int, tuple[bool, str]]:
    """Per-case verdicts from the harness's marked lines. A case reported twice (the program
    forging a verdict) counts as failed."""
    verdicts: dict[int, tuple[bool, str]] = {}
    seen: set[int] = set()
    for line in stdout.splitlines():
        if not line.startswith(nonce + " "):
            continue
        try:
            i, ok, why = json.loads(line[len(nonce) + 1 :])
        except (ValueError, TypeError):
            continue
        if not isinstance(i, int) or not 0 <= i < n_cases:
            continue
        if i in seen:
            verdicts[i] = (False, "case reported twice")
            continue
        seen.add(i)
        verdicts[i] = (bool(ok) and ok is True, str(why))
    return verdicts


@reward("code_tests")
def code_tests(
    sample: RewardInput,
    *,
    mode: str = "fraction",
    timeout_s: float = 20.0,
    case_timeout_s: float = 5.0,
    memory_mb: int = 1024,
    language: str = "python",
) -> Score:
    """Fraction of test cases (``sample.label``) the response's last code block passes in the
    sandbox; ``mode="all"`` gives 1.0 only when every case passes. No code block scores 0."""
    if mode not in ("fraction", "all"):
        raise RewardError("config", f"mode must be 'fraction' or 'all', got {mode!r}")
    if language != "python":
        raise RewardError("config", f"only python code is supported, got {language!r}")
    kind, cases = _cases(sample.label)
    if len(cases) > MAX_CASES:
        raise RewardError("config", f"{len(cases)} test cases exceed the limit of {MAX_CASES}")
    code = extract_code(sample.response, language)
    if code is None:
        return Score(0.0, details={"passed": 0, "cases": len(cases), "error": "no code block"})
    run_python = _sandbox()
    nonce = secrets.token_hex(16)
    result = run_python(build_harness(code, kind, cases, nonce, case_timeout_s), timeout_s=timeout_s,
                        memory_mb=memory_mb)
    if result.exit_code is None and not result.timed_out:
        raise RewardError("exception", f"sandbox failed: {result.killed_reason or result.stderr[-300:]}")
    verdicts = parse_report(result.stdout, nonce, len(cases))
    passed = sum(1 for ok, _ in verdicts.values() if ok)
    details: dict[str, Any] = {
        "passed": passed,
        "cases": len(cases),
        "reported": len(verdicts),
        "duration_s": round(result.duration_s, 3),
    }
    if result.killed_reason:
        details["killed_reason"] = result.killed_reason
    first_fail = next((why for i, (ok, why) in sorted(verdicts.items()) if not ok), None)
    if first_fail:
        details["first_failure"] = first_fail
    value = passed / len(cases) if mode == "fraction" else float(passed == len(cases))
    return Score(value, details=details)


__all__ = ["build_harness", "code_tests", "extract_code", "parse_report"]
