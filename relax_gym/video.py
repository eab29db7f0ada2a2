"""Qwen-VL video inputs without torchvision: frame sampling, pixel patches, placeholder tokens.

transformers' ``Qwen3VLVideoProcessor`` resizes and normalises through torchvision, which does
not import beside the CPU torch, so this module does the same three steps with PIL and numpy:

1. **sampling** (:func:`sample_video`): keep at most ``fps`` frames per second and at most
   ``max_frames`` frames (evenly spread, first and last kept), and resize every frame with PIL
   (bicubic) to the Qwen grid (sides multiples of ``patch_size * merge_size``, area within
   ``[min_pixels, max_pixels]``). What was reduced is reported so it can be counted; a clip over
   the hard budget is refused with :class:`VideoBudgetError`.
2. **patches** (:class:`VideoProcessor`): rescale, normalise with the image processor's mean and
   std, pad the frame count to the temporal patch size with the last frame, and flatten
   ``(t, h, w)`` patches in Qwen-VL's merge order -- the layout of ``pixel_values_videos``.
3. **tokens** (:func:`video_placeholder`, :func:`expand_video_tokens`): Qwen3-VL's processor
   replaces each ``<|video_pad|>`` with, per temporal patch, ``<T seconds>`` (the mean time of
   its frames, one decimal) + ``<|vision_start|>`` + ``h*w/merge**2`` pads + ``<|vision_end|>``.

The sampled frames are what every stage sees: the rollout sends them losslessly
(:func:`video_payload`, H.264 RGB at qp 0, which decodes to the same bytes), the engine decodes
them without sampling again, and the trainer recomputes the patches from the same frames, so
engine and trainer logprobs can agree exactly. Only numpy and PIL at import time.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from PIL import Image

from relax_gym.content_cache import ContentCache
from relax_gym.errors import MediaError

VIDEO_TOKEN = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
_EXPANDED = re.compile(
    r"(?:<\d+(?:\.\d+)? seconds>" + re.escape(VISION_START) + r"(?:" + re.escape(VIDEO_TOKEN) + r")+"
    + re.escape(VISION_END) + r")+"
)


class VideoBudgetError(MediaError):
    """A clip is over the configured budget (source frames or duration) and is refused."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__("video", "<clip>", detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class VideoSampling:
    """How a video observation is reduced before it reaches the model (``model.video`` in a
    config). Defaults fit a CPU: 8 frames at 2 fps, 64x64 per frame (4 merged tokens per frame
    pair with Qwen3-VL's 32-pixel merged patch)."""

    fps: float = 2.0  # most frames kept per second of source video
    max_frames: int = 8  # most frames kept per clip (evenly spread)
    min_pixels: int = 32 * 32  # per frame, after resizing
    max_pixels: int = 64 * 64  # per frame, after resizing
    max_source_frames: int = 2048  # a longer clip is refused, not sampled
    max_source_seconds: float = 300.0  # a longer clip is refused, not sampled

    def __post_init__(self) -> None:
        if self.fps <= 0 or self.max_frames < 1 or self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ValueError(f"invalid video sampling {self}")


@dataclass(slots=True)
class SampledVideo:
    """Frames as the model sees them, their frame rate, and what sampling reduced."""

    frames: np.ndarray  # uint8 [T, H, W, 3]
    fps: float
    reduced: list[str] = field(default_factory=list)  # "fps", "frames", "resolution"


def _snap_fps(fps: float) -> float:
    """The frame rate a container stores for ``fps`` (a fraction with denominator <= 1000), so
    timestamps computed before encoding equal those computed after decoding."""
    return float(Fraction(fps).limit_denominator(1000))


def frame_size(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL's resize rule for one frame: sides multiples of ``factor``, area in range."""
    from_transformers = _smart_resize()
    h, w = from_transformers(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
    return int(h), int(w)


def _smart_resize() -> Callable[..., tuple[int, int]]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize  # type: ignore[no-any-return]


def sample_video(
    frames: np.ndarray, fps: float, sampling: VideoSampling, *, factor: int = 32
) -> SampledVideo:
    """Reduce a clip to what the model is given (see the module docstring); raises
    :class:`VideoBudgetError` for a clip over the hard budget."""
    from relax_gym.media import sample_frame_indices

    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] == 0 or arr.dtype != np.uint8:
        raise MediaError("video", "<clip>", f"expected uint8 frames [T, H, W, 3], got {arr.dtype} {arr.shape}")
    total = int(arr.shape[0])
    if total > sampling.max_source_frames:
        raise VideoBudgetError("frames", f"{total} frames exceed the budget of {sampling.max_source_frames}")
    if fps <= 0 or not math.isfinite(fps):
        raise MediaError("video", "<clip>", f"invalid frame rate {fps}")
    if total / fps > sampling.max_source_seconds:
        raise VideoBudgetError(
            "duration", f"{total / fps:.1f} s exceed the budget of {sampling.max_source_seconds:g} s"
        )
    reduced: list[str] = []
    idx = sample_frame_indices(total, fps, sampling.fps, None)
    if len(idx) < total:
        reduced.append("fps")
    if len(idx) > sampling.max_frames:
        pick = np.linspace(0, len(idx) - 1, sampling.max_frames).round().astype(int)
        idx = [idx[i] for i in pick]
        reduced.append("frames")
    kept = arr[idx]
    # the kept frames span the clip, so their rate is their count over its duration
    out_fps = _snap_fps(len(idx) / (total / fps)) if len(idx) < total else _snap_fps(fps)
    h, w = kept.shape[1:3]
    nh, nw = frame_size(h, w, factor=factor, min_pixels=sampling.min_pixels, max_pixels=sampling.max_pixels)
    if (nh, nw) != (h, w):
        if nh * nw < h * w:
            reduced.append("resolution")
        kept = np.stack([np.asarray(Image.fromarray(f).resize((nw, nh), Image.Resampling.BICUBIC)) for f in kept])
    return SampledVideo(np.ascontiguousarray(kept, dtype=np.uint8), out_fps, reduced)


@dataclass(frozen=True, slots=True)
class VideoProcessor:
    """``pixel_values_videos`` / ``video_grid_thw`` for frames already at a grid size."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)

    @classmethod
    def from_image_processor(cls, processor: Any) -> VideoProcessor:
        """The video twin of a Qwen-VL image processor (same patches and normalisation)."""
        return cls(
            patch_size=int(processor.patch_size),
            temporal_patch_size=int(processor.temporal_patch_size),
            merge_size=int(processor.merge_size),
            image_mean=tuple(float(x) for x in processor.image_mean),
            image_std=tuple(float(x) for x in processor.image_std),
        )

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def grid(self, frames: np.ndarray) -> list[int]:
        t, h, w = int(frames.shape[0]), int(frames.shape[1]), int(frames.shape[2])
        self._check_size(h, w)
        return [-(-t // self.temporal_patch_size), h // self.patch_size, w // self.patch_size]

    def _check_size(self, h: int, w: int) -> None:
        if h % self.factor or w % self.factor:
            raise MediaError("video", "<clip>", f"frame size {h}x{w} is not a multiple of {self.factor}; sample it first")

    def patches(self, frames: np.ndarray) -> np.ndarray:
        """``[t*h*w, 3 * temporal * patch * patch]`` float32 patches of one clip."""
        arr = np.asarray(frames, dtype=np.float32)
        t, h, w = arr.shape[:3]
        self._check_size(h, w)
        mean = np.asarray(self.image_mean, dtype=np.float32)
        std = np.asarray(self.image_std, dtype=np.float32)
        x = ((arr * np.float32(1 / 255) - mean) / std).transpose(0, 3, 1, 2)  # [T, C, H, W]
        tp, p, m = self.temporal_patch_size, self.patch_size, self.merge_size
        if pad := -t % tp:
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)
        gt, gh, gw = x.shape[0] // tp, h // p, w // p
        x = x.reshape(gt, tp, 3, gh // m, m, p, gw // m, m, p)
        # (t, merged rows, merged cols, row in merge, col in merge) outside; (C, time, y, x) inside
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return np.ascontiguousarray(x.reshape(gt * gh * gw, 3 * tp * p * p))

    def __call__(self, videos: Sequence[np.ndarray]) -> dict[str, Any]:
        import torch

        pixels = [self.patches(v) for v in videos]
        return {
            "pixel_values_videos": torch.from_numpy(np.concatenate(pixels, axis=0)),
            "video_grid_thw": torch.tensor([self.grid(v) for v in videos], dtype=torch.long),
        }


def timestamps(num_frames: int, fps: float, temporal_patch_size: int) -> list[float]:
    """Mean time of each temporal patch's frames (frame ``i`` at ``i / fps``; the count padded
    with the last frame), as Qwen3-VL's processor stamps them."""
    idx = list(range(num_frames))
    idx.extend(idx[-1] for _ in range(-num_frames % temporal_patch_size))
    times = [i / fps for i in idx]
    return [(times[i] + times[i + temporal_patch_size - 1]) / 2 for i in range(0, len(times), temporal_patch_size)]


def video_placeholder(grid_thw: Sequence[int], num_frames: int, fps: float, *, merge_size: int,
                      temporal_patch_size: int) -> str:
    """The text that stands for one video in Qwen3-VL's prompt (replacing its ``<|video_pad|>``)."""
    t, h, w = (int(x) for x in grid_thw)
    per_frame = h * w // merge_size**2
    stamps = timestamps(num_frames, fps, temporal_patch_size)
    if len(stamps) != t:
        raise MediaError("video", "<clip>", f"{num_frames} frames give {len(stamps)} temporal patches, grid says {t}")
    return "".join(f"<{s:.1f} seconds>{VISION_START}{VIDEO_TOKEN * per_frame}{VISION_END}" for s in stamps)


def collapse_video_text(text: str) -> str:
    """Each expanded video placeholder back to one ``<|video_pad|>`` (as the template renders it)."""
    return _EXPANDED.sub(VIDEO_TOKEN, text)


class VideoTokenError(MediaError):
    """The prompt's video placeholders and the videos given do not fit together."""

    def __init__(self, detail: str) -> None:
        super().__init__("video", "<prompt>", detail)


def expand_video_tokens(
    ids: Sequence[int], expansions: Sequence[Sequence[int]], video_token_id: int
) -> tuple[list[int], list[tuple[int, int]]]:
    """Give the k-th video its placeholder tokens ``expansions[k]``; returns the ids and the
    ``(start, end)`` span of each video's tokens in them.

    A video is written either as one ``<|video_pad|>`` (as the template renders it) or already
    expanded (the exact tokens of ``expansions[k]``); anything else is a :class:`VideoTokenError`.
    """
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    i, n, k = 0, len(ids), 0
    while i < n:
        if ids[i] != video_token_id:
            out.append(int(ids[i]))
            i += 1
            continue
        if k >= len(expansions):
            raise VideoTokenError(f"the prompt has more {VIDEO_TOKEN} placeholders than the {len(expansions)} video(s) given")
        exp = list(expansions[k])
        lead = exp.index(video_token_id)  # timestamp tokens before the first pad
        start = len(out) - lead
        if lead <= len(out) and out[start:] == exp[:lead] and list(ids[i : i + len(exp) - lead]) == exp[lead:]:
            out.extend(exp[lead:])  # already expanded
            spans.append((start, len(out)))
            i += len(exp) - lead
        elif i + 1 >= n or ids[i + 1] != video_token_id:
            spans.append((len(out), len(out) + len(exp)))
            out.extend(exp)
            i += 1
        else:
            raise VideoTokenError(f"video {k}: its placeholder is neither one {VIDEO_TOKEN} nor its expanded form")
        k += 1
    if k != len(expansions):
        raise VideoTokenError(f"the prompt has {k} video placeholder(s) but {len(expansions)} video(s) were given")
    return out, spans


def collapse_spans(ids: Sequence[int], spans: Sequence[tuple[int, int]], video_token_id: int) -> list[int]:
    """``ids`` with each video span replaced by one ``<|video_pad|>`` (SGLang's form)."""
    out: list[int] = []
    prev = 0
    for start, end in sorted(spans):
        out.extend(ids[prev:start])
        out.append(video_token_id)
        prev = end
    out.extend(ids[prev:])
    return out


@dataclass(slots=True)
class PreparedVideos:
    """Sampled clips of one render, their grids and the placeholder tokens of each."""

    clips: list[SampledVideo] = field(default_factory=list)
    grids: list[list[int]] = field(default_factory=list)
    expansions: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class VideoSupport:
    """What a Qwen3-VL model needs to take video: the processor, the sampling and the pad id."""

    processor: VideoProcessor
    sampling: VideoSampling
    video_token_id: int

    def prepare(self, clips: Sequence[tuple[np.ndarray, float]], encode: Callable[[str], list[int]],
                *, sample: bool = True) -> PreparedVideos:
        """Sample each ``(frames, fps)`` clip (``sample=False``: frames as given, resized only if
        off-grid), its grid and its placeholder tokens (``encode`` tokenizes text)."""
        out = PreparedVideos()
        for frames, fps in clips:
            if sample:
                clip = sample_video(frames, fps, self.sampling, factor=self.processor.factor)
            else:
                unbounded = VideoSampling(fps=max(float(fps), 1e-6), max_frames=len(frames) or 1,
                                          min_pixels=self.sampling.min_pixels, max_pixels=self.sampling.max_pixels,
                                          max_source_frames=max(len(frames), 1), max_source_seconds=math.inf)
                clip = sample_video(frames, fps, unbounded, factor=self.processor.factor)
            grid = self.processor.grid(clip.frames)
            text = video_placeholder(grid, len(clip.frames), clip.fps, merge_size=self.processor.merge_size,
                                     temporal_patch_size=self.processor.temporal_patch_size)
            out.clips.append(clip)
            out.grids.append(grid)
            out.expansions.append(list(encode(text)))
        return out


def encode_lossless(frames: np.ndarray, fps: float) -> bytes:
    """H.264 RGB at qp 0 in mp4: any ffmpeg-based reader (PyAV, decord, SGLang) decodes the
    exact frames back. Needs PyAV (the ``video`` extra); sides are padded to even by ``edge``."""
    try:
        import av
    except ImportError:
        raise MediaError("video", "<clip>", "sending video needs PyAV: pip install 'relax-gym[video]'") from None
    from relax_gym.media import mux_frames

    arr = np.ascontiguousarray(frames, dtype=np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264rgb", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = arr.shape[2], arr.shape[1]
        stream.pix_fmt = "rgb24"
        stream.options = {"qp": "0", "preset": "ultrafast", "threads": "1"}
        stream.thread_count = 1
        mux_frames(container, stream, arr)
    return buf.getvalue()


_PAYLOADS: ContentCache[str] = ContentCache(64)  # clips; a group's samples share one clip, so most calls hit


def video_payload(frames: np.ndarray, fps: float) -> str:
    """A ``video_data`` entry (mp4 data URL) that decodes to exactly ``frames``; memoised by
    content (the samples of a GRPO group, and every turn of an episode, send the same clip)."""
    from relax_gym.media import frames_key, to_data_url

    arr = np.ascontiguousarray(frames, dtype=np.uint8)
    return _PAYLOADS.get_or_make(frames_key(arr, fps), lambda: to_data_url(encode_lossless(arr, fps), "mp4"))


__all__ = [
    "PreparedVideos",
    "VideoSupport",
    "SampledVideo",
    "VideoBudgetError",
    "VideoProcessor",
    "VideoSampling",
    "VideoTokenError",
    "collapse_spans",
    "collapse_video_text",
    "encode_lossless",
    "expand_video_tokens",
    "frame_size",
    "sample_video",
    "timestamps",
    "video_payload",
    "video_placeholder",
]
