"""The trajectory: one exact, token-level training sample built by the rollout manager.

A trajectory is the token sequence the engine actually saw and produced, never re-tokenized
text. Four lists run in parallel over ``token_ids``:

* ``loss_mask`` -- 1 only on tokens the engine sampled; 0 on the prompt, env/tool observation
  tokens and chat-template glue;
* ``rollout_logprobs`` -- the engine's logprob of each sampled token (0.0 where the mask is 0);
* ``weight_versions`` -- the weight version that sampled each token (-1 where the mask is 0), so
  a partial rollout that spans a weight update shows the mix;
* (derived) ``mm_token_type_ids`` -- 1 on image placeholder tokens, what Qwen3-VL's M-RoPE needs.

Around them: the images in conversation order with their patch grids (pixel values are rebuilt
deterministically by :meth:`Trajectory.vision_inputs`), per-turn records, rewards, the stop
reason, the group the sample belongs to, the conversation as :class:`relax_gym.Message` list,
and the drift check's verdict. :func:`save_jsonl` / :func:`load_jsonl` round-trip all of it to
a JSONL file plus a media folder, for inspection and replay.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from relax_gym.chat import DriftReport
from relax_gym.errors import RelaxGymError
from relax_gym.transcript import MediaWriter, message_from_record, message_to_record
from relax_gym.types import AudioPart, ImagePart, Message, ToolCall, VideoPart
from relax_gym.vision import token_runs

StopReason = Literal[
    "env_done",  # the env terminated the episode
    "max_turns",  # the turn limit (env's or the manager's) was reached
    "env_truncated",  # the env truncated the episode for another reason
    "max_tokens",  # the trajectory hit max_total_tokens
    "engine_error",  # the engine failed (after retries and failover) or replied malformed output
    "env_error",  # env.reset/env.step raised
    "aborted",  # the manager was stopped while the episode ran
]
STOP_REASONS: tuple[str, ...] = get_args(StopReason)
# Stop reasons whose reward cannot be trusted: such samples are kept for inspection, not trained.
FAILED_STOP_REASONS: frozenset[str] = frozenset({"engine_error", "env_error", "aborted"})

SCHEMA_VERSION = 1


class TrajectoryError(RelaxGymError, ValueError):
    """A trajectory violates its invariants or a record cannot be read back."""


@dataclass(slots=True)
class TurnRecord:
    """One turn: what the model said, what the env answered, and what it cost."""

    index: int
    assistant_text: str
    num_sampled_tokens: int
    finish_reason: str  # the last engine reply's: stop / length / abort
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    observation_text: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    engine_ids: list[str] = field(default_factory=list)  # engines that served this turn, in order
    engine_latency_s: float = 0.0
    env_latency_s: float = 0.0
    tool_latency_s: float | None = None
    weight_versions: list[int] = field(default_factory=list)  # distinct versions, in order
    resumes: int = 0  # continuations after an aborted (paused) segment
    failovers: int = 0  # retries on another engine after a failure
    info: dict[str, Any] = field(default_factory=dict)  # the env's info, JSON-safe subset

    def to_record(self) -> dict[str, Any]:
        rec = asdict(self)
        rec["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls]
        return rec

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> TurnRecord:
        data = dict(rec)
        data["tool_calls"] = [
            ToolCall(c["name"], dict(c.get("arguments") or {}), c.get("id", "")) for c in rec.get("tool_calls", [])
        ]
        return cls(**data)


@dataclass(slots=True)
class Trajectory:
    """One training sample; see the module docstring for the meaning of each token list."""

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    weight_versions: list[int]
    prompt_length: int
    # identity
    episode_id: str = ""
    group_id: str = ""
    sample_index: int = 0
    env_id: str = ""
    seed: int | None = None
    part: int = 0  # index of this sample within its episode (>0 only under think_policy="split")
    num_parts: int = 1
    # outcome
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    success: bool = False
    stop_reason: StopReason = "env_done"
    error: str | None = None
    # content
    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool schemas in the prompt
    # multimodal inputs for the trainer: images in the order their placeholders appear
    images: list[ImagePart] = field(default_factory=list)
    image_grid_thw: list[list[int]] = field(default_factory=list)
    image_token_id: int | None = None
    # videos as the model saw them (sampled frames at their rate), in placeholder order
    videos: list[VideoPart] = field(default_factory=list)
    video_grid_thw: list[list[int]] = field(default_factory=list)
    video_token_id: int | None = None
    # omni: audio clips as the model heard them (canonical 16 kHz, relax_gym.audio), in placeholder order
    audios: list[AudioPart] = field(default_factory=list)
    audio_token_id: int | None = None
    drift: DriftReport = field(default_factory=DriftReport)
    metadata: dict[str, Any] = field(default_factory=dict)

    # -- views ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def mm_token_type_ids(self) -> list[int]:
        """1 on image placeholder tokens, 2 on video ones, 0 elsewhere (Qwen3-VL's
        ``mm_token_type_ids``)."""
        image, video = self.image_token_id, self.video_token_id
        return [1 if t == image and image is not None else 2 if t == video and video is not None else 0
                for t in self.token_ids]

    @property
    def trainable(self) -> bool:
        """Whether the trainer should use this sample: it sampled something, its episode did not
        fail, and its tokens do not drift from the template beyond what the policy accepts."""
        return (
            self.num_sampled_tokens > 0
            and self.stop_reason not in FAILED_STOP_REASONS
            and (self.drift.expected or not self.drift.drifted)
        )

    def sampled_spans(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each maximal run of mask-1 tokens."""
        spans: list[tuple[int, int]] = []
        start: int | None = None
        for i, m in enumerate(self.loss_mask):
            if m and start is None:
                start = i
            elif not m and start is not None:
                spans.append((start, i))
                start = None
        if start is not None:
            spans.append((start, len(self.loss_mask)))
        return spans

    @property
    def weight_version_mix(self) -> dict[int, int]:
        """How many sampled tokens each weight version produced."""
        out: dict[int, int] = {}
        for v, m in zip(self.weight_versions, self.loss_mask, strict=True):
            if m:
                out[v] = out.get(v, 0) + 1
        return out

    def validate(self) -> None:
        """Raise :class:`TrajectoryError` unless every invariant of the schema holds."""
        n = len(self.token_ids)
        for name in ("loss_mask", "rollout_logprobs", "weight_versions"):
            if len(getattr(self, name)) != n:
                raise TrajectoryError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        if not 0 <= self.prompt_length <= n:
            raise TrajectoryError(f"prompt_length {self.prompt_length} outside [0, {n}]")
        if any(self.loss_mask[: self.prompt_length]):
            raise TrajectoryError("the prompt holds tokens with loss_mask 1")
        for i, (m, lp, v) in enumerate(zip(self.loss_mask, self.rollout_logprobs, self.weight_versions, strict=True)):
            if m not in (0, 1):
                raise TrajectoryError(f"loss_mask[{i}] = {m!r}; expected 0 or 1")
            if m == 0 and (lp != 0.0 or v != -1):
                raise TrajectoryError(f"token {i} is masked but has logprob {lp} / weight version {v}")
            if m == 1 and (not math.isfinite(lp) or lp > 1e-6 or v < 0):
                raise TrajectoryError(f"sampled token {i} has logprob {lp} / weight version {v}")
        if self.stop_reason not in STOP_REASONS:
            raise TrajectoryError(f"unknown stop reason {self.stop_reason!r}")
        if self.image_token_id is not None:
            runs = len(token_runs(self.token_ids, self.image_token_id))
            if runs != len(self.images) or len(self.images) != len(self.image_grid_thw):
                raise TrajectoryError(
                    f"{runs} image placeholder runs, {len(self.images)} images and "
                    f"{len(self.image_grid_thw)} grids; they must agree"
                )
        if len(self.videos) != len(self.video_grid_thw) or (self.videos and self.video_token_id is None):
            raise TrajectoryError(f"{len(self.videos)} videos and {len(self.video_grid_thw)} video grids (video token "
                                  f"{self.video_token_id}); they must agree")

    def vision_inputs(self, image_processor: Any) -> dict[str, Any]:
        """``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` as torch tensors for a
        Qwen-VL forward pass over ``token_ids``; recomputed deterministically from the images
        with the model's image processor and checked against the recorded grids."""
        import torch

        out: dict[str, Any] = {"mm_token_type_ids": torch.tensor([self.mm_token_type_ids], dtype=torch.long)}
        if self.videos:
            from relax_gym.video import VideoProcessor

            vids = VideoProcessor.from_image_processor(image_processor)([v.frames for v in self.videos])
            if vids["video_grid_thw"].tolist() != self.video_grid_thw:
                raise TrajectoryError(f"the video processor gives grids {vids['video_grid_thw'].tolist()} but the "
                                      f"rollout used {self.video_grid_thw}")
            out.update(vids)
        if self.audios:
            from relax_gym.audio import batch_features, default_extractor

            extractor = getattr(image_processor, "relax_audio_extractor", None) or default_extractor()
            out.update(batch_features(extractor, [a.waveform for a in self.audios]))
        if not self.images:
            return out
        processed = image_processor(images=[p.image.convert("RGB") for p in self.images], return_tensors="pt")
        grid = processed["image_grid_thw"]
        if grid.tolist() != self.image_grid_thw:
            raise TrajectoryError(
                f"the image processor gives grids {grid.tolist()} but the rollout used {self.image_grid_thw}; "
                "is it the model's own processor?"
            )
        out["pixel_values"] = processed["pixel_values"]
        out["image_grid_thw"] = grid
        return out

    # -- serialisation --------------------------------------------------------------------------
    def to_record(self, writer: MediaWriter | None = None) -> dict[str, Any]:
        """A JSON-ready dict; media are written through ``writer`` (required when the
        trajectory holds media)."""
        if (self.images or any(m.media for m in self.messages)) and writer is None:
            raise TrajectoryError("this trajectory holds media: pass a MediaWriter to save it")
        return {
            "schema_version": SCHEMA_VERSION,
            "episode_id": self.episode_id,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
            "env_id": self.env_id,
            "seed": self.seed,
            "part": self.part,
            "num_parts": self.num_parts,
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "rollout_logprobs": self.rollout_logprobs,
            "weight_versions": self.weight_versions,
            "prompt_length": self.prompt_length,
            "reward": self.reward,
            "reward_components": self.reward_components,
            "success": self.success,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "turns": [t.to_record() for t in self.turns],
            "messages": [message_to_record(m, writer) for m in self.messages],
            "tools": self.tools,
            "images": [
                {"path": writer.save(p), **({"id": p.id} if p.id is not None else {})}  # type: ignore[union-attr]
                for p in self.images
            ],
            "image_grid_thw": self.image_grid_thw,
            "image_token_id": self.image_token_id,
            "videos": [{"path": _save_frames(writer, v), "fps": v.fps} for v in self.videos],
            "video_grid_thw": self.video_grid_thw,
            "video_token_id": self.video_token_id,
            "audios": [_save_audio(writer, a) for a in self.audios],
            "audio_token_id": self.audio_token_id,
            "drift": asdict(self.drift),
            "metadata": self.metadata,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any], media_dir: str | Path | None = None) -> Trajectory:
        """Inverse of :meth:`to_record`; media are read from ``media_dir``."""
        version = rec.get("schema_version")
        if version != SCHEMA_VERSION:
            raise TrajectoryError(f"trajectory schema version {version!r}; this reader knows {SCHEMA_VERSION}")
        try:
            from relax_gym.media import load_image

            images = []
            for item in rec.get("images", []):
                if media_dir is None:
                    raise TrajectoryError("the record holds images: pass media_dir")
                images.append(ImagePart(load_image(Path(media_dir) / item["path"]), id=item.get("id")))
            traj = cls(
                token_ids=[int(t) for t in rec["token_ids"]],
                loss_mask=[int(m) for m in rec["loss_mask"]],
                rollout_logprobs=[float(x) for x in rec["rollout_logprobs"]],
                weight_versions=[int(v) for v in rec["weight_versions"]],
                prompt_length=int(rec["prompt_length"]),
                episode_id=rec.get("episode_id", ""),
                group_id=rec.get("group_id", ""),
                sample_index=int(rec.get("sample_index", 0)),
                env_id=rec.get("env_id", ""),
                seed=rec.get("seed"),
                part=int(rec.get("part", 0)),
                num_parts=int(rec.get("num_parts", 1)),
                reward=float(rec.get("reward", 0.0)),
                reward_components={k: float(v) for k, v in rec.get("reward_components", {}).items()},
                success=bool(rec.get("success", False)),
                stop_reason=rec["stop_reason"],
                error=rec.get("error"),
                turns=[TurnRecord.from_record(t) for t in rec.get("turns", [])],
                messages=[message_from_record(m, media_dir) for m in rec.get("messages", [])],
                tools=list(rec.get("tools", [])),
                images=images,
                image_grid_thw=[list(map(int, g)) for g in rec.get("image_grid_thw", [])],
                image_token_id=rec.get("image_token_id"),
                videos=[_load_frames(media_dir, v) for v in rec.get("videos", [])],
                video_grid_thw=[list(map(int, g)) for g in rec.get("video_grid_thw", [])],
                video_token_id=rec.get("video_token_id"),
                audios=[_load_audio(media_dir, a) for a in rec.get("audios", [])],
                audio_token_id=rec.get("audio_token_id"),
                drift=DriftReport(**rec.get("drift", {})),
                metadata=dict(rec.get("metadata", {})),
            )
        except TrajectoryError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise TrajectoryError(f"malformed trajectory record: {type(exc).__name__}: {exc}") from None
        traj.validate()
        return traj


def _save_frames(writer: MediaWriter | None, video: VideoPart) -> str:
    """The exact frames as ``.npy`` (an mp4 would be lossy, and the trainer needs the pixels the
    engine saw)."""
    return _save_npy(writer, video.frames, prefix="frames", what="videos")


def _save_audio(writer: MediaWriter | None, clip: AudioPart) -> str:
    """The exact float32 samples as ``.npy`` (a WAV would be 16-bit; the trainer needs what the
    engine heard)."""
    import numpy as np

    return _save_npy(writer, np.asarray(clip.waveform, dtype=np.float32), prefix="audio", what="audio")


def _save_npy(writer: MediaWriter | None, array: Any, *, prefix: str, what: str) -> str:
    """Write ``array`` once under a content-hash name in the writer's folder; return the name."""
    import hashlib
    import io

    import numpy as np

    if writer is None:
        raise TrajectoryError(f"this trajectory holds {what}: pass a MediaWriter to save it")
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    data = buf.getvalue()
    name = f"{prefix}-{hashlib.sha1(data).hexdigest()[:16]}.npy"
    path = writer.folder / name
    if not path.exists():
        path.write_bytes(data)
    return name


def _load_audio(media_dir: str | Path | None, name: str) -> AudioPart:
    import numpy as np

    if media_dir is None:
        raise TrajectoryError("the record holds audio: pass media_dir")
    return AudioPart(np.load(Path(media_dir) / name, allow_pickle=False), 16000)


def _load_frames(media_dir: str | Path | None, item: dict[str, Any]) -> VideoPart:
    import numpy as np

    if media_dir is None:
        raise TrajectoryError("the record holds videos: pass media_dir")
    return VideoPart(np.load(Path(media_dir) / item["path"], allow_pickle=False), float(item["fps"]))


def json_safe(value: Any, *, depth: int = 0) -> Any:
    """A JSON-serialisable copy of ``value`` (an env's ``info``): unknown objects become their
    ``repr`` so a record never fails to save."""
    if depth > 8:
        return repr(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth=depth + 1) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return json_safe(value.item(), depth=depth + 1)
        except (TypeError, ValueError):
            pass
    return repr(value)


def save_jsonl(trajectories: Iterable[Trajectory], path: str | Path, media_dir: str | Path | None = None) -> Path:
    """Write one trajectory per line; media go to ``media_dir`` (default: ``<path>.media/``),
    each distinct image stored once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = MediaWriter(media_dir if media_dir is not None else path.with_name(path.name + ".media"))
    with path.open("w", encoding="utf-8") as fh:
        for traj in trajectories:
            fh.write(json.dumps(traj.to_record(writer), ensure_ascii=False) + "\n")
    return path


def iter_jsonl(path: str | Path, media_dir: str | Path | None = None) -> Iterator[Trajectory]:
    """Read trajectories back one by one (see :func:`save_jsonl`)."""
    path = Path(path)
    media = Path(media_dir) if media_dir is not None else path.with_name(path.name + ".media")
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrajectoryError(f"{path}:{lineno}: not JSON ({exc})") from None
            try:
                yield Trajectory.from_record(rec, media)
            except TrajectoryError as exc:
                raise TrajectoryError(f"{path}:{lineno}: {exc}") from None


def load_jsonl(path: str | Path, media_dir: str | Path | None = None) -> list[Trajectory]:
    return list(iter_jsonl(path, media_dir))


__all__ = [
    "FAILED_STOP_REASONS",
    "STOP_REASONS",
    "StopReason",
    "Trajectory",
    "TrajectoryError",
    "TurnRecord",
    "iter_jsonl",
    "json_safe",
    "load_jsonl",
    "save_jsonl",
]
