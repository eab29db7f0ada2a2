"""Turn a parsed ``/generate`` request into engine input, or say clearly why it is bad.

Everything that can fail on user input happens here, before the request reaches the scheduler:
tokenising text, checking token ids against the vocabulary, decoding images, expanding image
placeholders, checking the context length and the sampling parameters. Each failure is a
:class:`BadRequest` with a message a user can act on (the server answers 400).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from PIL import Image
from relax_gym.trainer.models.processing import (
    VisionInputError,
    VisionInputs,
    prepare_vision_inputs,
)

from relax_gym.errors import MediaError, RelaxGymError
from relax_gym.media import load_image
from relax_gym.protocol import GenerateRequest, SamplingParams

from .runner import ModelRunner
from .sampling import SamplingSpec

# SGLang sampling parameters the embedded engine does not implement, with their neutral values.
# A request may send the neutral value (clients often send defaults); anything else is refused.
UNSUPPORTED_SAMPLING: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
}


class BadRequest(RelaxGymError, ValueError):
    """The request cannot be served as sent (HTTP 400)."""

    status = 400


@dataclass(slots=True)
class PreparedPrompt:
    input_ids: list[int]  # with image placeholders expanded
    vision: VisionInputs | None = None


def resolve_sampling(
    params: SamplingParams, runner: ModelRunner, *, max_new_tokens_cap: int | None = None
) -> SamplingSpec:
    """Validate SGLang ``sampling_params`` and resolve them for the sampler."""
    extra = params.model_extra or {}
    for key, neutral in UNSUPPORTED_SAMPLING.items():
        if key in extra and extra[key] != neutral and extra[key] is not None:
            raise BadRequest(f"sampling_params.{key}={extra[key]!r} is not supported by the embedded engine")
    if params.top_k == 0 or params.top_k < -1:
        raise BadRequest(f"sampling_params.top_k must be -1 (off) or >= 1, got {params.top_k}")
    stops: tuple[str, ...]
    if params.stop is None:
        stops = ()
    elif isinstance(params.stop, str):
        stops = (params.stop,) if params.stop else ()
    else:
        stops = tuple(s for s in params.stop if s)
    stop_ids = frozenset(int(t) for t in (params.stop_token_ids or []))
    bad = [t for t in stop_ids if not 0 <= t < runner.vocab_size]
    if bad:
        raise BadRequest(f"stop_token_ids outside the vocabulary [0, {runner.vocab_size}): {sorted(bad)[:5]}")
    max_new = params.max_new_tokens
    if max_new_tokens_cap is not None and max_new > max_new_tokens_cap:
        raise BadRequest(f"max_new_tokens={max_new} exceeds this engine's limit of {max_new_tokens_cap}")
    return SamplingSpec(
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        top_k=int(params.top_k),
        min_p=float(params.min_p),
        max_new_tokens=int(max_new),
        stop_strings=stops,
        stop_token_ids=stop_ids,
        ignore_eos=bool(params.ignore_eos),
        skip_special_tokens=bool(params.skip_special_tokens),
        no_stop_trim=bool(params.no_stop_trim),
    )


def decode_images(items: list[Any], *, allow_paths: bool) -> list[Image.Image]:
    """Decode ``image_data`` entries: data URLs or bare base64 (local file paths only if allowed)."""
    images = []
    for k, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise BadRequest(f"image_data[{k}]: expected a non-empty base64 string or data URL")
        if item.startswith(("http://", "https://")):
            raise BadRequest(f"image_data[{k}]: URLs are not fetched by the embedded engine; send base64 or a data URL")
        if item.startswith("data:"):
            source = item
        elif allow_paths and len(item) < 4096 and os.path.isfile(item):
            source = item
        else:  # bare base64: wrapped so the loader never reads it as a file path
            source = "data:application/octet-stream;base64," + item
        try:
            images.append(load_image(source))
        except MediaError as exc:
            raise BadRequest(f"image_data[{k}]: {exc}") from None
    return images


def prepare_prompt(req: GenerateRequest, runner: ModelRunner, *, allow_media_paths: bool = False) -> PreparedPrompt:
    """Token ids (and Qwen-VL image inputs) for a request; raises BadRequest."""
    if req.audio_data:
        raise BadRequest("audio_data is not supported by the embedded engine")
    if req.video_data:
        raise BadRequest("video_data is not supported by the embedded engine")
    if req.input_ids is not None:
        ids = [int(t) for t in req.input_ids]
        bad = [t for t in ids if not 0 <= t < runner.vocab_size]
        if bad:
            raise BadRequest(
                f"input_ids hold {len(bad)} id(s) outside the vocabulary [0, {runner.vocab_size}): {bad[:5]}"
            )
    else:
        ids = list(runner.tokenizer(req.text or "", add_special_tokens=False)["input_ids"])
    if not ids:
        raise BadRequest("the prompt is empty")
    vision = None
    if req.image_data:
        if not runner.is_vision:
            raise BadRequest("image_data was given but the served model has no vision encoder")
        images = decode_images(list(req.image_data), allow_paths=allow_media_paths)
    else:
        images = []
    if runner.is_vision:
        assert runner.image_processor is not None and runner.vision_tokens is not None
        try:
            vision = prepare_vision_inputs(ids, images, runner.image_processor, runner.vision_tokens)
        except VisionInputError as exc:
            raise BadRequest(str(exc)) from None
        except (ValueError, OSError) as exc:
            raise BadRequest(f"image_data: cannot process the image(s): {exc}") from None
        ids = vision.input_ids
    if len(ids) >= runner.max_context:
        raise BadRequest(f"the prompt has {len(ids)} tokens; the model's context is {runner.max_context}")
    return PreparedPrompt(input_ids=ids, vision=vision if vision is not None and vision.num_images else None)


__all__ = [
    "UNSUPPORTED_SAMPLING",
    "BadRequest",
    "PreparedPrompt",
    "decode_images",
    "prepare_prompt",
    "resolve_sampling",
]
