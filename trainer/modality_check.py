"""Refuse, before anything loads, a run whose envs show audio or video the model cannot take.

A text model given a video env would train on ``[video: 16 frames]`` placeholders and never see
the clip: a run that cannot learn its task, found out hours later. The model's inputs are known
from the config alone -- ``model.build.kind`` or the ``model_type`` in ``model.path``'s
``config.json`` -- and the envs' from their registry specs (``modalities``), so the check needs no
model code and no env instance. Images keep the older rule (a text model sees a placeholder).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# model_type -> what the codec and the engine feed it (text always)
MODEL_INPUTS: dict[str, frozenset[str]] = {
    "qwen3_vl": frozenset({"text", "image", "video"}),
    "qwen3_omni": frozenset({"text", "image", "audio"}),  # a tiny thinker (model.build.kind)
    "qwen3_omni_moe_thinker": frozenset({"text", "image", "audio"}),  # video to the thinker is not wired yet
    "qwen2_vl": frozenset({"text", "image"}),
    "qwen2_5_vl": frozenset({"text", "image"}),
}
CHECKED = ("audio", "video")


def model_type(config: Any) -> tuple[str, str]:
    """``(model_type, name)`` of the configured model; ``("", name)`` when unreadable."""
    model = config.model
    if model.build is not None:
        return str(model.build.kind), f"model.build (tiny {model.build.kind})"
    path = Path(str(model.path))
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "", str(path)
    return str(data.get("model_type", "")), str(path)


def model_inputs(kind: str) -> frozenset[str]:
    return MODEL_INPUTS.get(kind, frozenset({"text"}))


def modality_problem(config: Any, envs: list[tuple[str, str, dict[str, Any]]]) -> str | None:
    """What is wrong with the first ``(field, env)`` whose audio/video the model (or the
    backend) cannot take, else None; ``check_envs`` raises it as a ConfigError. ``envs`` are
    ``(config field, env id, kwargs)`` as ``check_envs`` lists them."""
    import relax_gym

    kind, name = model_type(config)
    if not kind:
        return None  # an unreadable folder fails later, with its own message
    takes = model_inputs(kind)
    for where, env_id, kwargs in envs:
        shown = _shown(relax_gym, env_id, kwargs)
        missing = [m for m in CHECKED if m in shown and m not in takes]
        if missing:
            return (
                f"{where}: env {env_id} shows {' and '.join(missing)}, but the model {name} "
                f"(model_type {kind}) takes only {', '.join(sorted(takes))}; choose a model that takes "
                f"{' and '.join(missing)} (video: qwen3_vl; audio: qwen3_omni) or drop the env"
            )
    return None


def _shown(relax_gym: Any, env_id: str, kwargs: dict[str, Any]) -> tuple[str, ...]:
    """The modalities ``env_id`` shows with these kwargs: the registry's declaration, narrowed by
    the built env's own ``modalities`` when it sets one (a dataset env declares every modality
    and knows its columns only once built). Built only when audio or video is declared."""
    try:
        declared = tuple(relax_gym.spec(env_id).resolved_modalities())
    except Exception:  # noqa: BLE001 - an unknown id is check_envs' error
        return ()
    if not any(m in declared for m in CHECKED):
        return declared
    try:
        env = relax_gym.make(env_id, **kwargs)
    except Exception:  # noqa: BLE001 - check_envs reports a bad kwarg; a dataset env whose prompt
        return ()  # filter needs the run's tokenizer cannot be built yet: what it shows is unknown
    try:
        own = vars(env.unwrapped).get("modalities")
        return tuple(own) if own else declared
    finally:
        env.close()


__all__ = ["CHECKED", "MODEL_INPUTS", "modality_problem", "model_inputs", "model_type"]
