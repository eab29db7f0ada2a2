"""Qwen-VL image inputs without torchvision: pixel values, grid sizes, image-token expansion.

The PIL-based ``Qwen2VLImageProcessorPil`` turns images into flattened patches and a
``(t, h, w)`` patch grid per image. The language model then needs, for each image, exactly
``t*h*w // merge_size**2`` ``<|image_pad|>`` tokens in ``input_ids`` and ``mm_token_type_ids``
marking them (1 = image) so Qwen3-VL can build its M-RoPE positions. This module does those two
steps once, for the engine, the rollout manager, the trainer and the leaderboards' local HF agent
alike; it is in the core so that none of them imports another's internals to get it. Only
PIL at import time (transformers is loaded when an image processor is built).

A prompt may carry either one ``<|image_pad|>`` per image (as a chat template renders it) or the
already expanded run; both are accepted, anything else is a :class:`VisionInputError`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from relax_gym.content_cache import ContentCache, image_digest
from relax_gym.errors import RelaxGymError

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"


class VisionInputError(RelaxGymError, ValueError):
    """The prompt's image placeholders and the images given do not fit together."""


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """Token ids of the vision markers and the patch merge factor of a Qwen-VL model."""

    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    merge_size: int

    @classmethod
    def from_config(cls, config: Any, merge_size: int | None = None) -> VisionTokens:
        """Read the ids from a Qwen3-VL (or Qwen2-VL) ``PretrainedConfig``."""
        vision: Any = getattr(config, "vision_config", None)
        return cls(
            image_token_id=int(config.image_token_id),
            video_token_id=int(config.video_token_id),
            vision_start_token_id=int(config.vision_start_token_id),
            vision_end_token_id=int(config.vision_end_token_id),
            merge_size=int(merge_size or getattr(vision, "spatial_merge_size", None) or 2),
        )


@dataclass(slots=True)
class VisionInputs:
    """What a Qwen-VL forward pass needs besides the token ids."""

    input_ids: list[int]
    mm_token_type_ids: list[int]
    pixel_values: Any | None = None  # torch.Tensor [num_patches, patch_dim]
    image_grid_thw: Any | None = None  # torch.LongTensor [num_images, 3]
    pixel_values_videos: Any | None = None  # torch.Tensor [num_video_patches, patch_dim]
    video_grid_thw: Any | None = None  # torch.LongTensor [num_videos, 3]
    input_features: Any | None = None  # omni audio: torch.Tensor [num_audios, mel, frames] (relax_gym.audio)
    feature_attention_mask: Any | None = None  # torch.LongTensor [num_audios, frames]

    @property
    def num_images(self) -> int:
        return 0 if self.image_grid_thw is None else int(self.image_grid_thw.shape[0])

    @property
    def num_audios(self) -> int:
        return 0 if self.input_features is None else int(self.input_features.shape[0])

    @property
    def num_videos(self) -> int:
        return 0 if self.video_grid_thw is None else int(self.video_grid_thw.shape[0])


def build_image_processor(
    *,
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
    min_pixels: int = 32 * 32,
    max_pixels: int = 256 * 256,
) -> Any:
    """A PIL-backed Qwen2-VL image processor with Qwen3-VL's patch size and normalisation."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        min_pixels=min_pixels,
        max_pixels=max_pixels,
    )


def load_image_processor(path: str | Path) -> Any:
    """Load the image processor saved beside a model (``preprocessor_config.json``), PIL backend.

    ``AutoImageProcessor`` would pick a torchvision backend when one imports; we always take the
    PIL class so the same pixels come out on every machine.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return CachedImageProcessor(Qwen2VLImageProcessorPil.from_pretrained(str(path)))


#: processed images by (processor settings, image content): pixel values and grid
_PROCESSED_IMAGES: ContentCache[tuple[Any, Any]] = ContentCache(
    65536, max_bytes=256 << 20, size_of=lambda v: v[0].numel() * v[0].element_size())


class CachedImageProcessor:
    """An image processor that processes each distinct image once, by content.

    One image reaches the processor many times per RL step: for each of a GRPO group's G samples
    in the codec (its grid), in the engine (pixels for the prefill) and in the trainer (pixels
    again). Each image is processed on its own and the results concatenated in order, which is
    what the processor does for a list (tested equal). Processors with the same settings share
    one cache (the codec's, the engine's and the trainer's in one process), bounded to 256 MB of
    pixel values. Everything else is the wrapped processor's (attributes, ``save_pretrained``).
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self._settings = hashlib.sha1(processor.to_json_string().encode()).digest()

    def __call__(self, images: Sequence[Image.Image] | None = None, return_tensors: str | None = None,
                 **kwargs: Any) -> Any:
        if kwargs or return_tensors != "pt" or not images or not all(isinstance(im, Image.Image) for im in images):
            return self.processor(images=images, return_tensors=return_tensors, **kwargs)
        import torch
        from transformers import BatchFeature

        parts = [self._one(im) for im in images]
        return BatchFeature({"pixel_values": torch.cat([p for p, _ in parts]),
                             "image_grid_thw": torch.cat([g for _, g in parts])})

    def _one(self, image: Image.Image) -> tuple[Any, Any]:
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        key = self._settings + image_digest(rgb)

        def process() -> tuple[Any, Any]:
            out = self.processor(images=[rgb], return_tensors="pt")
            return out["pixel_values"], out["image_grid_thw"]

        return _PROCESSED_IMAGES.get_or_make(key, process)

    def __getattr__(self, name: str) -> Any:
        if name in ("processor", "_settings"):  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.processor, name)

    def __getstate__(self) -> dict[str, Any]:
        return {"processor": self.processor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["processor"])  # type: ignore[misc]


def image_token_count(grid_thw: Any, merge_size: int) -> int:
    """How many ``<|image_pad|>`` tokens stand for one image with patch grid ``(t, h, w)``."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (merge_size**2)


def token_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of ``token_id`` in ``ids`` (image, video or audio pads)."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == token_id:
            j = i
            while j < n and ids[j] == token_id:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def expand_image_tokens(input_ids: list[int], counts: list[int], image_token_id: int) -> list[int]:
    """Give the k-th run of image pads exactly ``counts[k]`` tokens.

    A run of length 1 is expanded; a run already of the right length is kept; any other length,
    or a number of runs different from the number of images, is an error.
    """
    runs = token_runs(input_ids, image_token_id)
    if len(runs) != len(counts):
        raise VisionInputError(
            f"the prompt has {len(runs)} image placeholder(s) ({IMAGE_TOKEN} runs) "
            f"but {len(counts)} image(s) were given"
        )
    out: list[int] = []
    prev = 0
    for k, ((start, end), count) in enumerate(zip(runs, counts, strict=True)):
        length = end - start
        if length not in (1, count):
            raise VisionInputError(
                f"image {k}: its placeholder run has {length} {IMAGE_TOKEN} tokens; expected 1 or {count}"
            )
        out.extend(input_ids[prev:start])
        out.extend([image_token_id] * count)
        prev = end
    out.extend(input_ids[prev:])
    return out


def prepare_vision_inputs(
    input_ids: list[int], images: list[Image.Image], image_processor: Any, tokens: VisionTokens,
    *, videos: Sequence[tuple[Any, float]] = (), video: Any | None = None, encode: Any | None = None,
) -> VisionInputs:
    """Pixel values, grids, expanded ids and ``mm_token_type_ids`` for a prompt and its images
    (and, with ``video`` -- a :class:`relax_gym.video.VideoSupport` -- and ``encode``, its
    ``(frames, fps)`` videos, taken as sent: no frame sampling, resized only when off-grid).

    Media are given in the order of their placeholders in the prompt.
    """
    if video is None and (videos or tokens.video_token_id in input_ids):
        raise VisionInputError(f"the prompt holds {VIDEO_TOKEN}: video input is not supported here")
    pixel_values = grid = None
    counts: list[int] = []
    if images:
        out = image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        pixel_values, grid = out["pixel_values"], out["image_grid_thw"]
        counts = [image_token_count(g, tokens.merge_size) for g in grid.tolist()]
    ids = expand_image_tokens(list(input_ids), counts, tokens.image_token_id)
    pixel_videos = video_grid = None
    if video is not None and (videos or tokens.video_token_id in ids):
        from relax_gym.errors import MediaError
        from relax_gym.video import expand_video_tokens

        try:
            prepared = video.prepare(list(videos), encode, sample=False)
            ids, _ = expand_video_tokens(ids, prepared.expansions, tokens.video_token_id)
        except MediaError as exc:
            raise VisionInputError(exc.cause) from None
        if prepared.clips:
            out = video.processor([c.frames for c in prepared.clips])
            pixel_videos, video_grid = out["pixel_values_videos"], out["video_grid_thw"]
    types = [1 if t == tokens.image_token_id else 2 if t == tokens.video_token_id else 0 for t in ids]
    return VisionInputs(input_ids=ids, mm_token_type_ids=types, pixel_values=pixel_values, image_grid_thw=grid,
                        pixel_values_videos=pixel_videos, video_grid_thw=video_grid)


def collapse_image_tokens(ids: Sequence[int], image_token_id: int | None) -> list[int]:
    """The inverse of :func:`expand_image_tokens`: each run of image pads shortened to one, as the
    chat template renders it (for comparing with a render, and for readable dumps)."""
    return collapse_runs(ids, image_token_id)


def collapse_runs(ids: Sequence[int], token_id: int | None) -> list[int]:
    """``ids`` with each run of ``token_id`` shortened to one token (None: unchanged)."""
    if token_id is None:
        return list(ids)
    out: list[int] = []
    for t in ids:
        if t == token_id and out and out[-1] == token_id:
            continue
        out.append(t)
    return out


__all__ = [
    "CachedImageProcessor",
    "IMAGE_TOKEN",
    "VIDEO_TOKEN",
    "VISION_END",
    "VISION_START",
    "VisionInputError",
    "VisionInputs",
    "VisionTokens",
    "build_image_processor",
    "collapse_image_tokens",
    "collapse_runs",
    "expand_image_tokens",
    "image_token_count",
    "load_image_processor",
    "prepare_vision_inputs",
    "token_runs",
]
