"""``ToolEnv``: wrap any env so the model can call tools before it answers.

::

    env = ToolEnv(MathEnv(), tools=[calculator, python], parser="hermes", max_tool_calls=8)

Each step takes one assistant turn:

* **Tool calls** (parsed with the named parser, or taken from an ``Action`` that already holds
  ``tool_calls``/``parse_errors``): the calls run -- concurrently when ``parallel`` -- and the
  observation holds one ``role="tool"`` message per call attempt, in order, with
  ``tool_call_id`` and ``name`` set. Media results become image/audio/video parts; each new
  image gets an id (``img_1``, ``img_2``...) announced in the message's text, so ``zoom`` can
  refer to it. A malformed call, an unknown tool, bad arguments, a tool failure or a call over
  budget produce a message starting ``Error:`` that says exactly what was wrong; the episode
  goes on. Reward is 0 (minus ``error_penalty`` per failed attempt, if set).
* **No tool call**: the turn is the final answer and goes to the inner env's ``step``
  unchanged; the inner env's reward, termination and info stand. ``submit_answer(answer)``
  does the same explicitly; ``finish(answer)`` also ends the episode (see ``answer_tools``).

Budget: ``max_tool_calls`` call attempts per episode (failed attempts count; answer tools do
not). The message that spends the last one says so; a later turn that still calls tools ends
the episode as truncated (``info["truncation"] = "tool_budget"``). So an episode takes at most
``inner.max_turns + max_tool_calls + 1`` steps: that is ``ToolEnv.max_turns``, and what
``relax_gym.make`` / ``EpisodeGuard`` should be given.

``info["tools"]`` holds counts for the episode so far (``tool_calls``, ``tool_errors``,
``parse_errors``, ``per_tool``, ``budget_left``...); latency is only in ``info["timing"]``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from relax_gym.core import Env, StepResult, Wrapper
from relax_gym.types import (
    Action,
    AudioPart,
    ContentPart,
    ImagePart,
    Message,
    Observation,
    TextPart,
    ToolCall,
    VideoPart,
)

from .answer_tools import ANSWER_TOOL_NAMES
from .declaration import Tool, ToolContext, ToolRegistry, ToolResult, as_tool, run_sync
from .parsers import ParseError, ToolCallParser, call_id, get_parser, limit_calls

_ID_PREFIX = re.compile(r"^(call_\d+_\d+): (.*)$", re.DOTALL)


@dataclass
class _Plan:
    """What one turn asks for, decided before anything runs."""

    turn: int
    text_action: Action
    items: list[ToolCall | ParseError]
    run: list[int] = field(default_factory=list)  # indices of the calls to execute, in order
    over_budget: set[int] = field(default_factory=set)  # item indices refused for the budget
    consumed: int = 0  # budget units this turn uses (failed answer calls add one later)
    answer_call: ToolCall | None = None  # the submit_answer/finish call, if any
    skipped: set[int] = field(default_factory=set)  # item indices not run because of the answer
    exhausted: bool = False  # tools called after the budget was spent: the episode ends

    @property
    def is_final_text(self) -> bool:
        return not self.items


class ToolEnv(Wrapper):
    """Adds tool use to ``env``; see the module docstring for the exact semantics.

    * ``tools`` -- tools (or plain typed functions) offered to the model; merged with the
      tools the env itself provides through a ``tools()`` method on its class.
    * ``parser`` -- ``"hermes"`` (default), ``"qwen3_coder"``, ``"openai"`` or a parser object.
    * ``max_tool_calls`` -- call attempts per episode; ``max_calls_per_turn`` per turn.
    * ``parallel`` -- run the calls of one turn concurrently.
    * ``max_result_chars`` -- text of one tool result beyond this is cut in the middle.
    * ``tool_timeout_s`` -- a tool call still running after this returns an error.
    * ``error_penalty`` -- subtracted from the step reward per failed attempt.
    * ``label_images`` -- add ``[image id: X]`` before each image of the inner env's
      observations (default: when some tool takes an ``image_id``).
    """

    def __init__(
        self,
        env: Env,
        tools: Iterable[Tool | Any] = (),
        *,
        parser: str | ToolCallParser = "hermes",
        max_tool_calls: int = 8,
        max_calls_per_turn: int | None = None,
        parallel: bool = True,
        max_result_chars: int = 8000,
        tool_timeout_s: float | None = 120.0,
        error_penalty: float = 0.0,
        label_images: bool | None = None,
    ) -> None:
        super().__init__(env)
        self._inner: Env = env  # self.env, typed as the relax_gym Env it is
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        if max_result_chars < 100:
            raise ValueError(f"max_result_chars must be >= 100, got {max_result_chars}")
        self._given_tools = [as_tool(t) for t in tools]
        self.parser = get_parser(parser)
        self.max_tool_calls = int(max_tool_calls)
        self.max_calls_per_turn = max_calls_per_turn
        self.parallel = parallel
        self.max_result_chars = int(max_result_chars)
        self.tool_timeout_s = tool_timeout_s
        self.error_penalty = float(error_penalty)
        self.registry = self._build_registry()
        self.label_images = (
            label_images
            if label_images is not None
            else any("image_id" in t.parameter_names for t in self.registry)
        )
        self._ctx = ToolContext(env=env.unwrapped)
        self._reset_episode_state()

    # -- declared properties ---------------------------------------------------------------------
    @property
    def max_turns(self) -> int:  # type: ignore[override]
        return int(self._inner.max_turns) + self.max_tool_calls + 1

    @property
    def modalities(self) -> tuple[str, ...]:  # type: ignore[override]
        extra = {m for t in self.registry for m in t.output_modalities}
        inner = tuple(self._inner.modalities)
        return inner + tuple(sorted(extra - set(inner)))

    @property
    def tags(self) -> tuple[str, ...]:  # type: ignore[override]
        inner = tuple(self._inner.tags)
        return inner if "tools" in inner else inner + ("tools",)

    @property
    def _penalty_cap(self) -> int:
        return max(1, self.max_tool_calls)

    @property
    def reward_range(self) -> tuple[float, float]:  # type: ignore[override]
        lo, hi = self._inner.reward_range
        return (min(0.0, lo) - self.error_penalty * self._penalty_cap, max(0.0, hi))

    # -- registry --------------------------------------------------------------------------------
    def _env_tools(self) -> list[Tool]:
        provider = getattr(self._inner.unwrapped, "tools", None)
        if provider is None or not callable(provider):
            return []
        return [as_tool(t) for t in provider()]

    def _build_registry(self) -> ToolRegistry:
        registry = ToolRegistry(self._given_tools)
        for t in self._env_tools():
            registry.add(t)
        return registry

    # -- episode ---------------------------------------------------------------------------------
    def _reset_episode_state(self) -> None:
        self._turn = 0
        self._answer_turns = 0
        self._calls_used = 0
        self._media_counter = 0
        self._stats: dict[str, Any] = {
            "tool_calls": 0,
            "tool_errors": 0,
            "parse_errors": 0,
            "per_tool": {t.name: {"calls": 0, "errors": 0} for t in self.registry},
            "budget_left": self.max_tool_calls,
            "tool_turns": 0,
            "truncated_results": 0,
            "skipped_calls": 0,
            "finished": False,
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        self._ctx.close()
        obs, info = self._inner.reset(seed=seed, options=options)
        self.registry = self._build_registry()  # env tools may bind to the new episode
        self._ctx = ToolContext(env=self._inner.unwrapped)
        self._reset_episode_state()
        obs = self._adopt(obs, tools=True)
        info = dict(info)
        info["tools"] = self._stats_copy()
        return obs, info

    def close(self) -> None:
        self._ctx.close()
        super().close()

    # -- planning --------------------------------------------------------------------------------
    def _items_for(self, action: Action | str, turn: int) -> tuple[Action, list[ToolCall | ParseError]]:
        if isinstance(action, Action) and (action.tool_calls or action.parse_errors):
            items: list[ToolCall | ParseError] = []
            for i, c in enumerate(action.tool_calls):
                items.append(c if c.id else ToolCall(c.name, dict(c.arguments), call_id(turn, i)))
            for err in action.parse_errors:
                m = _ID_PREFIX.match(err)
                items.append(ParseError(m.group(2), m.group(1)) if m else ParseError(err))
            if self.max_calls_per_turn is not None and len(items) > self.max_calls_per_turn:
                items = limit_calls(items, self.max_calls_per_turn)
            return action, items
        act = Action.coerce(action)
        result = self.parser.parse_detailed(
            act.text, turn=turn, max_calls=self.max_calls_per_turn, tools=self.registry.specs()
        )
        return act, result.items

    def _plan(self, action: Action | str) -> _Plan:
        turn = self._turn
        act, items = self._items_for(action, turn)
        plan = _Plan(turn, act, items)
        if not items:
            return plan
        for item in items:
            if isinstance(item, ToolCall) and item.name in ANSWER_TOOL_NAMES and item.name in self.registry:
                plan.answer_call = item
                break
        if plan.answer_call is not None:
            answer_index = next(i for i, c in enumerate(items) if c is plan.answer_call)
            plan.skipped = {i for i, c in enumerate(items) if isinstance(c, ToolCall) and i != answer_index}
            plan.run = [answer_index]
            return plan
        budget = self.max_tool_calls - self._calls_used
        if budget <= 0:
            plan.exhausted = True
            return plan
        for i, item in enumerate(items):
            if plan.consumed >= budget:
                plan.over_budget.add(i)
                continue
            plan.consumed += 1
            if isinstance(item, ToolCall) and item.name in self.registry:
                plan.run.append(i)
        return plan

    # -- execution -------------------------------------------------------------------------------
    async def _run_one(self, call: ToolCall, turn: int) -> tuple[ToolResult, float]:
        tool = self.registry[call.name]
        ctx = self._ctx.for_call(call.id, turn)
        start = time.perf_counter()
        try:
            if self.tool_timeout_s is not None:
                result = await asyncio.wait_for(tool.ainvoke(call.arguments, ctx), self.tool_timeout_s)
            else:
                result = await tool.ainvoke(call.arguments, ctx)
        except TimeoutError:
            result = ToolResult.error(f"tool '{call.name}' did not finish within {self.tool_timeout_s:g} s", "timeout")
        return result, time.perf_counter() - start

    async def _execute(self, plan: _Plan) -> dict[int, tuple[ToolResult, float]]:
        """Results by item index (ids may repeat when a server supplies them)."""
        calls = [(i, c) for i in plan.run if isinstance(c := plan.items[i], ToolCall)]
        if self.parallel and len(calls) > 1:
            outs = await asyncio.gather(*(self._run_one(c, plan.turn) for _, c in calls))
        else:
            outs = [await self._run_one(c, plan.turn) for _, c in calls]
        return {i: out for (i, _), out in zip(calls, outs)}

    def _answer_action(self, plan: _Plan, results: dict[int, tuple[ToolResult, float]]) -> tuple[Action | None, bool]:
        """The action for the inner env (if this turn answers) and whether to force the end."""
        if plan.is_final_text:
            return plan.text_action, False
        for index in plan.run:
            res = results[index][0]
            if res.final_answer is not None and not res.is_error:
                return Action(text=res.final_answer), res.end_episode
        return None, False

    def step(self, action: Action | str) -> StepResult:
        plan = self._plan(action)
        results = run_sync(self._execute(plan)) if plan.run else {}
        answer, force_end = self._answer_action(plan, results)
        inner = self._inner.step(answer) if answer is not None else None
        return self._finish(plan, results, inner, force_end)

    async def astep(self, action: Action | str) -> StepResult:
        plan = self._plan(action)
        results = await self._execute(plan) if plan.run else {}
        answer, force_end = self._answer_action(plan, results)
        inner = await self._inner.astep(answer) if answer is not None else None
        return self._finish(plan, results, inner, force_end)

    # -- results -> observation ------------------------------------------------------------------
    def _finish(
        self,
        plan: _Plan,
        results: dict[int, tuple[ToolResult, float]],
        inner: StepResult | None,
        force_end: bool,
    ) -> StepResult:
        """The step's outcome: one tool message per item, then the inner env's step if it answered."""
        self._turn += 1
        budget_was_spent = self._calls_used >= self.max_tool_calls
        self._calls_used += plan.consumed
        messages, errors, timing = self._tool_messages(plan, results)
        if plan.items and plan.answer_call is None:
            self._stats["tool_turns"] += 1
        self._stats["budget_left"] = max(0, self.max_tool_calls - self._calls_used)
        # capped per step, so that reward_range holds however many junk calls one turn holds
        penalty = -(self.error_penalty * min(errors, self._penalty_cap)) if errors and self.error_penalty else 0.0
        timing_info = {"tools_s": sum(timing.values()), "per_call_s": timing} if timing else {}
        if inner is None:
            return self._tool_step(plan, messages, penalty, timing_info, budget_was_spent)
        return self._answer_step(inner, messages, penalty, timing_info, force_end)

    def _tool_messages(
        self, plan: _Plan, results: dict[int, tuple[ToolResult, float]]
    ) -> tuple[list[Message], int, dict[str, float]]:
        """(one message per item in order, failed attempts, seconds per call id that ran)."""
        messages: list[Message] = []
        errors = 0
        timing: dict[str, float] = {}
        for i, item in enumerate(plan.items):
            if isinstance(item, ParseError):
                message, failed = self._parse_error_message(item, over_budget=i in plan.over_budget), True
            elif i in plan.run:
                result, elapsed = results[i]
                timing[item.id] = elapsed
                message, failed = self._result_message(item, result, is_answer=item is plan.answer_call)
            else:
                message, failed = self._not_run_message(i, item, plan)
            messages.append(message)
            errors += failed
        return messages, errors, timing

    def _parse_error_message(self, item: ParseError, *, over_budget: bool) -> Message:
        self._stats["parse_errors"] += 1
        text = f"could not parse your tool call: {item.message}"
        if over_budget:
            text += " (" + self._budget_text(spent_earlier=False) + ")"
        return self._error_message(item.call_id, None, text)

    def _not_run_message(self, index: int, call: ToolCall, plan: _Plan) -> tuple[Message, bool]:
        """Why ``call`` did not run: budget, an answer in the same turn, or no such tool."""
        if plan.exhausted:
            reason = self._budget_text(spent_earlier=True)
        elif index in plan.skipped:
            self._stats["skipped_calls"] += 1
            text = "not run: the answer in this turn ended the tool phase"
            return Message.tool(text, tool_call_id=call.id, name=call.name), False
        elif index in plan.over_budget:
            reason = self._budget_text(spent_earlier=False)
        else:
            reason = self.registry.unknown_tool_message(call.name)
        self._stats["tool_errors"] += 1
        return self._error_message(call.id, call.name, reason), True

    def _result_message(self, call: ToolCall, result: ToolResult, *, is_answer: bool) -> tuple[Message, bool]:
        """The message for a call that ran, and whether it failed (counted per tool)."""
        stats = self._stats
        stats["tool_calls"] += 1
        per = stats["per_tool"].setdefault(call.name, {"calls": 0, "errors": 0})
        per["calls"] += 1
        if not result.is_error:
            return Message.tool(*self._finish_content(result.content), tool_call_id=call.id, name=call.name), False
        stats["tool_errors"] += 1
        per["errors"] += 1
        if is_answer:
            self._calls_used += 1  # a failed answer must not loop for free
        text = result.text
        if result.error_kind == "bad_arguments":
            params = json.dumps(self.registry[call.name].spec.parameters, ensure_ascii=False)
            text += f" The parameters are: {params}"
        return self._error_message(call.id, call.name, text), True

    def _tool_step(
        self, plan: _Plan, messages: list[Message], penalty: float, timing_info: dict[str, Any], budget_was_spent: bool
    ) -> StepResult:
        """A turn that only called tools: the episode goes on unless it broke the budget."""
        # a failed answer call after the budget was spent ends the episode too
        truncated = plan.exhausted or (plan.answer_call is not None and budget_was_spent)
        if self._calls_used >= self.max_tool_calls and not truncated and messages:
            messages[-1] = _append_text(messages[-1], self._budget_text(spent_earlier=False, now=True))
        info: dict[str, Any] = {"success": False, "reward_components": {"tool_penalty": float(penalty)}}
        if truncated:
            info["truncation"] = "tool_budget"
        obs = Observation(messages, tools=[] if truncated else self._advertised())
        info["tools"] = self._stats_copy()
        if timing_info:
            info["timing"] = timing_info
        return obs, float(penalty), False, bool(truncated), info

    def _answer_step(
        self, inner: StepResult, messages: list[Message], penalty: float, timing_info: dict[str, Any], force_end: bool
    ) -> StepResult:
        """A turn that answered: the inner env's step, after this turn's tool messages."""
        inner_obs, reward, terminated, truncated, inner_info = inner
        self._answer_turns += 1
        info = dict(inner_info)
        if force_end:
            self._stats["finished"] = True
            terminated = terminated or not truncated
        if not (terminated or truncated) and self._answer_turns >= int(self._inner.max_turns):
            truncated = True
            info.setdefault("truncation", "max_turns")
        adopted = self._adopt(inner_obs, tools=not (terminated or truncated))
        obs = Observation(messages + adopted.messages, tools=adopted.tools)
        if penalty:
            components = dict(info.get("reward_components") or {"env": float(reward)})
            components["tool_penalty"] = float(penalty)
            info["reward_components"] = components
            reward = float(reward) + penalty
        info["tools"] = self._stats_copy()
        if timing_info:
            timing_all = dict(info.get("timing") or {})
            timing_all.update(timing_info)
            info["timing"] = timing_all
        return obs, reward, terminated, truncated, info

    def _budget_text(self, *, spent_earlier: bool, now: bool = False) -> str:
        if now:
            return (
                f"You have used all {self.max_tool_calls} tool calls of this episode. "
                "Reply with your final answer now, without calling tools."
            )
        if spent_earlier:
            return (
                f"tool budget exhausted (max_tool_calls={self.max_tool_calls}): no more tool calls are allowed; "
                "the episode ends because tools were called again instead of answering."
            )
        return (
            f"tool budget exhausted (max_tool_calls={self.max_tool_calls}): this call was not run; "
            "answer without calling tools."
        )

    def _error_message(self, cid: str | None, name: str | None, text: str) -> Message:
        return Message.tool(TextPart(self._truncate(f"Error: {text}")), tool_call_id=cid, name=name)

    def _advertised(self) -> list[Any]:
        """The tools callable now: all of them, or only the answer tools once the budget is spent."""
        if self._calls_used < self.max_tool_calls:
            return self.registry.specs()
        return [t.spec for t in self.registry if t.name in ANSWER_TOOL_NAMES]

    # -- content: truncation and media ids -------------------------------------------------------
    def _truncate(self, text: str) -> str:
        limit = self.max_result_chars
        if len(text) <= limit:
            return text
        self._stats["truncated_results"] += 1
        return self._truncate_to(text, limit)

    def _new_media_id(self, prefix: str) -> str:
        while True:
            self._media_counter += 1
            candidate = f"{prefix}_{self._media_counter}"
            if candidate not in self._ctx.images:
                return candidate

    def _finish_content(self, parts: Sequence[ContentPart]) -> list[ContentPart]:
        text_budget = self.max_result_chars
        out: list[ContentPart] = []
        texts = [p for p in parts if isinstance(p, TextPart)]
        total_text = sum(len(p.text) for p in texts)
        for part in parts:
            if isinstance(part, TextPart):
                if total_text > text_budget:
                    share = max(100, text_budget * len(part.text) // max(1, total_text))
                    part = TextPart(self._truncate_to(part.text, share))
                out.append(part)
            elif isinstance(part, ImagePart):
                pid = part.id if part.id and part.id not in self._ctx.images else self._new_media_id("img")
                image = ImagePart(part.image, id=pid)
                self._ctx.images[pid] = image
                out.append(TextPart(f"[image id: {pid}, {part.image.width}x{part.image.height}]"))
                out.append(image)
            elif isinstance(part, AudioPart):
                pid = part.id or self._new_media_id("audio")
                out.append(TextPart(f"[audio id: {pid}, {part.duration_s:.2f} s]"))
                out.append(AudioPart(part.waveform, part.sample_rate, id=pid))
            elif isinstance(part, VideoPart):
                pid = part.id or self._new_media_id("video")
                out.append(TextPart(f"[video id: {pid}, {part.num_frames} frames]"))
                out.append(VideoPart(part.frames, part.fps, id=pid))
        if total_text > text_budget:
            self._stats["truncated_results"] += 1
        return out or [TextPart("(no output)")]

    @staticmethod
    def _truncate_to(text: str, limit: int) -> str:
        if len(text) <= limit:
            return text
        head = limit * 2 // 3
        tail = limit - head
        return f"{text[:head]}\n[... {len(text) - head - tail} characters truncated ...]\n{text[-tail:]}"

    def _adopt(self, obs: Observation, *, tools: bool) -> Observation:
        """Give every image of an inner observation an id, register it for the tools, label it
        when asked, and advertise the tools."""
        messages: list[Message] = []
        for msg in obs.messages:
            content: list[ContentPart] = []
            changed = False
            for part in msg.content:
                if isinstance(part, ImagePart):
                    pid = part.id or self._new_media_id("img")
                    if part.id is None:
                        part = ImagePart(part.image, id=pid)
                        changed = True
                    self._ctx.images[pid] = part
                    if self.label_images:
                        content.append(TextPart(f"[image id: {pid}]"))
                        changed = True
                content.append(part)
            if changed:
                msg = Message(msg.role, content, tool_call_id=msg.tool_call_id, name=msg.name, tool_calls=list(msg.tool_calls))
            messages.append(msg)
        return Observation(messages, tools=self._advertised() if tools else [])

    def _stats_copy(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._stats))


def _append_text(msg: Message, note: str) -> Message:
    return Message(msg.role, [*msg.content, TextPart("\n" + note)], tool_call_id=msg.tool_call_id, name=msg.name)


__all__ = ["ToolEnv"]
