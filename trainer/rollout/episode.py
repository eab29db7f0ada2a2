"""One episode, token-in/token-out: env.reset -> [generate -> env.step -> observation delta] x turns.

:class:`EpisodeRunner` owns the token lists while the episode runs and turns them into
:class:`Trajectory` samples at the end. The token ids are a :class:`relax_gym.chat.ChatContext`,
the encoder ``relax-gym eval`` uses too, so training and evaluation see the same prompts. The
rules (see ``docs/rollout.md``):

* the prompt is the first observation rendered by the chat template with the tools, mask 0;
* each generated segment is appended from the engine's ``output_ids`` with its logprobs, mask 1
  and the weight version that sampled each token;
* the template's closing glue follows (only the part the engine did not sample), mask 0;
* each observation is appended as a render-and-trim delta ending in the next generation
  prompt, mask 0; its images join the request's ``image_data`` after the earlier ones;
* an aborted segment (pause for a weight update) keeps its tokens and is continued by the next
  request; a failed request is retried on another engine from the last completed state;
* nothing raises out of :meth:`EpisodeRunner.run`: every failure becomes a stop reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relax_gym.chat import ChatCodec, ChatContext, DriftReport, Rendered, Reply, TemplateError
from relax_gym.core import Env
from relax_gym.errors import MediaError
from relax_gym.threads import run_in_thread
from relax_gym.protocol import (
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
)
from relax_gym.types import Action, Message, Observation, ToolCall
from relax_gym.audio import collapse_audio_tokens
from relax_gym.video import collapse_spans
from relax_gym.vision import collapse_image_tokens

from relax_gym.trainer.rollout.config import RolloutConfig
from relax_gym.trainer.rollout.metrics import RolloutMetrics
from relax_gym.trainer.rollout.router import EngineRouter, NoEngineAvailable, parse_weight_version
from relax_gym.trainer.rollout.trajectory import StopReason, Trajectory, TurnRecord, json_safe

TurnGate = Callable[[], Awaitable[None]]
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class _EpisodeStop(Exception):
    """Ends the episode with a stop reason (internal control flow)."""

    def __init__(self, reason: StopReason, error: str | None = None) -> None:
        super().__init__(error or reason)
        self.reason = reason
        self.error = error


@dataclass(slots=True)
class Segment:
    """One assistant turn's generated tokens, possibly gathered over several requests."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str = "stop"
    engine_ids: list[str] = field(default_factory=list)
    latency_s: float = 0.0
    resumes: int = 0
    failovers: int = 0


class _Part:
    """One training sample under construction: the episode's :class:`ChatContext` (the token ids,
    shared with evaluation) and the lists that run in parallel to its ids."""

    def __init__(self, chat: ChatContext) -> None:
        self.chat = chat
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.turns: list[TurnRecord] = []
        self._pad(len(chat.ids))

    def _pad(self, n: int) -> None:
        self.mask.extend([0] * n)
        self.logprobs.extend([0.0] * n)
        self.versions.extend([-1] * n)

    def add_observation(self, delta: Rendered, messages: list[dict[str, Any]]) -> None:
        self.chat.extend(delta, messages)
        self._pad(len(delta.ids))

    def add_reply(self, segment: Segment) -> Reply:
        """The sampled tokens (mask 1, with their logprobs and versions), then the glue (mask 0)."""
        reply = self.chat.add_reply(segment.ids)
        self.mask.extend([1] * len(segment.ids))
        self.logprobs.extend(segment.logprobs)
        self.versions.extend(segment.versions)
        self._pad(len(reply.glue))
        return reply


@dataclass(slots=True)
class EpisodeSpec:
    """What to run: an env (registered id, or a factory with ``env_id`` as its label), a seed,
    reset options. ``group_id`` defaults to ``"<env_id>#<seed>"``: all samples of a group share
    the env and seed (the same prompt) for GRPO-style advantages."""

    env_id: str
    seed: int | None = None
    options: dict[str, Any] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_factory: Callable[[], Env] | None = None
    group_id: str | None = None
    max_new_tokens: int | None = None  # this episode's per-turn budget (default: the config's)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        return self.group_id if self.group_id is not None else f"{self.env_id}#{self.seed}"


class EpisodeRunner:
    """Runs one episode against the router and returns its training sample(s)."""

    def __init__(self, *, spec: EpisodeSpec, sample_index: int, episode_id: str, router: EngineRouter,
                 codec: ChatCodec, config: RolloutConfig, metrics: RolloutMetrics,
                 turn_gate: TurnGate | None = None, stopping: asyncio.Event | None = None) -> None:
        self.spec = spec
        self.sample_index = sample_index
        self.episode_id = episode_id
        self.router = router
        self.codec = codec
        self.config = config
        self.metrics = metrics
        self.turn_gate = turn_gate
        self.stopping = stopping or asyncio.Event()
        self.parts: list[_Part] = []  # one per training sample; the first starts with the prompt
        self.messages: list[Message] = []
        self.tools: list[dict[str, Any]] = []
        self.reward = 0.0
        self.reward_components: dict[str, float] = {}
        self.success = False
        self._requests = 0
        self._prompt_len = 0  # prompt tokens of the last request, image pads expanded
        self.media_errors: list[str] = []  # reasons of the clips replaced by an error text, in order
        stops = sorted(set(config.stop_token_ids or []) | codec.reserved_ids)
        self._stop_ids: list[int] | None = stops or None

    @property
    def part(self) -> _Part:
        return self.parts[-1]

    # -- the loop -------------------------------------------------------------------------------------
    async def run(self) -> list[Trajectory]:
        self.metrics.episodes_started += 1
        env: Env | None = None
        reason: StopReason = "env_done"
        error: str | None = None
        try:
            env = await self._make_env()
            reason = await self._loop(env)
        except _EpisodeStop as stop:
            reason, error = stop.reason, stop.error
        except asyncio.CancelledError:
            reason, error = "aborted", "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 -- a bug must fail one episode, not the batch
            reason, error = "env_error", f"unexpected {type(exc).__name__}: {exc}"
        finally:
            self.router.end_session(self.episode_id)
            if env is not None:
                try:
                    env.close()
                except Exception as exc:  # noqa: BLE001 -- a failing close must not lose the sample
                    log.warning("closing the env of %s failed: %s", self.episode_id, exc)
        return self._finish(reason, error)

    async def _make_env(self) -> Env:
        try:
            if self.spec.env_factory is not None:
                return await run_in_thread(self.spec.env_factory)
            import relax_gym

            # Resolve the id on the event loop's thread: the registry loads its plugins on first
            # use, and two worker threads racing through that first load can miss each other's envs.
            env_spec = relax_gym.spec(self.spec.env_id)
            return await run_in_thread(env_spec.make, **self.spec.env_kwargs)
        except Exception as exc:  # noqa: BLE001
            self.metrics.env_errors += 1
            raise _EpisodeStop("env_error", f"cannot make {self.spec.env_id}: {type(exc).__name__}: {exc}") from None

    async def _env_call(self, what: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.env_timeout_s):  # no extra task, unlike wait_for
                return await fn()
        except TimeoutError:
            self.metrics.env_errors += 1
            raise _EpisodeStop("env_error", f"env.{what} timed out after {self.config.env_timeout_s} s") from None
        except Exception as exc:  # noqa: BLE001
            self.metrics.env_errors += 1
            raise _EpisodeStop("env_error", f"env.{what} raised {type(exc).__name__}: {exc}") from None
        finally:
            self.metrics.env_time_s += time.perf_counter() - start

    def _step_fn(self, env: Env, action: Action) -> Callable[[], Awaitable[Any]]:
        if self.config.env_in_thread:
            return lambda: env.astep(action)

        async def inline() -> Any:
            return env.step(action)

        return inline

    def _reset_fn(self, env: Env) -> Callable[[], Awaitable[Any]]:
        seed, options = self.spec.seed, self.spec.options
        if self.config.env_in_thread:
            return lambda: env.areset(seed=seed, options=options)

        async def inline() -> Any:
            return env.reset(seed=seed, options=options)

        return inline

    def _render_messages(self, env: Env, obs: Observation) -> list[dict[str, Any]]:
        try:
            raw = env.format_observation(obs, "hf")
        except Exception as exc:  # noqa: BLE001
            self.metrics.env_errors += 1
            raise _EpisodeStop("env_error", f"format_observation raised {type(exc).__name__}: {exc}") from None
        msgs, replaced = self.codec.adapt_messages(raw)
        self.metrics.media_placeholders += replaced
        return msgs

    async def _loop(self, env: Env) -> StopReason:
        obs, _info = await self._env_call("reset", self._reset_fn(env))
        if not isinstance(obs, Observation):
            raise _EpisodeStop("env_error", f"reset returned {type(obs).__name__}, expected Observation")
        self.messages.extend(obs.messages)
        self.tools = [t.to_openai() for t in obs.tools]
        system = self.config.system_prompt
        chat, first = self._template_media(
            lambda msgs: ChatContext(self.codec, msgs, self.tools, system_prompt=system), self._render_messages(env, obs))
        if system and len(chat.messages) > len(first):  # the config's system prompt went first
            self.messages.insert(0, Message.system(system))
        self.parts.append(_Part(chat))
        if chat.prompt_length >= self.config.max_total_tokens:
            raise _EpisodeStop("max_tokens", f"the prompt has {chat.prompt_length} tokens")

        max_turns = self.config.max_turns or getattr(env, "max_turns", None) or 1_000_000
        for turn in range(max_turns):
            if self.stopping.is_set():
                return "aborted"
            if self.turn_gate is not None:
                await self.turn_gate()
            budget = self.config.max_total_tokens - len(self.part.chat.ids)
            if budget <= 0:
                return "max_tokens"
            max_new = min(self.spec.max_new_tokens or self.config.max_new_tokens, budget)
            segment = await self._generate(max_new)
            reply = self.part.add_reply(segment)
            raw_text = reply.text
            if segment.finish == "abort":  # the manager is stopping: keep what we have
                self._record_turn(turn, segment, raw_text, None, 0.0, 0.0, {}, False, False, [])
                return "aborted"

            action = Action(text=reply.action_text)
            start = time.perf_counter()
            result = await self._env_call("step", self._step_fn(env, action))
            env_latency = time.perf_counter() - start
            try:
                obs, reward, terminated, truncated, info = result
                reward = float(reward)
            except (TypeError, ValueError) as exc:
                raise _EpisodeStop("env_error", f"step returned a malformed result: {exc}") from None
            info = info if isinstance(info, dict) else {}
            self._accumulate_reward(reward, info)
            self._record_turn(turn, segment, raw_text, obs, reward, env_latency, info, bool(terminated),
                              bool(truncated), obs.messages if isinstance(obs, Observation) else [])
            if terminated:
                return "env_done"
            if truncated:
                return "max_turns" if info.get("truncation") == "max_turns" else "env_truncated"
            if not isinstance(obs, Observation):
                raise _EpisodeStop("env_error", f"step returned {type(obs).__name__}, expected Observation")
            if turn + 1 >= max_turns:
                return "max_turns"
            if obs.tools and [t.to_openai() for t in obs.tools] != self.tools:
                self.metrics.tools_changed += 1
            new_msgs = self._render_messages(env, obs)
            if self.config.think_policy == "split" and self._needs_split(new_msgs):
                self._start_new_part(new_msgs)
            else:
                delta, new_msgs = self._template_media(self.part.chat.observation, new_msgs)
                if len(self.part.chat.ids) + len(delta.ids) >= self.config.max_total_tokens:
                    return "max_tokens"
                self.part.add_observation(delta, new_msgs)
        return "max_turns"

    def _template(self, fn: Callable[[], _T]) -> _T:
        try:
            out = fn()
        except TemplateError as exc:
            self.metrics.template_errors += 1
            raise _EpisodeStop("env_error", f"chat template: {exc}") from None
        except MediaError as exc:  # not one clip's fault (e.g. too many clips): this episode ends, counted
            self._count_media_errors([exc])
            raise _EpisodeStop("env_error", f"media: {exc}") from None
        self.metrics.video_reduced.update(getattr(out, "video_reduced", ()))
        return out

    def _template_media(self, build: Callable[[list[dict[str, Any]]], _T],
                        msgs: list[dict[str, Any]]) -> tuple[_T, list[dict[str, Any]]]:
        """``build(msgs)`` through :meth:`_template`; a corrupt or over-budget clip in ``msgs``
        becomes a text error the model reads (counted by reason) and the episode goes on. Returns
        the result and the messages it encodes."""
        used = msgs

        def attempt() -> _T:  # _template reads the built context's video_reduced
            nonlocal used
            out, used = self.codec.build_screened(build, msgs, self._count_media_errors)
            return out

        return self._template(attempt), used

    def _count_media_errors(self, errors: list[MediaError]) -> None:
        for exc in errors:
            self.metrics.media_errors[exc.reason] += 1
            self.media_errors.append(exc.reason)

    # -- split policy ---------------------------------------------------------------------------------
    def _needs_split(self, new_msgs: list[dict[str, Any]]) -> bool:
        return self.part.chat.drops_reasoning(new_msgs)

    def _start_new_part(self, new_msgs: list[dict[str, Any]]) -> None:
        """Close the current sample and start one whose context is the template's own render of
        the conversation so far (earlier reasoning dropped as the template wants)."""
        chat, _ = self._template_media(lambda msgs: ChatContext(self.codec, msgs, self.tools),
                                       [*self.part.chat.messages, *new_msgs])
        if chat.prompt_length >= self.config.max_total_tokens:
            raise _EpisodeStop("max_tokens", "the re-rendered context of a new sample exceeds max_total_tokens")
        self.parts.append(_Part(chat))

    # -- generation -----------------------------------------------------------------------------------
    def _request(self, part: _Part, segment: Segment, max_new: int) -> GenerateRequest:
        cfg = self.config
        self._requests += 1
        seed = None
        if cfg.sampling_seed is not None:  # reproducible per (run seed, group, sample, request)
            key = f"{cfg.sampling_seed}:{self.spec.group}:{self.sample_index}:{self._requests}"
            seed = zlib.crc32(key.encode()) & 0x7FFFFFFF
        ids = part.chat.ids + segment.ids
        self._prompt_len = len(ids)  # the prompt the engine should report (pads expanded)
        if part.chat.video_spans and self.codec.vision is not None and self.codec.vision.video is not None:
            # one video pad per video, as the template renders it (SGLang's processor expands it)
            ids = collapse_spans(ids, part.chat.video_spans, self.codec.vision.video.video_token_id)
        if part.chat.audio_payloads and self.codec.audio is not None:  # one audio pad per clip, as rendered
            ids = collapse_audio_tokens(ids, self.codec.audio.audio_token_id)
        if part.chat.payloads and self.codec.vision is not None:
            # one image pad per image, as the chat template renders it: SGLang's Qwen3-VL
            # processor expands each pad itself and keeps every other id as sent, while a run of
            # pads would be read as one image per pad (the embedded engine takes either form)
            ids = collapse_image_tokens(ids, self.codec.vision.image_token_id)
        return GenerateRequest(
            input_ids=ids,
            image_data=list(part.chat.payloads) or None,
            video_data=list(part.chat.video_payloads) or None,
            audio_data=list(part.chat.audio_payloads) or None,
            sampling_params=SamplingParams(
                max_new_tokens=max_new - len(segment.ids), temperature=cfg.temperature, top_p=cfg.top_p,
                top_k=cfg.top_k, min_p=0.0, stop_token_ids=self._stop_ids, skip_special_tokens=False,
                sampling_seed=seed,
            ),
            return_logprob=True,
            rid=f"{self.episode_id}:{self._requests}",
        )

    async def _generate(self, max_new: int) -> Segment:
        """Generate one assistant segment: retries failed requests elsewhere (from the same
        state) and continues aborted ones (keeping their tokens) until stop or length."""
        segment = Segment()
        part = self.part
        while True:
            if self.stopping.is_set():
                segment.finish = "abort"
                return segment
            request = self._request(part, segment, max_new)
            try:
                handle = await self.router.acquire(self.episode_id)
            except NoEngineAvailable as exc:
                self.metrics.engine_errors["no_engine"] += 1
                raise _EpisodeStop("engine_error", str(exc)) from None
            start = time.perf_counter()
            ok = False
            try:
                reply = await self.router.generate(handle, request, timeout_s=self.config.request_timeout_s)
                ok = True
            except (EngineUnavailable, EngineTimeout, EngineError) as exc:
                kind = type(exc).__name__
                self.metrics.engine_errors[kind] += 1
                retryable = not (type(exc) is EngineError and exc.status is not None and exc.status < 500)
                if not retryable:
                    raise _EpisodeStop("engine_error", f"{handle.id}: {exc}") from None
                await self.router.report_failure(self.episode_id, handle, str(exc),
                                                 unreachable=isinstance(exc, EngineUnavailable))
                if isinstance(exc, EngineTimeout):  # free the engine's slot; best effort
                    _background(handle.client.abort(request.rid))
                segment.failovers += 1
                self.metrics.failovers += 1
                if segment.failovers > self.config.max_failovers_per_turn:
                    raise _EpisodeStop("engine_error", f"turn failed on {segment.failovers} engines; last: {exc}") from None
                continue
            finally:
                elapsed = time.perf_counter() - start
                self.router.release(handle, ok=ok)
                segment.latency_s += elapsed
                self.metrics.engine_time_s += elapsed
                self.metrics.requests += 1
            self._take(reply, request, handle.id, segment)
            if segment.finish != "abort":
                return segment
            if self.stopping.is_set():
                return segment
            if len(segment.ids) >= max_new:
                segment.finish = "length"
                return segment
            segment.resumes += 1
            self.metrics.resumes += 1
            if segment.resumes > self.config.max_resumes_per_turn:
                raise _EpisodeStop("aborted", f"segment aborted {segment.resumes} times")

    def _take(self, reply: GenerateResponse, request: GenerateRequest, engine_id: str, segment: Segment) -> None:
        """Append a reply's tokens to the segment after checking it is well formed."""
        try:
            ids = reply.token_ids()
            logprobs = reply.token_logprobs()
        except EngineError as exc:
            self.metrics.engine_errors["malformed_reply"] += 1
            raise _EpisodeStop("engine_error", f"{engine_id}: {exc}") from None
        finish = reply.finish_type
        problem = None
        if len(ids) != len(logprobs):
            problem = f"{len(ids)} output ids but {len(logprobs)} logprobs"
        elif finish is None:
            problem = "no finish_reason"
        elif len(ids) > request.sampling_params.max_new_tokens:
            problem = f"{len(ids)} tokens for max_new_tokens={request.sampling_params.max_new_tokens}"
        elif not ids and finish != "abort":
            problem = f"no tokens with finish_reason {finish}"
        elif any(math.isnan(lp) or lp > 1e-6 for lp in logprobs):
            problem = "a logprob is NaN or positive"
        if problem is not None:
            self.metrics.engine_errors["malformed_reply"] += 1
            raise _EpisodeStop("engine_error", f"{engine_id}: malformed reply: {problem}")
        expected_prompt = self._prompt_len
        if reply.meta_info.prompt_tokens and reply.meta_info.prompt_tokens != expected_prompt:
            self.metrics.engine_prompt_mismatch += 1
        versions = _token_versions(reply, len(ids))
        cut = self.codec.first_reserved(ids)
        if cut is not None:  # the model emitted a vision placeholder: keep the exact prefix before it
            ids, logprobs, versions, finish = ids[:cut], logprobs[:cut], versions[:cut], "stop"
            self.metrics.reserved_tokens_cut += 1
        segment.ids.extend(ids)
        segment.logprobs.extend(float(x) for x in logprobs)
        segment.versions.extend(versions)
        segment.finish = finish or "stop"
        if not segment.engine_ids or segment.engine_ids[-1] != engine_id:
            segment.engine_ids.append(engine_id)

    # -- records --------------------------------------------------------------------------------------
    def _accumulate_reward(self, reward: float, info: dict[str, Any]) -> None:
        self.reward += reward
        components = info.get("reward_components")
        if isinstance(components, dict):
            for key, value in components.items():
                try:
                    self.reward_components[str(key)] = self.reward_components.get(str(key), 0.0) + float(value)
                except (TypeError, ValueError):
                    continue
        self.success = bool(info.get("success", False))

    def _record_turn(self, turn: int, segment: Segment, raw_text: str, obs: Observation | None, reward: float,
                     env_latency: float, info: dict[str, Any], terminated: bool, truncated: bool,
                     new_messages: list[Message]) -> None:
        calls = _tool_calls(info)
        errors = [str(e) for e in info["parse_errors"]] if isinstance(info.get("parse_errors"), list) else []
        if "tool_calls" not in info and self.tools and self.config.tool_parser:
            parsed = self._parse_for_record(raw_text, turn)
            if parsed is not None:
                calls, errors = parsed
        tool_latency = info.get("tool_latency_s")
        timing = info.get("timing")
        if tool_latency is None and isinstance(timing, dict):  # ToolEnv reports info["timing"]["tools_s"]
            tool_latency = timing.get("tools_s")
        self.messages.append(Message.assistant(raw_text, tool_calls=calls))
        self.messages.extend(new_messages)
        versions: list[int] = []
        for v in segment.versions:
            if not versions or versions[-1] != v:
                versions.append(v)
        self.part.turns.append(TurnRecord(
            index=turn,
            assistant_text=raw_text,
            num_sampled_tokens=len(segment.ids),
            finish_reason=segment.finish,
            tool_calls=calls,
            parse_errors=errors,
            observation_text=obs.text if isinstance(obs, Observation) else "",
            reward=reward,
            reward_components={str(k): float(v) for k, v in (info.get("reward_components") or {}).items()
                               if isinstance(v, (int, float))},
            terminated=terminated,
            truncated=truncated,
            engine_ids=segment.engine_ids,
            engine_latency_s=segment.latency_s,
            env_latency_s=env_latency,
            tool_latency_s=float(tool_latency) if isinstance(tool_latency, (int, float)) else None,
            weight_versions=versions,
            resumes=segment.resumes,
            failovers=segment.failovers,
            info=json_safe({k: v for k, v in info.items() if k not in ("tool_calls", "parse_errors")}),
        ))
        self.metrics.turns += 1

    def _parse_for_record(self, text: str, turn: int) -> tuple[list[ToolCall], list[str]] | None:
        """The turn's tool calls as ``relax_gym.tools`` parses them, for the turn record only."""
        try:
            from relax_gym.tools import get_parser

            action = get_parser(self.config.tool_parser or "hermes").parse(text, turn=turn)
        except Exception:  # noqa: BLE001 -- the record is best effort; the env parsed for itself
            return None
        return list(action.tool_calls), list(action.parse_errors)

    def _finish(self, reason: StopReason, error: str | None) -> list[Trajectory]:
        """The episode's samples (one empty sample when it failed before its prompt), counted."""
        self.metrics.episodes_finished += 1
        self.metrics.stop_reasons[reason] += 1
        parts: list[_Part | None] = list(self.parts) or [None]
        out: list[Trajectory] = []
        for index, part in enumerate(parts):
            drift = self._drift(part)
            self.metrics.drift[drift.kind] += 1
            if drift.drifted and not drift.expected:
                self.metrics.unexpected_drift += 1
            traj = self._sample(index, len(parts), part, drift, reason, error)
            self.metrics.samples += 1
            self.metrics.sampled_tokens += traj.num_sampled_tokens
            self.metrics.context_tokens += len(traj) - traj.num_sampled_tokens
            if traj.trainable:
                self.metrics.trainable_samples += 1
            out.append(traj)
        return out

    def _drift(self, part: _Part | None) -> DriftReport:
        if part is None or not self.config.check_drift:
            return DriftReport()
        try:
            return part.chat.check_drift(self.config.think_policy)
        except Exception as exc:  # noqa: BLE001 -- a failed check flags the sample, never crashes
            return DriftReport(kind="template", expected=False, detail=f"drift check failed: {exc}")

    def _sample(self, index: int, count: int, part: _Part | None, drift: DriftReport, reason: StopReason,
                error: str | None) -> Trajectory:
        chat = part.chat if part is not None else None
        return Trajectory(
            token_ids=chat.ids if chat is not None else [],
            loss_mask=part.mask if part is not None else [],
            rollout_logprobs=part.logprobs if part is not None else [],
            weight_versions=part.versions if part is not None else [],
            prompt_length=chat.prompt_length if chat is not None else 0,
            episode_id=self.episode_id,
            group_id=self.spec.group,
            sample_index=self.sample_index,
            env_id=self.spec.env_id,
            seed=self.spec.seed,
            part=index,
            num_parts=count,
            reward=self.reward,
            reward_components=dict(self.reward_components),
            success=self.success,
            stop_reason=reason,
            error=error,
            turns=part.turns if part is not None else [],
            messages=list(self.messages),
            tools=self.tools,
            images=chat.images if chat is not None else [],
            image_grid_thw=chat.grids if chat is not None else [],
            image_token_id=self.codec.vision.image_token_id if self.codec.vision is not None else None,
            videos=chat.videos if chat is not None else [],
            video_grid_thw=chat.video_grids if chat is not None else [],
            video_token_id=self.codec.vision.video.video_token_id
            if self.codec.vision is not None and self.codec.vision.video is not None else None,
            audios=chat.audios if chat is not None else [],
            audio_token_id=self.codec.audio.audio_token_id if self.codec.audio is not None else None,
            drift=drift,
            metadata={**self.spec.metadata,
                      **({"video_reduced": list(chat.video_reduced)} if chat is not None and chat.video_reduced else {}),
                      **({"media_errors": list(self.media_errors)} if self.media_errors else {})},
        )


def _token_versions(reply: GenerateResponse, n: int) -> list[int]:
    """Per-token weight versions from SGLang's ``meta_info.weight_versions`` spans (a request
    paused in place can span an update: tokens sampled before it keep the older version), else
    the reply's ``weight_version`` for every token."""
    return [parse_weight_version(v) for v in reply.meta_info.token_versions(n)]


def _tool_calls(info: dict[str, Any]) -> list[ToolCall]:
    """Tool calls an env (e.g. ToolEnv) reports in ``info["tool_calls"]``, as ToolCall objects."""
    raw = info.get("tool_calls")
    if not isinstance(raw, list):
        return []
    calls: list[ToolCall] = []
    for item in raw:
        if isinstance(item, ToolCall):
            calls.append(item)
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            args = item.get("arguments")
            calls.append(ToolCall(item["name"], dict(args) if isinstance(args, dict) else {}, str(item.get("id", ""))))
    return calls


_BACKGROUND: set[asyncio.Task[None]] = set()


def _background(awaitable: Awaitable[Any]) -> None:
    """Fire and forget, keeping a reference until done and swallowing the outcome."""

    async def quiet() -> None:
        try:
            await awaitable
        except Exception as exc:  # noqa: BLE001 -- best effort by design
            log.debug("background call failed: %s", exc)

    task = asyncio.ensure_future(quiet())
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


__all__ = ["EpisodeRunner", "EpisodeSpec", "Segment"]
