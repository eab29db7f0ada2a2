"""From rollouts to a training batch: rewards, group filtering, advantages, tensors.

The steps, in the order the loop runs them:

1. :func:`reward_inputs` -- each :class:`Trajectory` as a :class:`~relax_gym.rewards.RewardInput`
   (prompt, final answer, the env's last ``info`` and summed reward, token counts);
2. the reward composer scores them (``relax_gym.rewards``; the default plan is the env's reward);
3. :func:`select_groups` -- drops what must not be trained on: failed episodes, samples whose
   reward failed (their whole group, or scored 0, as configured) and, with dynamic sampling,
   groups whose rewards are all equal (no GRPO signal). Every drop is counted;
4. :func:`to_sequence_batch` -- token ids, loss masks, rollout logprobs and the images' pixel
   values as a :class:`~relax_gym.trainer.backends.base.SequenceBatch`;
5. :func:`attach_advantages` -- advantages over the *whole* step batch (groups by id).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from relax_gym.rewards import RewardInput, RewardResult
from relax_gym.trainer.algorithms import AlgorithmConfig, compute_advantages
from relax_gym.trainer.backends.base import SequenceBatch
from relax_gym.trainer.rollout import Trajectory


@dataclass
class ScoredSample:
    """A trajectory with its final reward (env reward composed with the configured rewards)."""

    traj: Trajectory
    reward: float | None
    result: RewardResult | None = None

    @property
    def group(self) -> str:
        return self.traj.group_id


def reward_inputs(trajectories: Sequence[Trajectory]) -> list[RewardInput]:
    """The reward functions' view of each trajectory."""
    out = []
    for t in trajectories:
        prompt: list[Any] = []
        for m in t.messages:
            if m.role == "assistant":
                break
            prompt.append(m)
        answers = [m for m in t.messages if m.role == "assistant"]
        response = answers[-1].text if answers else ""
        last_info = t.turns[-1].info if t.turns else {}
        info = dict(last_info) if isinstance(last_info, dict) else {}
        info.setdefault("success", t.success)
        if t.reward_components and "reward_components" not in info:
            info["reward_components"] = dict(t.reward_components)
        out.append(RewardInput(
            prompt=prompt, response=response, messages=list(t.messages), label=t.metadata.get("label"),
            info=info, metadata={"env_id": t.env_id, "seed": t.seed, "group_id": t.group_id, **t.metadata},
            env_reward=t.reward, num_response_tokens=t.num_sampled_tokens,
            finish_reason=t.turns[-1].finish_reason if t.turns else None,
        ))
    return out


@dataclass
class GroupSelection:
    """What :func:`select_groups` kept and why the rest was dropped."""

    kept: list[list[ScoredSample]] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> samples
    zeroed: int = 0  # samples kept with a failed reward scored 0 (failed_reward="zero")

    @property
    def samples(self) -> list[ScoredSample]:
        return [s for g in self.kept for s in g]


def select_groups(scored: Sequence[ScoredSample], *, failed_reward: str = "drop",
                  drop_zero_variance: bool = False, min_group_size: int = 1) -> GroupSelection:
    """Group samples by id and drop what must not be trained on (see the module docstring).

    Untrainable samples (failed episode, unexpected template drift, nothing sampled) leave the
    group; a failed reward drops the group (``failed_reward="drop"``) or counts as 0
    (``"zero"``); with ``drop_zero_variance`` a group whose remaining rewards are all equal is
    dropped (dynamic sampling); groups left smaller than ``min_group_size`` are dropped.
    """
    groups: dict[str, list[ScoredSample]] = {}
    for s in scored:
        groups.setdefault(s.group, []).append(s)
    sel = GroupSelection()
    for members in groups.values():
        usable = []
        for s in members:
            if not s.traj.trainable:
                sel.dropped["untrainable"] += 1
            else:
                usable.append(s)
        failed = [s for s in usable if s.reward is None]
        if failed:
            if failed_reward == "drop":
                sel.dropped["reward_failed"] += len(usable)
                continue
            for s in failed:
                s.reward = 0.0
            sel.zeroed += len(failed)
        if not usable or len(usable) < min_group_size:
            sel.dropped["group_too_small"] += len(usable)
            continue
        if drop_zero_variance and len({s.reward for s in usable}) == 1:
            sel.dropped["zero_variance"] += len(usable)
            continue
        sel.kept.append(usable)
    return sel


def to_sequence_batch(samples: Sequence[ScoredSample], image_processor: Any | None, *,
                      temperature: float = 1.0) -> SequenceBatch:
    """Tensors for the backend; pixel values are recomputed from the trajectories' images."""
    multimodal: list[dict[str, torch.Tensor]] = []
    for s in samples:
        t = s.traj
        if t.images or t.videos or t.audios:
            if image_processor is None:
                raise ValueError(f"trajectory {t.episode_id} holds images but the model has no image processor")
            vis = t.vision_inputs(image_processor)
            multimodal.append({k: v for k, v in vis.items() if k != "mm_token_type_ids"})
        else:
            multimodal.append({})
    return SequenceBatch(
        input_ids=[list(s.traj.token_ids) for s in samples],
        loss_mask=[list(s.traj.loss_mask) for s in samples],
        multimodal=multimodal,
        rollout_logprobs=[torch.tensor(s.traj.rollout_logprobs, dtype=torch.float32) for s in samples],
        group_ids=[s.group for s in samples],
        temperature=temperature,
    )


def attach_advantages(batch: SequenceBatch, rewards: Sequence[float], config: AlgorithmConfig,
                      *, ref_logprobs: list[torch.Tensor] | None = None,
                      teacher_logprobs: list[torch.Tensor] | None = None) -> dict[str, float]:
    """Compute advantages over the whole batch and store them per token; returns metrics."""
    mask = batch.padded_mask()
    width = mask.shape[1]

    def pad(rows: list[torch.Tensor] | None) -> torch.Tensor | None:
        if rows is None:
            return None
        out = torch.zeros(len(rows), width, dtype=torch.float32)
        for i, r in enumerate(rows):
            out[i, : r.numel()] = r
        return out

    out = compute_advantages(
        config, torch.tensor(list(rewards), dtype=torch.float64), batch.group_ids, mask,
        logprobs=batch.padded("rollout_logprobs", width), ref_logprobs=pad(ref_logprobs),
        teacher_logprobs=pad(teacher_logprobs),
    )
    batch.advantages = [out.advantages[i, : len(ids)].float() for i, ids in enumerate(batch.input_ids)]
    seq_adv = [float(a[m.bool()].mean()) if m.any() else 0.0
               for a, m in zip(out.advantages, mask, strict=True)]
    metrics = {f"adv/{k}": v for k, v in out.metrics.items()}
    if seq_adv:
        t = torch.tensor(seq_adv)
        metrics.update({"adv/mean": float(t.mean()), "adv/abs_mean": float(t.abs().mean()),
                        "adv/max": float(t.max()), "adv/min": float(t.min())})
    return metrics


def split_by_groups(batch_groups: Sequence[str], n: int) -> list[list[int]]:
    """Row indices of ``n`` mini-batches holding whole groups, as even as possible."""
    order: dict[str, list[int]] = {}
    for i, g in enumerate(batch_groups):
        order.setdefault(g, []).append(i)
    groups = list(order.values())
    n = max(1, min(n, len(groups)))
    out: list[list[int]] = [[] for _ in range(n)]
    for k, rows in enumerate(groups):
        out[k * n // len(groups)].extend(rows)
    return [rows for rows in out if rows]


__all__ = [
    "GroupSelection",
    "ScoredSample",
    "attach_advantages",
    "reward_inputs",
    "select_groups",
    "split_by_groups",
    "to_sequence_batch",
]
