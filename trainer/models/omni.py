"""Qwen3-Omni thinker helpers shared by the embedded engine and the torch backend.

The thinker computes M-RoPE positions with its own ``get_rope_index`` (audio spans run on like
text; images and videos get (t, h, w) positions) and reads audio as ``input_features`` plus a
``feature_attention_mask``. It takes no ``mm_token_type_ids`` (Qwen3-VL does).
"""

from __future__ import annotations

from typing import Any

import torch


def omni_rope_index(model: Any, input_ids: list[int], image_grid_thw: Any, video_grid_thw: Any,
                    feature_attention_mask: Any) -> tuple[torch.Tensor, int]:
    """``[3, n]`` positions of one sequence and its M-RoPE delta, from the thinker itself."""
    n = len(input_ids)
    ids = torch.tensor([input_ids])
    seqlens = feature_attention_mask.sum(-1) if feature_attention_mask is not None else None
    pos, delta = model.model.get_rope_index(ids, image_grid_thw, video_grid_thw, torch.ones((1, n), dtype=torch.long),
                                            False, seqlens, None)
    return pos[:, 0, :].long(), int(torch.as_tensor(delta).reshape(-1)[0].item())


def is_omni_config(config: Any) -> bool:
    from relax_gym.audio import is_omni

    return is_omni(config)


__all__ = ["is_omni_config", "omni_rope_index"]
