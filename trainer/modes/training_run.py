"""What every training mode shares: one run's set-up, engines, evaluation, warm-up and checkpoints.

:class:`TrainingRun` is the part of a run that does not depend on how batches are made:

* **set-up** -- validate the envs, build (or find) the model, the backend, the chat codec, the
  episode samplers, the reward composer and the warm-up phase; restore a checkpoint;
* **engines** -- start the configured engines (:class:`~relax_gym.trainer.engines.fleet.EngineFleet`),
  the router and the one :class:`~relax_gym.trainer.weights.publisher.WeightPublisher`;
* **evaluation** -- held-out success at the weights the engines serve;
* **phases** -- the warm-up SFT phase, the start of RL, the end of each step (metrics, periodic
  evaluation, progress), the final evaluation and the HF export;
* **checkpoints** -- the run state a resume needs, written atomically.

Each mode holds one and adds its step: colocate (:class:`~.colocate.Trainer`) generates and
trains in turn; the asynchronous learner (:class:`~.learner.Learner`) trains on queued batches and
publishes while the producer generates. How the weights reach the engines between steps is the
mode's :meth:`TrainingRun.ensure_synced`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relax_gym.chat import ChatCodec
from relax_gym.rewards import RewardComposer
from relax_gym.trainer.algorithms.batching import ScoredSample
from relax_gym.trainer.backends.base import OptimizerSettings, TrainerBackend
from relax_gym.trainer.checkpoint import (
    CheckpointError,
    CheckpointMismatchError,
    Resume,
    TrainerState,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from relax_gym.trainer.config import TrainConfig, bind_run_tokenizer, check_envs
from relax_gym.trainer.engines.fleet import EngineFleet
from relax_gym.trainer.env_errors import check_env_errors
from relax_gym.trainer.observability import RunLogger
from relax_gym.trainer.rollout import EngineRouter, EpisodeSpec, RolloutManager, Trajectory
from relax_gym.trainer.rollout.metrics import RolloutMetrics
from relax_gym.trainer.rollout.sampler import EpisodeSampler, envs_of_suite, eval_specs, register_entry_points, suite_specs

log = logging.getLogger("relax_gym.trainer")



def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

def prepare_model(config: TrainConfig, out_dir: Path) -> Path:
    """The HF folder the run starts from: ``model.path``, or a tiny model built into
    ``<out>/base_model`` (rebuilt only when its spec changed)."""
    if config.model.path is not None:
        path = Path(config.model.path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {str(path)!r} is not an HF model folder (no config.json)")
        return path
    spec = config.model.build
    assert spec is not None
    folder = out_dir / "base_model"
    stamp = folder / "relax_gym_build_spec.json"
    wanted = spec.model_dump(mode="json")
    if stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == wanted:
        return folder
    from relax_gym.trainer.models import build_tiny_model

    if folder.exists():
        shutil.rmtree(folder)
    build_tiny_model(spec.kind, folder, seed=spec.seed, tokenizer=spec.tokenizer, vision=spec.vision or None,
                     audio=spec.audio or None,
                     image_min_pixels=spec.image_min_pixels, image_max_pixels=spec.image_max_pixels, **spec.text)
    stamp.write_text(json.dumps(wanted, indent=2), encoding="utf-8")
    return folder

def rl_optimizer_settings(config: TrainConfig) -> OptimizerSettings:
    """AdamW and its schedule for the RL phase, from ``train:``."""
    t = config.train
    return OptimizerSettings(lr=t.lr, weight_decay=t.weight_decay, betas=t.betas, eps=t.eps,
                             warmup_steps=t.lr_warmup_steps, schedule=t.lr_schedule,
                             total_steps=t.steps * t.updates_per_step, grad_clip=t.grad_clip)

def make_backend(config: TrainConfig, model_path: Path) -> TrainerBackend:
    """The configured backend over ``model_path``, with the RL phase's optimizer."""
    if config.backend == "megatron":
        try:  # one process, or rank 0 of a torchrun launch (the other ranks replay its calls)
            from relax_gym.trainer.backends.megatron.spmd import make_megatron_backend
        except ImportError as exc:
            raise RuntimeError(f"backend 'megatron' is not available: {exc}") from None
        return make_megatron_backend(model_path, megatron=dict(config.megatron),
                                     micro_batch_size=config.train.micro_batch_size,
                                     optimizer=rl_optimizer_settings(config))
    from relax_gym.trainer.backends.pytorch import TorchBackend

    return TorchBackend(model_path, device=config.device, dtype=config.model.dtype,
                        micro_batch_size=config.train.micro_batch_size,
                        gradient_checkpointing=config.model.gradient_checkpointing,
                        optimizer=rl_optimizer_settings(config), lora=config.model.lora,
                        share_prompts=config.train.share_prompts)

def config_hash(config: TrainConfig) -> str:
    """Hash of what must not change across a resume (the rest -- steps, logging -- may)."""
    keep = config.model_dump(mode="json", include={"model", "data", "rollout", "algorithm", "rewards", "seed"})
    keep["rollout"].pop("max_env_error_rate", None)  # a stopping rule, not what is trained on
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RunSummary:
    out_dir: Path
    steps: int
    final_eval: dict[str, float]
    first_eval: dict[str, float]
    elapsed_s: float
    curves: Path | None


class TrainingRun:
    """One training run's shared state and phases (see the module docstring); a mode subclasses
    it and adds its RL step and :meth:`ensure_synced`."""

    def __init__(self, config: TrainConfig, *, resume: Resume = False, rl: bool = True) -> None:
        self.config = config
        self.resume = resume  # False, True (the newest valid checkpoint) or a step / name / path
        self._resume_from: Path | None = None  # the checkpoint chosen (and verified) in _setup
        self.do_rl = rl
        self.out = config.out_dir
        self.state = TrainerState()
        self.buffer: list[Trajectory] = []
        # the rollout managers' counters since the last step logged them (see rl_step)
        self.rollout_counters = RolloutMetrics()
        self._synced_version = 0  # backend.version the engines serve
        self.first_eval: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self._eval_version: int | None = None  # weight version last_eval was measured at
        self._resync_same_version = False
        self._closed = False
        self.last_samples: list[ScoredSample] = []  # what the last RL step trained on

    # ============================================================================================
    # set-up and tear-down
    # ============================================================================================
    def _setup(self) -> None:
        c = self.config
        check_envs(c)  # every env built once: a bad id or kwarg fails before the model loads
        if self.resume:  # before the model loads: a missing or corrupt checkpoint fails fast
            self._resume_from = resolve_checkpoint(self.out, self.resume)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(c.to_yaml(), encoding="utf-8")
        if c.threads:
            torch.set_num_threads(c.threads)
        seed_everything(c.seed, c.deterministic)
        self.model_path = prepare_model(c, self.out)
        bind_run_tokenizer(c, self.model_path)  # dataset envs' max_prompt_tokens count the policy's tokens
        self.backend = make_backend(c, self.model_path)
        self.codec = ChatCodec.from_pretrained(self.model_path, template_kwargs=dict(c.model.template_kwargs),
                                               video=c.model.video.sampling(), audio=c.model.audio.sampling())
        self.processor = self.codec.vision.image_processor if self.codec.vision is not None else None
        register_entry_points([*c.data.envs, *(c.eval.envs or [])])
        self.train_envs = envs_of_suite(c.data.suite) if c.data.suite else list(c.data.envs)
        self.sampler = EpisodeSampler(self.train_envs, seed=c.seed, seed_start=c.data.seed_start,
                                      seed_count=c.data.seed_count, seed_order=c.data.seed_order)
        if c.eval.suite:
            self.eval_episodes = suite_specs(c.eval.suite, c.eval.episodes)
        else:
            envs = c.eval.envs if c.eval.envs is not None else self.train_envs
            self.eval_episodes = eval_specs(envs, c.eval.episodes, c.eval.seed_start)
        self.composer = RewardComposer(c.rewards.entries, per_env=c.rewards.per_env or None,
                                       timeout_s=c.rewards.timeout_s)
        self.state.config_hash = config_hash(c)
        self.warmup = None
        if c.warmup.enabled:
            from relax_gym.trainer.sft import WarmupPhase

            warm_sampler = EpisodeSampler(self.train_envs, seed=c.seed + 1, seed_start=c.warmup.seed_start,
                                          seed_count=min(c.data.seed_count, 400_000_000),
                                          seed_order=c.data.seed_order)
            self.warmup = WarmupPhase(c.warmup, self.backend, self.codec, warm_sampler, self.processor,
                                      evaluate=self._warmup_eval, log=self._log,
                                      max_total_tokens=c.rollout.max_total_tokens,
                                      system_prompt=c.rollout.system_prompt)
        if self.resume:
            self._restore()

    def _restore(self) -> None:
        folder = self._resume_from
        assert folder is not None, "_setup resolves the checkpoint first"
        state, buffer = load_checkpoint(folder, self.backend, verify=False)  # verified by resolve_checkpoint
        if state.config_hash and state.config_hash != self.state.config_hash:
            raise CheckpointMismatchError(
                f"--resume: {folder} was written by a run with a different model/data/rollout/algorithm/rewards "
                "config; start a new output_dir or restore the original config"
            )
        self.state = state
        self.buffer = buffer
        try:
            self.sampler.load_state_dict(state.sampler)
            if self.warmup is not None:
                self.warmup.load_state_dict(state.extra.get("warmup", {}))
            self.first_eval = dict(state.extra.get("first_eval", {}))
            self.last_eval = dict(state.extra.get("last_eval", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{folder / 'trainer_state.json'}: sampler or warm-up state: {exc}") from None
        self._synced_version = -1  # fresh engines serve the starting model: push the restored weights
        self._resync_same_version = True  # ... under the version number they had when saved
        log.warning("resumed from %s (RL step %d, warm-up step %d)", folder, state.step, state.warmup_step)

    def _open_logger(self) -> None:
        """Metrics, TensorBoard / W&B and progress, continuing from a restored state's step."""
        c = self.config
        self.logger = RunLogger(self.out, progress=c.logging.progress, tensorboard=c.logging.tensorboard,
                                wandb=c.logging.wandb.model_dump() if c.logging.wandb.enabled else None,
                                run_name=c.run_name, config=c.model_dump(mode="json"), total_steps=c.train.steps,
                                initial_step=self.state.step, elapsed_offset_s=self.state.elapsed_s)

    async def _start_engines(self) -> None:
        c = self.config
        self.fleet = EngineFleet(c.engine, self.model_path, self.out / "engines", seed=c.seed,
                                 in_process=c.engines_in_process)
        await asyncio.to_thread(self.fleet.start)
        self.router = await EngineRouter(self.fleet.urls, api_key=self.fleet.api_key,
                                         request_timeout_s=c.rollout.request_timeout_s).start()
        from relax_gym.trainer.weights.publisher import WeightPublisher

        self.publisher = WeightPublisher.from_config(c.engine, self.backend, self.router, api_key=self.fleet.api_key,
                                                     staging_dir=self.out / "weights")
        self.teacher = None
        if c.algorithm.distill_coef > 0 and c.teacher.url:
            from relax_gym.protocol import EngineClient

            self.teacher = EngineClient(c.teacher.url, api_key=c.teacher.api_key, timeout_s=c.teacher.timeout_s)

    async def _stop_engines(self) -> None:
        """Release the publisher, router and teacher, then stop the engines the run started.
        Each step runs even when an earlier one fails or is cancelled (a dead peer rank, a
        second signal): the engine processes are always stopped."""
        fleet = getattr(self, "fleet", None)
        try:
            publisher = getattr(self, "publisher", None)
            if publisher is not None:
                await _quietly("the weight publisher", publisher.close())  # a broadcast group, engines still up
            router = getattr(self, "router", None)
            if router is not None:
                await _quietly("the router", router.close())
            if getattr(self, "teacher", None) is not None:
                await _quietly("the teacher client", self.teacher.aclose())
                self.teacher = None
        finally:
            if fleet is not None:
                stopping = asyncio.ensure_future(asyncio.to_thread(fleet.stop))
                try:
                    await asyncio.shield(stopping)
                except asyncio.CancelledError:
                    await stopping  # cancelled while waiting: the engines still stop first
                    raise

    # ============================================================================================
    # helpers: logging, rollout, sync, eval, checkpoints
    # ============================================================================================
    def _log(self, step: int, metrics: dict[str, float], phase: str) -> None:
        self.logger.log(step, metrics, phase=phase)
        if phase == "warmup":
            self.logger.show(self.state.step, {"sft_step": step, "sft_loss": metrics.get("loss", float("nan"))})

    async def _generate(self, specs: list[EpisodeSpec], tag: str, *, evaluation: bool = False) -> list[Trajectory]:
        settings = self.config.eval_rollout() if evaluation else self.config.rollout
        # Episode ids depend only on the run seed and this tag, not on a random run id: a resumed
        # run names (and routes) its episodes as the uninterrupted run would.
        manager = RolloutManager(self.router, self.codec, settings, run_id=f"{self.config.seed}-{tag}")
        try:
            return await manager.generate(specs)
        finally:
            if not evaluation:  # the step logs them (engine errors, retries, drift): never silent
                self.rollout_counters.add(manager.metrics)

    async def ensure_synced(self) -> dict[str, float]:
        """Make the engines serve the backend's current weights; returns the sync metrics."""
        raise NotImplementedError

    async def evaluate(self) -> dict[str, float]:
        """Held-out success and reward with the current weights (synced first)."""
        await self.ensure_synced()
        if self._eval_version == self.state.weight_version and self.last_eval:
            return dict(self.last_eval)  # same weights, same episodes: same result
        start = time.perf_counter()
        trajs = await self._generate(list(self.eval_episodes), f"eval-v{self.state.weight_version}", evaluation=True)
        check_env_errors(trajs, self.config.rollout.max_env_error_rate,
                         f"evaluation at weight version {self.state.weight_version}")
        ok = [t for t in trajs if t.stop_reason not in ("engine_error", "aborted")]
        metrics: dict[str, float] = {
            "success": float(np.mean([t.success for t in ok])) if ok else 0.0,
            "reward_mean": float(np.mean([t.reward for t in ok])) if ok else 0.0,
            "episodes": float(len(ok)),
            "failed_episodes": float(len(trajs) - len(ok)),
            "response_tokens_mean": float(np.mean([t.num_sampled_tokens for t in ok])) if ok else 0.0,
            "seconds": time.perf_counter() - start,
        }
        envs = sorted({t.env_id for t in ok})
        if len(envs) > 1:
            for env_id in envs:
                mine = [t.success for t in ok if t.env_id == env_id]
                metrics[f"success/{env_id}"] = float(np.mean(mine))
        self.last_eval = metrics
        self._eval_version = self.state.weight_version
        if not self.first_eval:
            self.first_eval = dict(metrics)
        return metrics

    async def _warmup_eval(self, sft_step: int) -> dict[str, float]:
        metrics = await self.evaluate()
        self.logger.log(sft_step, metrics, phase="warmup_eval")
        self.logger.message(f"warm-up step {sft_step}: held-out success {metrics['success']:.3f}")
        return metrics

    def _record_run_state(self, sampler: dict[str, Any]) -> None:
        """Put what a resume needs besides the weights into ``self.state``: the episode sampler's
        state, the elapsed time, the evaluations so far and the warm-up phase."""
        self.state.sampler = sampler
        self.state.elapsed_s = self.logger.elapsed_s
        self.state.extra["first_eval"] = self.first_eval
        self.state.extra["last_eval"] = self.last_eval
        if self.warmup is not None:
            self.state.warmup_step = self.warmup.step
            self.state.warmup_done = self.warmup.done
            self.state.extra["warmup"] = self.warmup.state_dict()

    def _checkpoint(self, name: str) -> Path:
        self._record_run_state(self.sampler.state_dict())
        c = self.config.checkpoint
        return save_checkpoint(self.out, name, self.backend, self.state, buffer=self.buffer,
                               keep_last=c.keep_last, save_optimizer=c.save_optimizer)

    def checkpoint_due(self, step: int) -> bool:
        """A periodic checkpoint after RL step ``step`` (the last step's is written at the end)."""
        every = self.config.checkpoint.every
        return bool(every) and step % every == 0 and step < self.config.train.steps

    def _reference(self) -> TrainerBackend:
        ref = getattr(self, "_ref_backend", None)
        if ref is None:
            folder = self.out / "reference_model"
            if not (folder / "config.json").is_file():
                self.backend.save_pretrained(folder)
            ref = self._ref_backend = make_backend(self.config, folder)
        return ref

    # ============================================================================================
    # the phases every mode goes through
    # ============================================================================================
    def _finished(self) -> bool:
        """True (and says so) when the run restored had already finished."""
        if self.state.phase == "done" and self.state.step >= self.config.train.steps:
            self.logger.message(f"{self.out}: this run already finished ({self.state.step} RL steps)")
            return True
        return False

    async def _run_warmup(self) -> None:
        """The warm-up SFT phase, or what is left of it after a resume; nothing once it is done."""
        c = self.config
        if self.warmup is None or self.warmup.done:
            return
        if self.warmup.step == 0 and not self.resume:
            self.backend.configure_optimizer(self.warmup.settings())
            if c.eval.at_start:
                await self._warmup_eval(0)
        await self.warmup.run(on_step=self._warmup_checkpoint)
        metrics = await self._warmup_eval(self.warmup.step)
        self.logger.message(f"warm-up finished after {self.warmup.step} steps: held-out success "
                            f"{metrics['success']:.3f}")
        if c.warmup.save_to:
            self.backend.save_pretrained(c.warmup.save_to)
        self.state.phase = "rl"
        self._checkpoint(f"warmup_{self.warmup.step:06d}")

    async def _start_rl(self) -> None:
        """The RL phase begins (once, not again on a resume): the RL optimizer and schedule, a
        held-out evaluation when asked for or after a warm-up; then the engines serve the weights."""
        c = self.config
        if self.state.step == 0 and self.state.phase != "rl_started":
            self.backend.configure_optimizer(rl_optimizer_settings(c))
            self.state.phase = "rl_started"
            if c.eval.at_start or self.warmup is not None:
                metrics = await self.evaluate()
                self.logger.log(0, metrics, phase="eval")
                self.logger.message(f"RL start: held-out success {metrics['success']:.3f}")
        await self.ensure_synced()

    async def _end_step(self, step: int, metrics: dict[str, float], **headline: float) -> dict[str, float]:
        """Record RL step ``step``: its metrics, the periodic evaluation when due (returned, or
        {}), and the progress line (reward, success, ``headline`` and the last eval success)."""
        c = self.config
        self.state.step = step
        self.logger.log(step, metrics, phase="train")
        shown = {"reward": metrics.get("rollout/reward_mean", float("nan")),
                 "success": metrics.get("rollout/success", float("nan")), **headline}
        ev: dict[str, float] = {}
        if c.eval.every and step % c.eval.every == 0 and step < c.train.steps:
            ev = await self.evaluate()
            self.logger.log(step, ev, phase="eval")
            shown["eval_success"] = ev["success"]
        elif self.last_eval:
            shown["eval_success"] = self.last_eval.get("success", float("nan"))
        self.logger.show(step, shown)
        return ev

    async def _final_eval(self) -> None:
        ev = await self.evaluate()
        self.logger.log(self.state.step, ev, phase="eval")
        self.logger.message(f"final: held-out success {ev['success']:.3f} after {self.state.step} RL steps")

    async def _export_final_model(self) -> None:
        if self.config.checkpoint.export_hf:
            await asyncio.to_thread(self.backend.save_pretrained, self.out / "final_model")

    async def _warmup_checkpoint(self, sft_step: int) -> None:
        every = self.config.checkpoint.every
        if every and sft_step % every == 0:
            self._checkpoint(f"warmup_{sft_step:06d}")



async def _quietly(what: str, closing: Any) -> None:
    """Await a clean-up step; a failure is logged, never raised (the next steps must run)."""
    try:
        await closing
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - clean-up after a failure may fail again
        log.warning("closing %s failed: %s", what, exc)

__all__ = ["RunSummary", "TrainingRun", "config_hash", "make_backend", "prepare_model", "rl_optimizer_settings",
           "seed_everything"]
