"""Supervised warm-start from oracle trajectories (the ``warmup:`` phase and ``relax-gym sft``).

A random-weight model never samples a correct answer, so RL has no signal. Every shipped env has
an oracle; :func:`oracle_trajectory` plays an episode with it and lays the conversation out
*exactly* as the rollout manager would have for a model that wrote the oracle's actions: the
prompt rendered by the chat template (a :class:`~relax_gym.chat.ChatContext`, the encoder rollouts
and evaluation use, images expanded to their patch counts), each assistant turn as the tokens the model would sample
(content, then the end-of-turn token, loss mask 1), the template's closing glue and each
observation delta with loss mask 0. SFT then maximises the likelihood of the mask-1 tokens, and
the token layout the model is trained on is the one it will see at rollout time.

:class:`WarmupPhase` runs the SFT steps with fresh oracle episodes (seeds from
``warmup.seed_start``, disjoint from RL and evaluation seeds), evaluates on the held-out episodes
every ``warmup.eval_every`` steps, and stops early once success reaches ``warmup.stop_at_success``
-- the way to hand RL a policy that has learnt the answer format but still has most of the task
to learn.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from relax_gym.chat import ChatCodec, ChatContext
from relax_gym.types import Action, Message, Observation
from relax_gym.trainer.backends.base import NLLObjective, OptimizerSettings, SequenceBatch, TrainerBackend
from relax_gym.trainer.config import EnvEntry, WarmupConfig
from relax_gym.trainer.rollout import EpisodeSpec, Trajectory, TurnRecord

class OracleError(Exception):
    """An oracle episode could not be turned into a training sample (counted, skipped)."""


def assistant_text(codec: ChatCodec, action: Action | str) -> str:
    """What the model must write for ``action``: its text, plus its tool calls in the chat
    template's own tool-call format (rendered by the template, then cut out)."""
    act = Action.coerce(action)
    if not act.tool_calls:
        return act.text
    calls = [{"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
             for c in act.tool_calls]
    convo = [{"role": "user", "content": "x"}]
    # the generation prompt is everything the template writes before the assistant's content
    # (header and, for Qwen3 without thinking, the empty think block)
    before = codec.render(convo, add_generation_prompt=True)
    full = codec.render([*convo, {"role": "assistant", "content": act.text, "tool_calls": calls}])
    glue = codec.decode(codec.closing_glue)
    if not full.startswith(before) or not full.endswith(glue):
        raise OracleError("the chat template does not render assistant tool calls recognisably")
    return full[len(before): len(full) - len(glue)]


def _render(env: Any, codec: ChatCodec, obs: Observation) -> list[dict[str, Any]]:
    msgs, _ = codec.adapt_messages(env.format_observation(obs, "hf"))
    return msgs


def oracle_trajectory(spec: EpisodeSpec, codec: ChatCodec, *, max_turns: int | None = None,
                      max_total_tokens: int = 4096, system_prompt: str | None = None) -> Trajectory:
    """Play ``spec`` with the env's oracle; the episode as a training sample (see module doc).

    Raises :class:`OracleError` when the env has no oracle, the oracle fails, or the sample is
    longer than ``max_total_tokens``.
    """
    import relax_gym

    env = relax_gym.make(spec.env_id, **spec.env_kwargs)
    try:
        if not env.has_oracle:
            raise OracleError(f"{spec.env_id} has no oracle")
        obs, _ = env.reset(seed=spec.seed, options=spec.options)
        first = _render(env, codec, obs)
        messages: list[Message] = list(obs.messages)
        tools = [t.to_openai() for t in obs.tools]
        chat = ChatContext(codec, first, tools, system_prompt=system_prompt)
        if system_prompt and len(chat.messages) > len(first):  # the system prompt went first
            messages.insert(0, Message.system(system_prompt))
        mask = [0] * chat.prompt_length
        end_token = codec.closing_glue[:1]
        oracle = iter(env.oracle())
        turns: list[TurnRecord] = []
        reward, success, info = 0.0, False, {}
        limit = max_turns or getattr(env, "max_turns", None) or 64
        for turn in range(limit):
            try:
                action = next(oracle)
            except StopIteration:
                raise OracleError(f"{spec.env_id} seed {spec.seed}: the oracle stopped before the episode ended") from None
            text = assistant_text(codec, action)
            sampled = codec.encode(text) + end_token
            glue = chat.add_reply(sampled).glue
            mask += [1] * len(sampled) + [0] * len(glue)
            obs, r, terminated, truncated, info = env.step(action)
            reward += float(r)
            success = bool(info.get("success", False))
            messages.append(Message.assistant(text))
            messages.extend(obs.messages)
            turns.append(TurnRecord(index=turn, assistant_text=text, num_sampled_tokens=len(sampled),
                                    finish_reason="stop", reward=float(r), terminated=bool(terminated),
                                    truncated=bool(truncated)))
            if terminated or truncated:
                break
            delta = chat.add_observation(_render(env, codec, obs))
            mask += [0] * len(delta.ids)
        if not success:
            raise OracleError(f"{spec.env_id} seed {spec.seed}: the oracle episode did not succeed")
        if len(chat.ids) > max_total_tokens:
            raise OracleError(f"{spec.env_id} seed {spec.seed}: {len(chat.ids)} tokens > max_total_tokens")
    finally:
        env.close()
    traj = Trajectory(
        token_ids=chat.ids, loss_mask=mask, rollout_logprobs=[0.0] * len(mask),
        weight_versions=[0 if m else -1 for m in mask], prompt_length=chat.prompt_length,
        episode_id=f"oracle:{spec.group}", group_id=spec.group, env_id=spec.env_id, seed=spec.seed,
        reward=reward, success=success, stop_reason="env_done", turns=turns, messages=messages, tools=tools,
        images=chat.images, image_grid_thw=chat.grids,
        image_token_id=codec.vision.image_token_id if codec.vision is not None else None,
        videos=chat.videos, video_grid_thw=chat.video_grids,
        video_token_id=codec.vision.video.video_token_id if codec.vision is not None and codec.vision.video else None,
        audios=chat.audios, audio_token_id=codec.audio.audio_token_id if codec.audio is not None else None,
        metadata={"oracle": True},
    )
    traj.validate()
    return traj


def sft_batch(trajectories: list[Trajectory], image_processor: Any | None) -> SequenceBatch:
    """Oracle samples as a backend batch (loss on the oracle's turns, temperature 1)."""
    multimodal = []
    for t in trajectories:
        if t.images or t.videos or t.audios:
            vis = t.vision_inputs(image_processor)
            multimodal.append({k: v for k, v in vis.items() if k != "mm_token_type_ids"})
        else:
            multimodal.append({})
    return SequenceBatch(input_ids=[t.token_ids for t in trajectories], loss_mask=[t.loss_mask for t in trajectories],
                         multimodal=multimodal, group_ids=[t.group_id for t in trajectories])


EvalFn = Callable[[int], Awaitable[dict[str, float]]]
LogFn = Callable[[int, dict[str, float], str], None]


@dataclass
class WarmupPhase:
    """The SFT steps of a run; resumable through ``step`` and the sampler state."""

    config: WarmupConfig
    backend: TrainerBackend
    codec: ChatCodec
    sampler: Any  # EpisodeSampler over the training envs, seeded from warmup.seed_start
    image_processor: Any | None
    evaluate: EvalFn | None = None  # syncs weights, returns held-out metrics incl. "success"
    log: LogFn | None = None
    max_total_tokens: int = 4096
    system_prompt: str | None = None
    step: int = 0
    done: bool = False
    last_eval: dict[str, float] = field(default_factory=dict)
    skipped: int = 0
    _ema: float | None = None

    def settings(self) -> OptimizerSettings:
        c = self.config
        return OptimizerSettings(lr=c.lr, schedule=c.lr_schedule, total_steps=c.steps, grad_clip=1.0)

    def build_batch(self, n: int) -> tuple[list[Trajectory], int]:
        """``n`` oracle samples (episodes whose oracle fails are skipped, at most ``4n`` tries)."""
        out: list[Trajectory] = []
        skipped = 0
        tries = 0
        while len(out) < n and tries < 4 * n:
            tries += 1
            spec = self.sampler.next(1, tag="sft")[0]
            try:
                out.append(oracle_trajectory(spec, self.codec, max_total_tokens=self.max_total_tokens,
                                             system_prompt=self.system_prompt))
            except OracleError:
                skipped += 1
        if not out:
            raise OracleError(f"no oracle sample could be built in {tries} tries (is there an oracle?)")
        return out, skipped

    async def run(self, on_step: Callable[[int], Awaitable[None]] | None = None) -> None:
        """Run the remaining SFT steps (from ``self.step``); stops early per the config."""
        if self.done:
            return
        c = self.config
        saved_micro = getattr(self.backend, "micro_batch_size", None)
        if saved_micro is not None:  # the warm-up's own micro-batch size while it runs
            self.backend.micro_batch_size = c.micro_batch_size  # type: ignore[attr-defined]
        try:
            await self._steps(on_step)
        finally:
            if saved_micro is not None:
                self.backend.micro_batch_size = saved_micro  # type: ignore[attr-defined]
        self.done = True

    async def _steps(self, on_step: Callable[[int], Awaitable[None]] | None) -> None:
        c = self.config
        while self.step < c.steps:
            trajs, skipped = await asyncio.to_thread(self.build_batch, c.batch_size)
            self.skipped += skipped
            batch = await asyncio.to_thread(sft_batch, trajs, self.image_processor)
            metrics = await asyncio.to_thread(self.backend.train_step, batch, NLLObjective())
            self.step += 1
            loss = metrics["loss"]
            self._ema = loss if self._ema is None else 0.8 * self._ema + 0.2 * loss
            metrics.update({"loss_ema": self._ema, "oracle_skipped": float(self.skipped)})
            if self.log is not None:
                self.log(self.step, metrics, "warmup")
            stop = c.stop_at_loss is not None and self._ema < c.stop_at_loss
            if self.evaluate is not None and c.eval_every and self.step % c.eval_every == 0:
                self.last_eval = await self.evaluate(self.step)
                if c.stop_at_success is not None and self.last_eval.get("success", 0.0) >= c.stop_at_success:
                    stop = True
            if on_step is not None:
                await on_step(self.step)
            if stop or not math.isfinite(loss):
                break

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "done": self.done, "skipped": self.skipped, "ema": self._ema,
                "last_eval": self.last_eval, "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.step = int(state.get("step", 0))
        self.done = bool(state.get("done", False))
        self.skipped = int(state.get("skipped", 0))
        self._ema = state.get("ema")
        self.last_eval = dict(state.get("last_eval") or {})
        self.sampler.load_state_dict(state.get("sampler") or {})


def describe_envs(envs: list[EnvEntry]) -> str:
    return json.dumps([{"id": e.id, **e.kwargs} for e in envs])


__all__ = ["OracleError", "WarmupPhase", "assistant_text", "oracle_trajectory", "sft_batch"]
