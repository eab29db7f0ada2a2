"""The torch backend forwards each distinct prompt of a micro-batch once (trainer/backends/
shared_prefix.py): logprobs, loss, gradient norm and the updated weights equal the plain padded
forward's, for every text family, with LoRA, multi-turn loss masks, rows without loss tokens,
micro-batches that cut a group, and Qwen3-VL prompts with images (M-RoPE positions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from relax_gym.trainer.backends.shared_prefix import group_order, plan_shared_prefixes

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16}


def test_plan_shares_each_distinct_prompt_and_declines_when_nothing_repeats() -> None:
    ids = [[5, 6, 7, 1, 2], [5, 6, 7, 3], [5, 6, 7, 4, 4, 4], [9, 9, 1]]
    mask = [[0, 0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 1, 0, 1], [0, 0, 1]]
    plan = plan_shared_prefixes(ids, mask, min_saving=0.0)
    assert plan is not None
    assert plan.prefixes == [[5, 6, 7], [9, 9]] and plan.row_prefix == [0, 0, 0, 1] and plan.prefix_len == [3, 3, 3, 2]
    assert plan.saved_tokens == 6 and plan.total_tokens == 18
    assert plan_shared_prefixes([[1, 2, 3], [4, 5, 6]], [[0, 1, 1], [0, 0, 1]]) is None  # nothing repeats
    # a row without loss tokens still keeps one token after its prefix; a loss on token 0 keeps one before
    plan = plan_shared_prefixes([[1, 2, 3], [1, 2, 3], [1, 2]], [[0, 0, 0], [0, 0, 0], [1, 1]], min_saving=0.0)
    assert plan is not None and plan.prefix_len == [2, 2, 1]
    assert plan_shared_prefixes([[1], [1]], [[0], [0]], min_saving=0.0) is None  # nothing to put after a prompt


def test_group_order_keeps_a_prompts_rows_together() -> None:
    ids = [[1, 2, 9], [3, 4, 9, 9], [1, 2, 8, 8, 8], [3, 4, 7], [1, 2, 7, 7]]
    mask = [[0, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 1], [0, 0, 1, 1]]
    order = group_order(ids, mask)
    prompts = [tuple(ids[i][:2]) for i in order]
    assert prompts == [(1, 2)] * 3 + [(3, 4)] * 2
    assert [len(ids[i]) for i in order[:3]] == [3, 4, 5]  # by length within a prompt


def grpo_like_batch(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """3 prompts x 4 samples of different lengths; some rows are two turns (an observation
    between the replies, off the loss mask); one row has no loss token at all."""
    g = torch.Generator().manual_seed(seed)
    ids: list[list[int]] = []
    mask: list[list[int]] = []
    for p in range(3):
        prompt = torch.randint(3, 500, (9 + 4 * p,), generator=g).tolist()
        for s in range(4):
            reply = torch.randint(3, 500, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
            row, m = prompt + reply, [0] * len(prompt) + [1] * len(reply)
            if s % 2:
                obs = torch.randint(3, 500, (5,), generator=g).tolist()
                second = torch.randint(3, 500, (3,), generator=g).tolist()
                row, m = row + obs + second, m + [0] * 5 + [1] * 3
            ids.append(row)
            mask.append(m)
    mask[-1] = [0] * len(mask[-1])
    return ids, mask


@pytest.mark.parametrize("kind,lora", [("qwen3", False), ("llama", False), ("qwen2", False), ("qwen3", True)])
def test_shared_prompts_equal_the_plain_forward(kind: str, lora: bool, tmp_path: Path) -> None:
    if lora:
        pytest.importorskip("peft")
    from relax_gym.trainer.algorithms.config import AlgorithmConfig
    from relax_gym.trainer.backends.base import PolicyObjective, SequenceBatch
    from relax_gym.trainer.backends.lora import LoraSettings
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model(kind, tmp_path / kind, seed=0, tokenizer="tiny-bpe", **SMALL)
    settings: dict[str, Any] = {"micro_batch_size": 5, "lora": LoraSettings(rank=4) if lora else None}
    torch.manual_seed(0)  # LoRA's A matrices are drawn at random: the same draw for both
    plain = TorchBackend(model, share_prompts=False, **settings)
    torch.manual_seed(0)
    shared = TorchBackend(model, **settings)
    assert shared.share_prompts and not plain.share_prompts
    ids, mask = grpo_like_batch(0)
    batch = SequenceBatch(input_ids=ids, loss_mask=mask, temperature=0.7)
    a = plain.compute_logprobs(batch, entropy=True)
    b = shared.compute_logprobs(batch, entropy=True)
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=0)
    for x, y in zip(a.entropies or [], b.entropies or [], strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=0)
    g = torch.Generator().manual_seed(1)
    batch.advantages = [torch.full((len(r),), float(torch.randn(1, generator=g))) for r in ids]
    batch.old_logprobs = batch.rollout_logprobs = a.logprobs
    objective = PolicyObjective(AlgorithmConfig())
    m1, m2 = plain.train_step(batch, objective), shared.train_step(batch, objective)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    assert m2["pg_loss"] == pytest.approx(m1["pg_loss"], rel=1e-5, abs=1e-7)
    w1, w2 = dict(plain.named_weights()), dict(shared.named_weights())
    for name, w in w1.items():
        torch.testing.assert_close(w2[name], w, atol=1e-6, rtol=0)


def vl_batch(model: Path) -> Any:
    """Qwen3-VL rows: 2 images x 3 samples with the same prompt text (the image tells the groups
    apart), a text-only group, and a two-turn row whose second image comes after its reply."""
    import numpy as np
    from PIL import Image

    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.backends.base import SequenceBatch

    codec = ChatCodec.from_pretrained(model)
    assert codec.vision is not None
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)) for _ in range(3)]

    def pixels(imgs: list[Any]) -> dict[str, torch.Tensor]:
        out = codec.vision.image_processor(images=imgs, return_tensors="pt")  # type: ignore[union-attr]
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}

    ids: list[list[int]] = []
    mask: list[list[int]] = []
    multimodal: list[dict[str, torch.Tensor]] = []
    g = torch.Generator().manual_seed(2)
    for img in images[:2]:
        prompt = codec.prompt([{"role": "user", "content": [{"type": "image", "image": img},
                                                            {"type": "text", "text": "Colour?"}]}]).ids
        for _ in range(3):
            reply = torch.randint(3, 300, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
            ids.append(prompt + reply)
            mask.append([0] * len(prompt) + [1] * len(reply))
            multimodal.append(pixels([img]))
    text = codec.prompt([{"role": "user", "content": "Name a colour."}]).ids
    for _ in range(2):
        reply = torch.randint(3, 300, (5,), generator=g).tolist()
        ids.append(text + reply)
        mask.append([0] * len(text) + [1] * 5)
        multimodal.append({})
    return codec, images, pixels, SequenceBatch(input_ids=ids, loss_mask=mask, multimodal=multimodal)


def test_qwen3_vl_shares_prompt_and_image_and_equals_the_plain_forward(tmp_path: Path) -> None:
    from relax_gym.trainer.algorithms.config import AlgorithmConfig
    from relax_gym.trainer.backends.base import PolicyObjective, SequenceBatch
    from relax_gym.trainer.backends.pytorch import TorchBackend
    from relax_gym.trainer.backends.shared_prefix import media_key, plan_shared_prefixes
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model("qwen3_vl", tmp_path / "vl", seed=0, tokenizer="tiny-bpe",
                             image_min_pixels=64 * 64, image_max_pixels=64 * 64)
    codec, images, pixels, batch = vl_batch(model)
    plan = plan_shared_prefixes(batch.input_ids, batch.loss_mask, [media_key(mm) for mm in batch.multimodal])
    assert plan is not None and len(plan.prefixes) == 3  # two images with the same text are two prompts
    plain = TorchBackend(model, share_prompts=False, micro_batch_size=16)
    shared = TorchBackend(model, micro_batch_size=16)
    assert shared.share_prompts
    a, b = plain.compute_logprobs(batch), shared.compute_logprobs(batch)
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=0)
    g = torch.Generator().manual_seed(1)
    batch.advantages = [torch.full((len(r),), float(torch.randn(1, generator=g))) for r in batch.input_ids]
    batch.old_logprobs = batch.rollout_logprobs = a.logprobs
    objective = PolicyObjective(AlgorithmConfig())
    m1, m2 = plain.train_step(batch, objective), shared.train_step(batch, objective)
    assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    w1, w2 = dict(plain.named_weights()), dict(shared.named_weights())
    for name, w in w1.items():
        torch.testing.assert_close(w2[name], w, atol=1e-6, rtol=0)
    # an image after a row's first reply: that micro-batch keeps the padded forward, still exact
    turn = codec.prompt([{"role": "user", "content": [{"type": "image", "image": images[2]}]}]).ids
    row = batch.input_ids[0] + turn
    two_turn = SequenceBatch(input_ids=[*batch.input_ids, row],
                             loss_mask=[*batch.loss_mask, batch.loss_mask[0] + [0] * len(turn)],
                             multimodal=[*batch.multimodal, pixels([images[0], images[2]])])
    inputs, _ = shared._inputs(two_turn)
    assert shared._shared_prompt_hidden(two_turn, inputs, max(map(len, two_turn.input_ids))) is None
    for x, y in zip(plain.compute_logprobs(two_turn).logprobs, shared.compute_logprobs(two_turn).logprobs, strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=0)
