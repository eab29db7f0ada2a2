"""``check_env``: Gymnasium's API checks plus the checks an LLM environment needs.

Each check records a pass or a failure with a readable reason; the report prints as a table and
``check_env`` raises :class:`EnvCheckError` (or returns the report) when anything failed.

Checks, in order:

1. ``gymnasium`` -- Gymnasium's own ``check_env`` on the unwrapped env.
2. ``determinism`` -- the same seed gives identical observations (media bytes included, as
   rendered for an OpenAI-style API) and identical step results; different seeds differ.
3. ``formatting`` -- ``format_observation`` renders in the openai, hf and text styles.
4. ``oracle`` -- if the env has one, it reaches ``success`` on every seed.
5. ``invalid_action`` -- junk actions give an observation (an error message or a failed end),
   never an exception, and never ``success``.
6. ``step_after_end`` -- stepping an ended episode raises a clear error.
7. ``declared_modalities`` -- observations only carry modalities the env declares.
"""

from __future__ import annotations

import json
import math
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relax_gym.core import Env
from relax_gym.errors import EnvCheckError, EpisodeEndedError, RelaxGymError, ResetNeededError
from relax_gym.formatting import STYLES
from relax_gym.types import Action, AudioPart, ImagePart, Observation, VideoPart

JUNK_ACTIONS: tuple[str, ...] = (
    "",
    "I don't know.",
    "\\boxed{}\x00\ufffd <tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "}}}{{{ ]]] 🙃 " * 20,
)


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False


@dataclass
class CheckReport:
    env_id: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "passed": self.passed,
            "checks": [r.__dict__ for r in self.results],
        }

    def __str__(self) -> str:
        lines = [f"check_env({self.env_id}): {'PASSED' if self.passed else 'FAILED'}"]
        for r in self.results:
            status = "skip" if r.skipped else ("ok" if r.passed else "FAIL")
            lines.append(f"  [{status:>4}] {r.name}" + (f": {r.detail}" if r.detail else ""))
        return "\n".join(lines)


def check_env(
    env: Env,
    *,
    seeds: int | list[int] = 3,
    skip_gymnasium: bool = False,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Check ``env`` (preferably as returned by ``relax_gym.make``) and report every problem."""
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ValueError("check_env needs at least one seed")
    env_id = getattr(getattr(env, "spec", None), "id", None) or type(env.unwrapped).__name__
    report = CheckReport(env_id)
    checks: list[tuple[str, Callable[[], str | None]]] = []
    if not skip_gymnasium:
        checks.append(("gymnasium", lambda: _check_gymnasium(env)))
    checks += [
        ("determinism", lambda: _check_determinism(env, seed_list)),
        ("formatting", lambda: _check_formatting(env, seed_list[0])),
        ("oracle", lambda: _check_oracle(env, seed_list)),
        ("invalid_action", lambda: _check_invalid_actions(env, seed_list[0])),
        ("step_after_end", lambda: _check_step_after_end(env, seed_list[0])),
        ("declared_modalities", lambda: _check_modalities(env, seed_list)),
    ]
    for name, fn in checks:
        try:
            detail = fn()
            skipped = detail is not None and detail.startswith("skipped")
            report.results.append(CheckResult(name, True, detail or "", skipped))
        except _CheckFailed as exc:
            report.results.append(CheckResult(name, False, str(exc)))
        except Exception as exc:
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            report.results.append(CheckResult(name, False, f"raised {tb}"))
    if raise_on_failure and not report.passed:
        raise EnvCheckError(report)
    return report


class _CheckFailed(Exception):
    pass


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise _CheckFailed(message)


def _check_gymnasium(env: Env) -> str | None:
    from gymnasium.utils.env_checker import check_env as gym_check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
    notes = sorted({str(w.message).splitlines()[0][:120] for w in caught})
    return f"{len(notes)} warning(s): " + " | ".join(notes) if notes else None


def _openai_json(env: Env, obs: Observation) -> str:
    return json.dumps(
        {"messages": env.format_observation(obs, "openai"), "tools": [t.to_openai() for t in obs.tools]},
        sort_keys=True,
    )


def _first_action(env: Env) -> Action | str:
    """A deterministic action to step with: the oracle's first, else a fixed junk string."""
    if env.has_oracle:
        try:
            return next(iter(env.oracle()))
        except (StopIteration, NotImplementedError):
            pass
    return JUNK_ACTIONS[1]


def _where(a: str, b: str) -> str:
    """Where two renderings first differ, and the media type of the data URL around it."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = a.rfind("data:", 0, i)
    kind = a[start:a.find(";", start)] if start >= 0 else "text"
    return f": first difference at character {i} of {len(a)} / {len(b)}, inside {kind}"


def _check_determinism(env: Env, seeds: list[int]) -> str | None:
    rendered: dict[int, str] = {}
    for seed in seeds:
        obs_a, info_a = env.reset(seed=seed)
        json_a = _openai_json(env, obs_a)
        action = _first_action(env)
        step_a = env.step(action)
        obs_b, info_b = env.reset(seed=seed)
        json_b = _openai_json(env, obs_b)
        step_b = env.step(action)
        _require(obs_a == obs_b, f"seed {seed}: two resets gave different observations")
        if json_a != json_b:  # (the message scans both renderings: only on failure)
            _require(False, f"seed {seed}: two resets rendered to different bytes (openai style){_where(json_a, json_b)}")
        _require(_stable(info_a) == _stable(info_b), f"seed {seed}: two resets gave different info")
        _require(step_a[0] == step_b[0], f"seed {seed}: the same action gave different step observations")
        _require(
            step_a[1:4] == step_b[1:4],
            f"seed {seed}: the same action gave different (reward, terminated, truncated): {step_a[1:4]} vs {step_b[1:4]}",
        )
        # Hidden-state envs may show the same prompt for every seed; the first step's outcome
        # under the oracle's action still reveals whether the seed changed the task.
        rendered[seed] = json_a + repr(action) + _openai_json(env, step_a[0]) + repr(step_a[1:4])
    if len(seeds) > 1:
        _require(
            len(set(rendered.values())) > 1,
            f"seeds {seeds} all produced the same episode start; draw the task from self.np_random",
        )
    return None


def _stable(info: dict[str, Any]) -> str:
    """Info as JSON, minus timing fields that may legitimately vary between runs."""
    clean = {k: v for k, v in info.items() if k not in ("timing", "latency_s", "wall_time_s")}
    return json.dumps(clean, sort_keys=True, default=repr)


def _check_formatting(env: Env, seed: int) -> str | None:
    obs, _ = env.reset(seed=seed)
    n_media = len(obs.parts(ImagePart)) + len(obs.parts(AudioPart)) + len(obs.parts(VideoPart))
    for style in STYLES:
        out = env.format_observation(obs, style)  # type: ignore[arg-type]
        _require(isinstance(out, list), f"{style}: format_observation returned {type(out).__name__}, expected list")
        _require(len(out) == len(obs.messages), f"{style}: {len(out)} rendered messages for {len(obs.messages)}")
        for msg in out:
            _require(isinstance(msg, dict) and "role" in msg and "content" in msg, f"{style}: a message lacks role/content")
        if style == "openai":
            try:
                json.dumps(out)
            except (TypeError, ValueError) as exc:
                raise _CheckFailed(f"openai: rendering is not JSON-serialisable ({exc})") from None
        if style == "text":
            _require(all(isinstance(m["content"], str) for m in out), "text: content must be plain strings")
    if n_media:
        hf = env.format_observation(obs, "hf")
        media_parts = [
            p for m in hf if isinstance(m["content"], list) for p in m["content"] if p.get("type") in ("image", "audio", "video")
        ]
        _require(len(media_parts) == n_media, f"hf: {len(media_parts)} media parts rendered for {n_media}")
    return None


def _run_episode(env: Env, seed: int, policy: Callable[[int], Action | str]) -> tuple[bool, int, float]:
    env.reset(seed=seed)
    total, turns = 0.0, 0
    for turn in range(env.max_turns + 1):
        _, reward, terminated, truncated, info = env.step(policy(turn))
        total += float(reward)
        turns += 1
        if terminated or truncated:
            return bool(info.get("success", False)), turns, total
    raise _CheckFailed(
        f"seed {seed}: episode did not end within max_turns={env.max_turns}; "
        "relax_gym.make() adds the EpisodeGuard that truncates at max_turns"
    )


def _check_oracle(env: Env, seeds: list[int]) -> str | None:
    if not env.has_oracle:
        return "skipped: env has no oracle"
    for seed in seeds:
        env.reset(seed=seed)
        actions = iter(env.oracle())
        success, turns = False, 0
        for _ in range(env.max_turns):
            try:
                action = next(actions)
            except StopIteration:
                raise _CheckFailed(f"seed {seed}: oracle ran out of actions after {turns} turns before the episode ended") from None
            _, reward, terminated, truncated, info = env.step(action)
            turns += 1
            _require(math.isfinite(float(reward)), f"seed {seed}: non-finite reward {reward}")
            if terminated or truncated:
                success = bool(info.get("success"))
                break
        else:
            raise _CheckFailed(f"seed {seed}: oracle did not finish within max_turns={env.max_turns}")
        _require(success, f"seed {seed}: oracle episode ended after {turns} turns without success")
    return None


def _check_invalid_actions(env: Env, seed: int) -> str | None:
    for junk in JUNK_ACTIONS:
        env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step(junk)
        _require(isinstance(obs, Observation), f"junk action {junk[:30]!r}: step returned {type(obs).__name__}")
        lo, hi = env.reward_range
        _require(lo - 1e-9 <= float(reward) <= hi + 1e-9, f"junk action: reward {reward} outside reward_range {env.reward_range}")
        _require(not info.get("success", False), f"junk action {junk[:30]!r} was scored as a success")
        if not (terminated or truncated):
            _require(
                len(obs.messages) > 0,
                f"junk action {junk[:30]!r}: the episode continues but the observation tells the model nothing",
            )
    return None


def _check_step_after_end(env: Env, seed: int) -> str | None:
    _run_episode(env, seed, lambda turn: JUNK_ACTIONS[1])
    try:
        env.step(JUNK_ACTIONS[1])
    except (EpisodeEndedError, ResetNeededError):
        return None
    except RelaxGymError as exc:
        raise _CheckFailed(f"step after the end raised {type(exc).__name__}, expected EpisodeEndedError") from None
    raise _CheckFailed(
        "step() after the episode ended returned normally; create the env with relax_gym.make() "
        "(its EpisodeGuard raises EpisodeEndedError) or raise it yourself"
    )


def _check_modalities(env: Env, seeds: list[int]) -> str | None:
    declared = set(env.modalities)
    seen: set[str] = set()
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        seen |= obs.modalities
    undeclared = seen - declared
    _require(not undeclared, f"observations carry {sorted(undeclared)} but the env declares {sorted(declared)}")
    return None
