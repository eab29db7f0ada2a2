"""The plain-torch backend on tiny real models: logprobs, micro-batch invariance, updates,
weight export and save/load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.backends.base import (
    BatchError,
    NLLObjective,
    OptimizerSettings,
    PolicyObjective,
    SequenceBatch,
    micro_batches,
)
from relax_gym.trainer.backends.pytorch import TorchBackend


def text_batch(n: int = 5, seed: int = 0) -> SequenceBatch:
    g = torch.Generator().manual_seed(seed)
    ids, masks, adv, rollout = [], [], [], []
    for i in range(n):
        length = 6 + 3 * i
        row = torch.randint(5, 300, (length,), generator=g).tolist()
        prompt = 3 + i % 3
        mask = [0] * prompt + [1] * (length - prompt)
        ids.append(row)
        masks.append(mask)
        a = 1.0 if i % 2 else -1.0
        adv.append(torch.tensor([a * m for m in mask], dtype=torch.float32))
        rollout.append(torch.tensor([-2.0 * m for m in mask], dtype=torch.float32))
    return SequenceBatch(ids, masks, advantages=adv, rollout_logprobs=rollout,
                         group_ids=[f"g{i // 2}" for i in range(n)])


def hf_logprobs(model: torch.nn.Module, ids: list[int], **extra: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), **extra).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return torch.cat([torch.zeros(1), lp])


def test_logprobs_match_a_plain_forward(tiny_text_model: Path) -> None:
    be = TorchBackend(tiny_text_model, micro_batch_size=2)
    batch = text_batch()
    out = be.compute_logprobs(batch, entropy=True)
    assert len(out.logprobs) == len(batch) and out.entropies is not None
    for ids, mask, lp, ent in zip(batch.input_ids, batch.loss_mask, out.logprobs, out.entropies, strict=True):
        m = torch.tensor(mask, dtype=torch.bool)
        ref = hf_logprobs(be.model, ids)
        assert lp.shape == (len(ids),)
        torch.testing.assert_close(lp[m], ref[m], atol=1e-5, rtol=0)
        assert torch.all(lp[~m] == 0) and torch.all(ent[~m] == 0)
        assert torch.all(ent[m] > 0) and torch.all(ent[m] <= torch.log(torch.tensor(float(be.config.vocab_size))) + 1e-4)


def test_temperature_scales_the_logits(tiny_text_model: Path) -> None:
    be = TorchBackend(tiny_text_model)
    batch = text_batch(2)
    batch.temperature = 0.5
    lp = be.compute_logprobs(batch).logprobs[0]
    ids = batch.input_ids[0]
    with torch.no_grad():
        logits = be.model(input_ids=torch.tensor([ids])).logits[0].float() / 0.5
    ref = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    m = torch.tensor(batch.loss_mask[0][1:], dtype=torch.bool)
    torch.testing.assert_close(lp[1:][m], ref[m], atol=1e-5, rtol=0)


def _params_after_step(path: Path, micro: int, objective: object, batch: SequenceBatch) -> tuple[dict, dict]:
    torch.manual_seed(0)
    # eps=1 makes Adam's first update ~ lr * grad (linear), so the comparison checks gradients
    # instead of Adam's sign-like normalisation of tiny, noise-level components
    be = TorchBackend(path, micro_batch_size=micro, optimizer=OptimizerSettings(lr=1.0, eps=1.0, grad_clip=None))
    metrics = be.train_step(batch, objective)  # type: ignore[arg-type]
    return {n: p.detach().clone() for n, p in be.model.named_parameters()}, metrics


@pytest.mark.parametrize("objective", [NLLObjective(), NLLObjective("seq-mean-token-mean"),
                                       PolicyObjective(AlgorithmConfig(loss_agg_mode="seq-mean-token-mean")),
                                       PolicyObjective(AlgorithmConfig(policy_loss="gspo", entropy_coef=0.01))],
                         ids=["nll", "nll-seq", "ppo-seq", "gspo-entropy"])
def test_update_does_not_depend_on_the_micro_batch_cut(tiny_text_model: Path, objective: object) -> None:
    batch = text_batch(5)
    whole, m_whole = _params_after_step(tiny_text_model, 64, objective, batch)
    cut, m_cut = _params_after_step(tiny_text_model, 2, objective, batch)
    for name in whole:
        torch.testing.assert_close(whole[name], cut[name], atol=1e-6, rtol=1e-5, msg=name)
    assert m_whole["loss"] == pytest.approx(m_cut["loss"], rel=1e-5, abs=1e-7)
    assert m_whole["grad_norm"] == pytest.approx(m_cut["grad_norm"], rel=1e-4)
    assert m_whole["num_tokens"] == batch.num_loss_tokens


def test_sft_loss_goes_down_and_versions_count(tiny_text_model: Path) -> None:
    be = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=1e-2))
    batch = text_batch(4)
    losses = [be.train_step(batch, NLLObjective())["loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.5
    assert be.version == 6


def test_policy_step_moves_probability_towards_positive_advantage(tiny_text_model: Path) -> None:
    be = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=5e-3))
    batch = text_batch(4)
    before = be.compute_logprobs(batch).logprobs
    metrics = be.train_step(batch, PolicyObjective(AlgorithmConfig()))
    after = be.compute_logprobs(batch).logprobs
    assert metrics["ratio_mean"] == pytest.approx(1.0)  # on-policy: old = current
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        m = torch.tensor(batch.loss_mask[i], dtype=torch.bool)
        sign = 1 if i % 2 else -1
        assert sign * (a[m].sum() - b[m].sum()) > 0


def test_non_finite_gradient_never_reaches_the_weights(tiny_text_model: Path) -> None:
    be = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=1e-2))
    batch = text_batch(2)
    batch.advantages = [torch.full_like(a, float("nan")) for a in batch.advantages or []]
    before = {n: p.detach().clone() for n, p in be.model.named_parameters()}
    metrics = be.train_step(batch, PolicyObjective(AlgorithmConfig()))
    assert metrics.get("skipped_update") == 1.0 and be.version == 0
    for n, p in be.model.named_parameters():
        assert torch.equal(before[n], p.detach())


def test_save_and_load_state_continue_exactly(tiny_text_model: Path, tmp_path: Path) -> None:
    batch = text_batch(4)
    a = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=1e-2, warmup_steps=3))
    a.train_step(batch, NLLObjective())
    a.save_state(tmp_path / "state")
    expected = a.train_step(batch, NLLObjective())
    b = TorchBackend(tiny_text_model)
    b.load_state(tmp_path / "state")
    assert b.version == 1 and b.updates == 1
    got = b.train_step(batch, NLLObjective())
    for key in ("loss", "grad_norm", "lr"):
        assert got[key] == pytest.approx(expected[key], rel=1e-6), key


def test_export_weights_in_hf_naming_and_buckets(tiny_text_model: Path, tmp_path: Path) -> None:
    be = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=1e-2))
    be.train_step(text_batch(2), NLLObjective())
    named = dict(be.named_weights())
    assert "model.embed_tokens.weight" in named and "lm_head.weight" not in named  # tied: sent once
    buckets = list(be.export_weights(bucket_bytes=64 * 1024))
    assert len(buckets) > 1
    assert [n for b in buckets for n, _ in b] == list(named)
    folder = be.save_pretrained(tmp_path / "hf")
    assert (folder / "tokenizer.json").is_file()
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(folder))
    ids = text_batch(1).input_ids[0]
    torch.testing.assert_close(hf_logprobs(loaded, ids), hf_logprobs(be.model, ids), atol=1e-6, rtol=0)


def test_vision_batch_matches_a_plain_forward(tiny_vl_model: Path) -> None:
    from relax_gym.chat import ChatCodec

    be = TorchBackend(tiny_vl_model, micro_batch_size=2)
    codec = ChatCodec.from_pretrained(tiny_vl_model, template_kwargs={"enable_thinking": False})
    assert codec.vision is not None
    rows, masks, mms = [], [], []
    for k, size in enumerate([(64, 64), (32, 64), (64, 32)]):
        img = Image.new("RGB", size, (40 * k, 100, 200))
        prompt = codec.prompt([{"role": "user", "content": [{"type": "image", "image": img},
                                                             {"type": "text", "text": f"colour {k}?"}]}])
        answer = codec.encode("\\boxed{red}") + codec.closing_glue[:1]
        rows.append(prompt.ids + answer)
        masks.append([0] * len(prompt.ids) + [1] * len(answer))
        px = codec.vision.image_processor(images=prompt.images, return_tensors="pt")
        mms.append({"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"]})
    batch = SequenceBatch(rows, masks, mms)
    out = be.compute_logprobs(batch).logprobs
    for ids, mask, mm, lp in zip(rows, masks, mms, out, strict=True):
        types = (torch.tensor([ids]) == be.image_token_id).long()
        ref = hf_logprobs(be.model, ids, mm_token_type_ids=types, **mm)
        m = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(lp[m], ref[m], atol=1e-5, rtol=0)
    vision_before = {n: p.detach().clone() for n, p in be.model.named_parameters() if "visual" in n}
    m1 = be.train_step(batch, NLLObjective())
    assert m1["grad_norm"] > 0 and vision_before
    moved = [n for n, p in be.model.named_parameters() if n in vision_before and not torch.equal(p, vision_before[n])]
    assert len(moved) > len(vision_before) // 2  # the vision tower is trained too


def test_bf16_autocast_and_gradient_checkpointing_run(tiny_text_model: Path) -> None:
    batch = text_batch(3)
    ref = TorchBackend(tiny_text_model, optimizer=OptimizerSettings(lr=1e-2))
    ckpt = TorchBackend(tiny_text_model, gradient_checkpointing=True, optimizer=OptimizerSettings(lr=1e-2))
    m_ref, m_ckpt = ref.train_step(batch, NLLObjective()), ckpt.train_step(batch, NLLObjective())
    assert m_ref["loss"] == pytest.approx(m_ckpt["loss"], rel=1e-6)
    assert m_ref["grad_norm"] == pytest.approx(m_ckpt["grad_norm"], rel=1e-4)
    bf16 = TorchBackend(tiny_text_model, dtype="bfloat16", optimizer=OptimizerSettings(lr=1e-2))
    m_bf16 = bf16.train_step(batch, NLLObjective())
    assert m_bf16["loss"] == pytest.approx(m_ref["loss"], rel=2e-2)
    assert next(bf16.model.parameters()).dtype == torch.float32  # fp32 master weights


def test_batch_validation() -> None:
    with pytest.raises(BatchError, match="position 0"):
        SequenceBatch([[1, 2]], [[1, 1]])
    with pytest.raises(BatchError, match="loss-mask"):
        SequenceBatch([[1, 2, 3]], [[0, 1]])
    with pytest.raises(BatchError, match="advantages"):
        SequenceBatch([[1, 2]], [[0, 1]], advantages=[torch.zeros(3)])
    batch = text_batch(5)
    cuts = micro_batches(batch, 2)
    assert sorted(i for c in cuts for i in c) == list(range(5)) and max(len(c) for c in cuts) == 2


def test_lr_schedule() -> None:
    s = OptimizerSettings(lr=1.0, warmup_steps=2, schedule="cosine", total_steps=12)
    assert [round(s.factor(i), 3) for i in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert s.factor(12) == pytest.approx(0.0, abs=1e-9)
    assert OptimizerSettings(schedule="linear", total_steps=10).factor(5) == pytest.approx(0.5)
