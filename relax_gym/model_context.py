"""The context length a model serves, from its config alone (no model code, no torch).

One rule for the engine, the trainer's config check and the eval agents: a model serves
``max_position_embeddings`` tokens, or, for a family with sliding-window layers, its window
(the engine keeps full KV, which matches a sliding layer only within the window).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_CONTEXT = 32768  # a config that states no max_position_embeddings


def served_context_of(max_position_embeddings: int | None, layer_types: Sequence[str] | None,
                      sliding_window: int | None) -> int:
    """The context served for these config values (see the module docstring)."""
    context = int(max_position_embeddings or DEFAULT_CONTEXT)
    if "sliding_attention" in (layer_types or []) and sliding_window:
        context = min(context, int(sliding_window))
    return context


def folder_context(path: str | Path) -> int | None:
    """The served context of a model folder, read from its ``config.json`` (the text model's
    section for a multimodal one, the thinker's for Qwen3-Omni); None when the folder has no
    readable config or it states no ``max_position_embeddings``."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    thinker = cfg.get("thinker_config")
    sections: list[Any] = [cfg.get("text_config"), thinker.get("text_config") if isinstance(thinker, dict) else None, cfg]
    for section in sections:
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            window = section.get("sliding_window")
            return served_context_of(value, section.get("layer_types"), window if isinstance(window, int) else None)
    return None


__all__ = ["DEFAULT_CONTEXT", "folder_context", "served_context_of"]
