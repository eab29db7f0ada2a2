"""Per-step counts of what happened to the media of a batch of trajectories.

Video clips are sampled down (fps, frame count, resolution) before the model sees them, and a
clip over budget or malformed becomes an error text the model reads (or, when no single clip is
at fault, ends its episode); both must show in the run's metrics, not only in logs. Computed
from the trajectories themselves so every execution mode can report them.
"""

from __future__ import annotations

from collections.abc import Sequence

from relax_gym.trainer.rollout.trajectory import Trajectory


def media_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``rollout/videos`` (clips the model saw), ``rollout/video_tokens_mean`` (video pads per
    sample), ``rollout/audios`` and ``rollout/audio_tokens_mean`` (the same for audio), ``rollout/video_reduced/<how>`` and ``rollout/media_errors`` (bad or over-budget
    clips replaced by an error text, plus episodes such a clip ended)."""
    out: dict[str, float] = {}
    videos = sum(len(t.videos) for t in trajs)
    if videos:
        out["rollout/videos"] = float(videos)
        pads = [sum(1 for tok in t.token_ids if tok == t.video_token_id) for t in trajs if t.videos]
        out["rollout/video_tokens_mean"] = float(sum(pads) / len(pads))
    audios = sum(len(t.audios) for t in trajs)
    if audios:  # omni: clips the model heard and their placeholder tokens per sample
        out["rollout/audios"] = float(audios)
        pads = [sum(1 for tok in t.token_ids if tok == t.audio_token_id) for t in trajs if t.audios]
        out["rollout/audio_tokens_mean"] = float(sum(pads) / len(pads))
    for t in trajs:
        for how in t.metadata.get("video_reduced", ()):
            key = f"rollout/video_reduced/{how}"
            out[key] = out.get(key, 0.0) + 1.0
    errors = sum(1 for t in trajs if t.stop_reason == "env_error" and (t.error or "").startswith("media:"))
    errors += sum(len(t.metadata.get("media_errors", ())) for t in trajs)
    if errors:
        out["rollout/media_errors"] = float(errors)
    return out


__all__ = ["media_metrics"]
