"""Qwen3-VL mRoPE (positions and interleaved frequencies) and the logprob math, vs transformers."""

from __future__ import annotations

import pytest
import torch
from relax_gym.trainer.backends.megatron.config import MegatronBridgeError
from relax_gym.trainer.backends.megatron.logprobs import next_token_logprobs, vocab_parallel_logprobs
from relax_gym.trainer.backends.megatron.vl import mrope_position_ids

from tests.megatron import tiny_models

IMG, VID, START, END = 500, 501, 502, 503


@pytest.fixture(scope="module")
def hf_vl_model():  # type: ignore[no-untyped-def]
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    return Qwen3VLModel(tiny_models.qwen3vl_config())


def test_position_ids_match_transformers_with_two_images_and_padding(hf_vl_model) -> None:  # type: ignore[no-untyped-def]
    grids = torch.tensor([[1, 4, 6], [1, 2, 2], [1, 6, 4]])  # tokens: 6, 1, 6
    row0 = [1, 2, START] + [IMG] * 6 + [END, 3, START] + [IMG] * 1 + [END, 4, 5]
    row1 = [7, START] + [IMG] * 6 + [END, 8]
    seq = max(len(row0), len(row1))
    ids = torch.tensor([row0 + [0] * (seq - len(row0)), row1 + [0] * (seq - len(row1))])
    mask = torch.tensor(
        [[1] * len(row0) + [0] * (seq - len(row0)), [1] * len(row1) + [0] * (seq - len(row1))]
    )
    ours = mrope_position_ids(ids, IMG, grids, 2, attention_mask=mask)
    ref, _ = hf_vl_model.get_rope_index(ids, (ids == IMG).int(), grids, attention_mask=mask)
    assert torch.equal(ours, ref)
    assert not torch.equal(ours[1], ours[2])  # height and width really differ on the image


def test_position_ids_reject_mismatched_image_runs() -> None:
    ids = torch.tensor([[1, START] + [IMG] * 5 + [END]])
    with pytest.raises(MegatronBridgeError, match="needs 6"):
        mrope_position_ids(ids, IMG, torch.tensor([[1, 4, 6]]), 2)
    with pytest.raises(MegatronBridgeError, match="more rows"):
        mrope_position_ids(torch.tensor([[1, 2]]), IMG, torch.tensor([[1, 4, 6]]), 2)
    with pytest.raises(MegatronBridgeError, match="more image runs"):
        mrope_position_ids(ids, IMG, None, 2)


def _video(frames: int, pads: int) -> list[int]:
    """Qwen3-VL's layout of one video: per temporal patch a stamp (text), start, pads, end."""
    out = [START]
    for k in range(frames):
        out += [10 + k, 11, START] + [VID] * pads + [END]
    return out + [END]


def test_position_ids_match_transformers_with_videos_images_and_padding(hf_vl_model) -> None:  # type: ignore[no-untyped-def]
    videos = torch.tensor([[2, 4, 6], [3, 2, 4], [1, 6, 4]])  # per temporal patch: 6, 2, 6 pads
    images = torch.tensor([[1, 2, 2]])
    row0 = [1, 2, *_video(2, 6), 3, START, IMG, END, *_video(3, 2), 4]
    row1 = [7, *_video(1, 6), 8, 9]
    seq = max(len(row0), len(row1))
    ids = torch.tensor([row0 + [0] * (seq - len(row0)), row1 + [0] * (seq - len(row1))])
    mask = (torch.arange(seq)[None] < torch.tensor([[len(row0)], [len(row1)]])).long()
    ours = mrope_position_ids(ids, IMG, images, 2, attention_mask=mask, video_token_id=VID, video_grid_thw=videos)
    types = (ids == IMG).int() + 2 * (ids == VID).int()
    ref, _ = hf_vl_model.get_rope_index(ids, types, images, videos, attention_mask=mask)
    assert torch.equal(ours, ref)
    as_text = mrope_position_ids(ids, IMG, images, 2, attention_mask=mask)  # the video pads read as text
    assert not torch.equal(as_text, ref)


def test_position_ids_reject_mismatched_video_runs() -> None:
    ids = torch.tensor([[1, *_video(2, 6)]])
    with pytest.raises(MegatronBridgeError, match="needs 4"):
        mrope_position_ids(ids, IMG, None, 2, video_token_id=VID, video_grid_thw=torch.tensor([[2, 4, 4]]))
    with pytest.raises(MegatronBridgeError, match="more video runs"):
        mrope_position_ids(ids, IMG, None, 2, video_token_id=VID, video_grid_thw=torch.tensor([[1, 4, 6]]))
    with pytest.raises(MegatronBridgeError, match="video_grid_thw has more rows"):
        mrope_position_ids(ids, IMG, None, 2, video_token_id=VID, video_grid_thw=torch.tensor([[3, 4, 6]]))


def test_interleaved_frequencies_match_transformers_rotary(hf_vl_model) -> None:  # type: ignore[no-untyped-def]
    from relax_gym.trainer.backends.megatron.rope import interleave_mrope_freqs

    rotary = hf_vl_model.language_model.rotary_emb
    positions = torch.randint(0, 50, (3, 2, 7))
    x = torch.zeros(1, dtype=torch.float32)
    ref_cos, ref_sin = rotary(x, positions)
    inv_freq = rotary.inv_freq.float()
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat([interleave_mrope_freqs(freqs, rotary.mrope_section)] * 2, dim=-1)
    assert torch.equal(emb.cos(), ref_cos) and torch.equal(emb.sin(), ref_sin)
    contiguous = torch.cat(
        [
            m[i % 3]
            for i, m in enumerate(
                torch.cat([freqs, freqs], -1).split(list(rotary.mrope_section) * 2, dim=-1)
            )
        ],
        dim=-1,
    )
    assert not torch.equal(contiguous.cos(), ref_cos)  # Qwen2-VL layout would be wrong here


def test_single_rank_logprobs_entropy_and_temperature() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11, dtype=torch.float64) * 3
    ids = torch.randint(0, 11, (2, 6))
    for temperature in (1.0, 0.7):
        lp, ent = next_token_logprobs(logits, ids, with_entropy=True, temperature=temperature)
        ref = torch.log_softmax(logits.float()[:, :-1] / temperature, -1)
        assert torch.allclose(lp, ref.gather(-1, ids[:, 1:, None]).squeeze(-1), atol=1e-6)
        assert ent is not None
        assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-6)
    with pytest.raises(ValueError, match="do not match"):
        vocab_parallel_logprobs(logits, ids[:, :-1])
