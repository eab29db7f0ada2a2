"""The colocate training loop: generate, then train, then sync weights -- strictly on-policy.

One RL step, top to bottom (:meth:`Trainer.rl_step`):

1. **rollout** -- draw ``prompts_per_step`` env seeds, run ``group_size`` episodes each on the
   engines (the rollout manager: multi-turn, token-in/token-out);
2. **reward** -- score them with the reward composer (the env's reward by default), drop
   untrainable samples and failed rewards; with dynamic sampling drop zero-variance groups and
   draw more seeds until the batch is full (at most ``max_rounds`` rounds);
3. **logprob** -- advantages over the whole batch; the proximal policy's logprobs when the step
   makes more than one update (mini-batches or epochs), the reference's for a KL term, the
   teacher's for distillation;
4. **train** -- ``mini_batches`` x ``epochs`` optimizer updates, each over whole groups, cut into
   micro-batches inside the backend with the global normaliser;
5. **sync** -- publish the weights to every engine (``engine.sync``: in memory, through the disk,
   or by broadcast; :mod:`relax_gym.trainer.weights`), flush caches, verify the version.

Around the steps: the warm-up SFT phase, held-out evaluation every ``eval.every`` steps, atomic
checkpoints (``--resume`` continues exactly), metrics/TensorBoard/progress, sample dumps and the
curve PNG. See ``docs/training.md``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import torch

from relax_gym.trainer.algorithms.batching import ScoredSample, reward_inputs, select_groups
from relax_gym.trainer.algorithms.update import recomputed_by, update_policy
from relax_gym.trainer.checkpoint import Resume
from relax_gym.trainer.config import TrainConfig
from relax_gym.trainer.env_errors import check_env_errors
from relax_gym.trainer.rollout.tool_metrics import tool_metrics
from relax_gym.trainer.observability import PhaseTimer, dump_samples, plot_curves, sample_record
from relax_gym.trainer.rollout.media_metrics import media_metrics
from relax_gym.trainer.rollout import Trajectory
from relax_gym.trainer.rollout.metrics import RolloutMetrics
from relax_gym.trainer.modes.training_run import (  # re-exported: the helpers every mode uses
    RunSummary,
    TrainingRun,
    config_hash,
    make_backend,
    prepare_model,
    rl_optimizer_settings,
    seed_everything,
)

log = logging.getLogger("relax_gym.trainer")


class Trainer(TrainingRun):
    """A whole training run (warm-up SFT, then RL) in colocate mode: each step generates its
    batch, trains on it and publishes the weights before the next step generates."""


    async def ensure_synced(self) -> dict[str, float]:
        """Push the backend's weights to the engines if they changed since the last push."""
        if self.backend.version == self._synced_version:
            return {}
        if self._resync_same_version and self.state.weight_version > 0:
            self._resync_same_version = False  # restored weights: same version as when saved
        else:
            self.state.weight_version += 1
        metrics = await self.publisher.publish(self.state.weight_version)
        self._synced_version = self.backend.version
        return metrics

    # ============================================================================================
    # one RL step
    # ============================================================================================
    async def _score(self, trajs: list[Trajectory]) -> list[ScoredSample]:
        results = await self.composer.score(reward_inputs(trajs))
        return [ScoredSample(t, r.total, r) for t, r in zip(trajs, results, strict=True)]

    async def rl_step(self, step: int) -> dict[str, float]:
        c = self.config
        timer = PhaseTimer()
        want = c.rollout.prompts_per_step
        ds = c.train.dynamic_sampling
        kept: list[list[ScoredSample]] = []
        all_trajs: list[Trajectory] = []
        dropped: dict[str, int] = {}
        rounds = 0
        # groups buffered by an earlier step's extra sampling come first
        if self.buffer:
            with timer.phase("reward"):
                sel = select_groups(await self._score(self.buffer), failed_reward=c.rewards.failed,
                                    drop_zero_variance=ds.enabled)
            kept.extend(sel.kept)
            self.buffer = []
        while len(kept) < want and rounds < (ds.max_rounds if ds.enabled else 1):
            need = want - len(kept)
            specs = self.sampler.next(need, tag=f"s{step}r{rounds}:")
            with timer.phase("rollout"):
                trajs = await self._generate(specs, f"s{step}r{rounds}")
            all_trajs.extend(trajs)
            with timer.phase("reward"):
                sel = select_groups(await self._score(trajs), failed_reward=c.rewards.failed,
                                    drop_zero_variance=ds.enabled)
            for reason, n in sel.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + n
            kept.extend(sel.kept)
            rounds += 1
        check_env_errors(all_trajs, c.rollout.max_env_error_rate, f"RL step {step}")
        if len(kept) > want:  # keep whole extra groups for the next step rather than waste them
            self.buffer = [s.traj for g in kept[want:] for s in g]
            kept = kept[:want]
        samples = [s for g in kept for s in g]
        self.last_samples = samples
        metrics = self._rollout_metrics(all_trajs, samples, dropped, rounds)
        if not samples:
            metrics["train/skipped_step"] = 1.0
            metrics.update(timer.metrics())
            return metrics

        update = await update_policy(
            self.backend, c.algorithm, samples, mini_batches=c.train.mini_batches, epochs=c.train.epochs,
            temperature=c.rollout.temperature, image_processor=self.processor,
            reference=recomputed_by(self._reference), teacher=self.teacher, timer=timer)
        metrics.update(update.metrics)
        with timer.phase("sync"):
            metrics.update(await self.ensure_synced())
        if c.logging.dump_samples and step % c.logging.dump_every == 0:
            self._dump(step, samples, update.batch)
        metrics.update(timer.metrics())
        return metrics

    def _rollout_metrics(self, trajs: list[Trajectory], samples: list[ScoredSample], dropped: dict[str, int],
                         rounds: int) -> dict[str, float]:
        m: dict[str, float] = {"rollout/rounds": float(rounds), "rollout/episodes": float(len(trajs)),
                               "rollout/trained_samples": float(len(samples)),
                               "rollout/buffered_samples": float(len(self.buffer))}
        m.update(self.rollout_counters.step_counters())
        self.rollout_counters = RolloutMetrics()
        if trajs:
            m["rollout/success"] = float(np.mean([t.success for t in trajs]))
            m["rollout/env_reward_mean"] = float(np.mean([t.reward for t in trajs]))
            m["rollout/response_tokens_mean"] = float(np.mean([t.num_sampled_tokens for t in trajs]))
            m["rollout/turns_mean"] = float(np.mean([len(t.turns) for t in trajs]))
            m["rollout/truncated_frac"] = float(np.mean([bool(t.turns) and t.turns[-1].finish_reason == "length"
                                                         for t in trajs]))
            for reason in sorted({t.stop_reason for t in trajs}):
                m[f"rollout/stop/{reason}"] = float(sum(t.stop_reason == reason for t in trajs))
            m.update(media_metrics(trajs))
        if samples:
            rewards = [float(s.reward) for s in samples if s.reward is not None]
            m["rollout/reward_mean"] = float(np.mean(rewards))
            m["rollout/reward_std"] = float(np.std(rewards))
            comps: dict[str, list[float]] = {}
            for s in samples:
                if s.result is not None:
                    for k, v in s.result.components.items():
                        comps.setdefault(k, []).append(v)
            for k, values in comps.items():
                m[f"reward/{k}"] = float(np.mean(values))
        for reason, n in dropped.items():
            m[f"rollout/dropped/{reason}"] = float(n)
        m.update(tool_metrics(trajs))
        return m

    def _dump(self, step: int, samples: list[ScoredSample], batch: Any) -> None:
        n = self.config.logging.dump_samples
        records = []
        for i, s in enumerate(samples[:n]):
            adv = batch.advantages[i] if batch.advantages is not None else None
            mask = torch.tensor(batch.loss_mask[i], dtype=torch.bool)
            a = float(adv[mask].mean()) if adv is not None and mask.any() else None
            records.append(sample_record(s.traj, self.codec.decode, reward=s.reward,
                                         reward_components=s.result.components if s.result else None, advantage=a))
        dump_samples(self.out, step, records)

    # ============================================================================================
    # the run
    # ============================================================================================
    async def start(self) -> None:
        """Build the model and backend, restore a checkpoint (``resume``), start the engines."""
        self._setup()
        self._open_logger()
        try:
            await self._start_engines()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Stop the engines and close the writers (idempotent)."""
        await self._stop_engines()
        self.router = None
        self.fleet = None
        if getattr(self, "logger", None) is not None and not self._closed:
            self.logger.close()
        self._closed = True

    async def run(self) -> RunSummary:
        await self.start()
        c = self.config
        try:
            await self._run_phases()
        finally:
            await self.close()
        curves = None
        if c.logging.plot:
            curves = plot_curves(self.out / "metrics.jsonl", self.out / "curves.png", title=c.run_name)
        summary = RunSummary(self.out, self.state.step, self.last_eval, self.first_eval, self.logger.elapsed_s, curves)
        (self.out / "summary.json").write_text(json.dumps({
            "steps": summary.steps, "first_eval": summary.first_eval, "final_eval": summary.final_eval,
            "elapsed_s": round(summary.elapsed_s, 2), "curves": str(curves) if curves else None,
        }, indent=2), encoding="utf-8")
        return summary

    async def _run_phases(self) -> None:
        c = self.config
        if self._finished():
            return
        await self._run_warmup()
        if not self.do_rl:
            return
        # -- RL ----------------------------------------------------------------------------------
        await self._start_rl()
        while self.state.step < c.train.steps:
            step = self.state.step + 1
            metrics = await self.rl_step(step)
            await self._end_step(step, metrics, step_s=metrics.get("time/step", float("nan")))
            if self.checkpoint_due(step):
                self._checkpoint(f"step_{step:06d}")
        # -- the end -----------------------------------------------------------------------------
        if c.train.steps > 0:
            await self._final_eval()
        self.state.phase = "done"
        self._checkpoint(f"step_{self.state.step:06d}")
        await self._export_final_model()


def train(config: TrainConfig, *, resume: Resume = False, rl: bool = True) -> RunSummary:
    """Run a training run to the end (blocking).

    SIGTERM (and Ctrl-C) cancel the run cleanly: the engines it started are stopped and the
    writers closed before :class:`KeyboardInterrupt` is raised; resume from the last checkpoint.
    Only ``mode: colocate`` runs here (``rl=False``, the warm-up alone, takes any mode); the
    asynchronous modes run through :func:`relax_gym.trainer.modes.async_runner.train`.
    """
    if rl and config.mode != "colocate":
        raise ValueError(
            f"the colocate loop does not run mode {config.mode!r}: use relax_gym.trainer.modes.async_runner.train "
            "(relax-gym train picks the runner from the mode)"
        )

    from relax_gym.trainer.interrupts import run_stoppable

    return run_stoppable(lambda: Trainer(config, resume=resume, rl=rl).run())


__all__ = ["RunSummary", "Trainer", "config_hash", "make_backend", "prepare_model", "rl_optimizer_settings",
           "seed_everything", "train"]
