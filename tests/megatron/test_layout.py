"""Pure-tensor checks of the HF <-> Megatron layout map, sources, mRoPE and logprob math.

These run in-process without torch.distributed: they pin the exact fused layouts against
independent, loop-by-head reconstructions, so a layout bug fails here before any model runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from relax_gym.trainer.backends.megatron.bridge import plan_bucket_sizes
from relax_gym.trainer.backends.megatron.config import (
    MegatronBridgeError,
    MegatronConfig,
    ModelDims,
    check_parallel_layout,
    dims_from_hf_config,
)
from relax_gym.trainer.backends.megatron.layout import all_maps, hf_from_shards, hf_shapes, shard_from_hf
from relax_gym.trainer.backends.megatron.sources import SafetensorsSource, StateDictSource

from tests.megatron import tiny_models


def _dims(
    heads: int = 4, kv: int = 2, hd: int = 3, hidden: int = 5, ffn: int = 8, tied: bool = False
) -> ModelDims:
    return ModelDims(
        vocab_size=16,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_layers=1,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        tied_embeddings=tied,
        max_position_embeddings=32,
        hf_prefix="model.",
    )


def _hf_state(dims: ModelDims) -> dict[str, torch.Tensor]:
    """Every HF tensor with distinct values, so any misplaced row or column is visible."""
    state: dict[str, torch.Tensor] = {}
    offset = 0
    for pm in all_maps(dims):
        for name, shape in hf_shapes(pm, dims):
            if name in state:
                continue
            n = 1
            for s in shape:
                n *= s
            state[name] = torch.arange(offset, offset + n, dtype=torch.float32).reshape(shape)
            offset += n
    return state


def _expected_fused_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: ModelDims
) -> torch.Tensor:
    rows = []
    hd, hpg = dims.head_dim, dims.heads_per_group
    for g in range(dims.num_kv_heads):
        for head in range(g * hpg, (g + 1) * hpg):
            rows.append(q[head * hd : (head + 1) * hd])
        rows.append(k[g * hd : (g + 1) * hd])
        rows.append(v[g * hd : (g + 1) * hd])
    return torch.cat(rows)


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "hd"),
    [(4, 2, 1, 3), (4, 2, 2, 3), (8, 2, 4, 3), (4, 1, 2, 3), (4, 4, 4, 3), (8, 2, 8, 4)],
)
def test_qkv_shards_follow_megatron_group_layout(heads: int, kv: int, tp: int, hd: int) -> None:
    dims = _dims(heads=heads, kv=kv, hd=hd)
    state = _hf_state(dims)
    source = StateDictSource(state)
    pm = next(p for p in all_maps(dims) if p.layout == "qkv")
    shards = [shard_from_hf(pm, source, dims, r, tp) for r in range(tp)]
    expected = _expected_fused_qkv(*(state[n] for n in pm.hf), dims)
    assert torch.equal(torch.cat(shards), expected)
    assert len({s.shape for s in shards}) == 1
    for name, tensor in hf_from_shards(pm, shards, dims):
        assert torch.equal(tensor, state[name])


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gate_up_row_vocab_and_norm_layouts(tp: int) -> None:
    dims = _dims(heads=4, kv=4, hidden=4, ffn=8)
    state = _hf_state(dims)
    source = StateDictSource(state)
    by_layout = {}
    for pm in all_maps(dims):
        by_layout.setdefault(pm.layout, pm)
        shards = [shard_from_hf(pm, source, dims, r, tp) for r in range(tp)]
        for name, tensor in hf_from_shards(pm, shards, dims):
            assert torch.equal(tensor, state[name]), name
    gate_up = by_layout["gate_up"]
    gate, up = (state[n] for n in gate_up.hf)
    per = dims.ffn_hidden_size // tp
    for r in range(tp):
        shard = shard_from_hf(gate_up, source, dims, r, tp)
        assert torch.equal(
            shard, torch.cat([gate[r * per : (r + 1) * per], up[r * per : (r + 1) * per]])
        )
    row = by_layout["row"]
    width = state[row.hf[0]].shape[1] // tp
    assert torch.equal(
        shard_from_hf(row, source, dims, tp - 1, tp), state[row.hf[0]][:, (tp - 1) * width :]
    )
    norm = by_layout["replicated"]
    assert torch.equal(shard_from_hf(norm, source, dims, tp - 1, tp), state[norm.hf[0]])


def test_tied_output_layer_reads_embedding_and_is_not_exported() -> None:
    maps = all_maps(_dims(tied=True))
    out = next(p for p in maps if p.megatron == "output_layer.weight")
    assert out.hf == ("model.embed_tokens.weight",) and not out.export
    untied = next(p for p in all_maps(_dims()) if p.megatron == "output_layer.weight")
    assert untied.hf == ("lm_head.weight",) and untied.export


def test_safetensors_source_slices_like_the_state_dict(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = {"a": torch.arange(24.0).reshape(6, 4), "b": torch.arange(5.0)}
    save_file(state, str(tmp_path / "model.safetensors"))
    disk, mem = SafetensorsSource(tmp_path), StateDictSource(state)
    assert disk.shape("a") == (6, 4)
    for rows, cols in [
        (None, None),
        (slice(2, 5), None),
        (None, slice(1, 3)),
        (slice(0, 2), slice(3, 4)),
    ]:
        assert torch.equal(disk.read("a", rows, cols), mem.read("a", rows, cols))
    assert torch.equal(disk.read("b", slice(1, 3)), torch.tensor([1.0, 2.0]))
    with pytest.raises(MegatronBridgeError, match="not found"):
        disk.read("missing")
    with pytest.raises(MegatronBridgeError, match="1-D"):
        disk.read("b", cols=slice(0, 1))
    with pytest.raises(MegatronBridgeError, match="no model.safetensors"):
        SafetensorsSource(tmp_path / "nowhere")


def test_bucket_plan_is_greedy_and_bounded() -> None:
    assert plan_bucket_sizes([4, 4, 4, 4], limit=8) == [2, 2]
    assert plan_bucket_sizes([10, 1, 1], limit=8) == [1, 2]  # oversize tensor alone
    assert plan_bucket_sizes([3, 3, 3], limit=100) == [3]
    assert plan_bucket_sizes([], limit=8) == []


def test_config_mapping_and_clear_errors() -> None:
    dims = dims_from_hf_config(tiny_models.qwen3_config(tied=True))
    assert (dims.num_kv_heads, dims.head_dim, dims.rope_theta, dims.tied_embeddings) == (
        2,
        16,
        1e6,
        True,
    )
    assert dims.hf_prefix == "model." and dims.mrope_section is None
    vl = dims_from_hf_config(tiny_models.qwen3vl_config())
    assert vl.hf_prefix == "model.language_model." and vl.mrope_section == (6, 5, 5)
    assert vl.tied_embeddings
    with pytest.raises(MegatronBridgeError, match="fused q/k/v rows"):
        check_parallel_layout(_dims(heads=8, kv=2, hd=3), MegatronConfig(tensor_parallel_size=8))
    with pytest.raises(MegatronBridgeError, match="not divisible by tp=3"):
        check_parallel_layout(dims, MegatronConfig(tensor_parallel_size=3))
    with pytest.raises(MegatronBridgeError, match="not a multiple"):
        MegatronConfig(tensor_parallel_size=2, pipeline_parallel_size=2).data_parallel_size(6)
    assert MegatronConfig(tensor_parallel_size=2).data_parallel_size(8) == 4
    cfg = tiny_models.qwen3_config()
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(MegatronBridgeError, match="rope_type"):
        dims_from_hf_config(cfg)
    from transformers import LlamaConfig

    with pytest.raises(MegatronBridgeError, match="model_type"):
        dims_from_hf_config(LlamaConfig())
