"""Qwen3-VL on Megatron: a Megatron language model plus Hugging Face's vision tower.

The language model is a ``GPTModel`` (TP/PP-sharded like any Qwen3) with Qwen3-VL's
interleaved mRoPE. The vision tower is transformers' ``Qwen3VLVisionModel`` run as a plain
torch module, replicated on every TP rank of the first pipeline stage (it is small next to the
decoder). The glue is what Qwen3-VL itself does:

- the vision tower turns ``pixel_values`` into one embedding per merged patch; those are
  scattered into the ``<|image_pad|>`` positions of the token embeddings, and likewise
  ``pixel_values_videos`` (with ``video_grid_thw``) into the ``<|video_pad|>`` positions;
- its DeepStack features (from intermediate vision layers) are added to the hidden states of
  the first decoder layers at the same positions (forward hooks on those layers);
- position ids are 3-D (temporal, height, width): text tokens advance all three together, an
  image's tokens get its (t, h, w) grid coordinates (``mrope_position_ids``). A video is one
  run of pads per temporal patch (the runs are separated by their ``<T seconds>`` stamps), and
  each run is placed like a one-frame image, as transformers' ``get_rope_index`` does.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from megatron.core.transformer.module import MegatronModule
from relax_gym.trainer.backends.megatron.bridge import Bucket
from relax_gym.trainer.backends.megatron.config import (
    MegatronBridgeError,
    MegatronConfig,
    dims_from_hf_config,
    transformer_config,
)
from relax_gym.trainer.backends.megatron.model import build_gpt_model
from relax_gym.trainer.backends.megatron.sources import TensorSource

VISION_PREFIX = "model.visual."


def _frame_grids(video_grid_thw: torch.Tensor | None) -> list[list[int]]:
    """Each video's ``(t, h, w)`` as ``t`` one-frame grids: Qwen3-VL stamps every temporal
    patch with its time, so each is its own run of pads."""
    if video_grid_thw is None:
        return []
    return [[1, h, w] for t, h, w in video_grid_thw.tolist() for _ in range(t)]


def mrope_position_ids(
    input_ids: torch.Tensor,
    image_token_id: int,
    image_grid_thw: torch.Tensor | None,
    spatial_merge_size: int,
    attention_mask: torch.Tensor | None = None,
    *,
    video_token_id: int | None = None,
    video_grid_thw: torch.Tensor | None = None,
) -> torch.Tensor:
    """Qwen3-VL's ``[3, batch, seq]`` (t, h, w) position ids for a batch with images and videos.

    Text tokens take ``current, current, current`` and advance by one. An image run starts at
    ``current`` and spans its merged grid: ``t = current + frame``, ``h = current + row``,
    ``w = current + col``; afterwards ``current`` advances by ``max(rows, cols)``. A video's
    temporal patches are separate runs of ``<|video_pad|>``, each placed as a one-frame image.
    Padding (``attention_mask == 0``) gets position 0 and is skipped, as in transformers.
    """
    batch, seq = input_ids.shape
    positions = torch.zeros(3, batch, seq, dtype=torch.long, device=input_ids.device)
    grids = {
        1: iter(image_grid_thw.tolist()) if image_grid_thw is not None else iter(()),
        2: iter(_frame_grids(video_grid_thw)),
    }
    names = {1: ("image", "<|image_pad|>", "image_grid_thw"), 2: ("video", "<|video_pad|>", "video_grid_thw")}
    for b in range(batch):
        valid = (
            attention_mask[b].bool()
            if attention_mask is not None
            else torch.ones(seq, dtype=torch.bool, device=input_ids.device)
        )
        row = input_ids[b][valid].tolist()
        kinds = [1 if t == image_token_id else 2 if t == video_token_id else 0 for t in row]
        pieces: list[torch.Tensor] = []
        current = 0
        for kind, run in itertools.groupby(kinds):
            length = len(list(run))
            if not kind:
                pieces.append(torch.arange(current, current + length).expand(3, -1))
                current += length
                continue
            what, pad, key = names[kind]
            try:
                t, h, w = next(grids[kind])
            except StopIteration:
                raise MegatronBridgeError(f"more {what} runs in input_ids than {key} rows") from None
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            if t * gh * gw != length:
                raise MegatronBridgeError(
                    f"an {what} run has {length} {pad} tokens but its grid {t}x{h}x{w} "
                    f"needs {t * gh * gw} (= t*h*w / merge_size**2)"
                )
            tt, hh, ww = torch.meshgrid(
                torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij"
            )
            pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + current)
            current += max(gh, gw)
        if pieces:
            positions[:, b, valid] = torch.cat(pieces, dim=1).to(positions.device)
    for kind, (what, _, key) in names.items():
        if next(grids[kind], None) is not None:
            raise MegatronBridgeError(f"{key} has more rows than {what} runs in input_ids")
    return positions


class Qwen3VLMegatron(MegatronModule):  # type: ignore[misc]
    """Qwen3-VL for Megatron training: ``language_model`` (GPTModel) + ``visual`` (HF module).

    A ``MegatronModule``, so Megatron's DDP, optimizer and distributed checkpoints handle it
    (the vision tower's parameters are saved as replicated tensors).
    """

    def __init__(self, hf_config: Any, cfg: MegatronConfig) -> None:
        from megatron.core import parallel_state
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

        if getattr(hf_config, "model_type", None) != "qwen3_vl":
            raise MegatronBridgeError("Qwen3VLMegatron needs a Qwen3VLConfig")
        dims = dims_from_hf_config(hf_config)
        config = transformer_config(dims, cfg)
        super().__init__(config=config)
        self.dims = dims
        self.image_token_id = int(hf_config.image_token_id)
        self.video_token_id = int(hf_config.video_token_id)
        self.spatial_merge_size = int(hf_config.vision_config.spatial_merge_size)
        self.language_model = build_gpt_model(self.dims, cfg, config=config)
        self.model_type = self.language_model.model_type  # read by Megatron's schedules
        self.pre_process = parallel_state.is_pipeline_first_stage()
        self.visual = None
        if self.pre_process:
            self.visual = Qwen3VLVisionModel._from_config(  # type: ignore[no-untyped-call]
                hf_config.vision_config, dtype=cfg.torch_dtype
            )
            if torch.cuda.is_available():
                self.visual.cuda(torch.cuda.current_device())
        n_deepstack = len(hf_config.vision_config.deepstack_visual_indexes)
        self._deepstack: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        for layer in self.language_model.decoder.layers:
            level = layer.layer_number - 1
            if level < n_deepstack:
                if not self.pre_process:
                    raise MegatronBridgeError(
                        "DeepStack layers must sit on the first pipeline stage; use fewer stages"
                    )
                layer.register_forward_hook(self._deepstack_hook(level))

    def _deepstack_hook(self, level: int) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            if self._deepstack is None:
                return output
            mask, features = self._deepstack
            hidden, context = output
            by_batch = hidden.transpose(0, 1).clone()  # [b, s, h]: HF's feature order
            by_batch[mask] = by_batch[mask] + features[level].to(by_batch.dtype)
            return by_batch.transpose(0, 1).contiguous(), context

        return hook

    def set_input_tensor(self, input_tensor: Any) -> None:
        """Pipeline stages > 0 receive hidden states instead of embeddings (Megatron schedules)."""
        self.language_model.set_input_tensor(input_tensor)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        pixel_values_videos: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Vocab-parallel logits ``[b, s, vocab/tp]`` (or hidden states on non-last stages).

        ``padding_mask`` is the HF-style ``[b, s]`` mask (1 = real token); it only shapes the
        default position ids (right padding never influences earlier tokens under causal
        attention). ``attention_mask`` is Megatron's bool ``[b, 1, s, s]`` (True = blocked),
        e.g. block-diagonal for packed sequences; None means causal.
        """
        if position_ids is None:
            position_ids = mrope_position_ids(
                input_ids,
                self.image_token_id,
                image_grid_thw,
                self.spatial_merge_size,
                padding_mask,
                video_token_id=self.video_token_id,
                video_grid_thw=video_grid_thw,
            )
        decoder_input = None
        self._deepstack = None
        if self.pre_process:
            decoder_input = self.language_model.embedding(input_ids=input_ids, position_ids=None)
            media = [
                (pixels, grid, token, name)
                for pixels, grid, token, name in (
                    (pixel_values, image_grid_thw, self.image_token_id, "image"),
                    (pixel_values_videos, video_grid_thw, self.video_token_id, "video"),
                )
                if pixels is not None
            ]
            if media:
                decoder_input = self._merge_media(input_ids, decoder_input, media)
        try:
            logits: torch.Tensor = self.language_model(
                input_ids, position_ids, attention_mask, decoder_input=decoder_input
            )
            return logits
        finally:
            self._deepstack = None

    def _merge_media(
        self,
        input_ids: torch.Tensor,
        embeds: torch.Tensor,
        media: list[tuple[torch.Tensor, torch.Tensor | None, int, str]],
    ) -> torch.Tensor:
        """Scatter each modality's vision embeddings into its pad positions and keep the
        DeepStack features of all visual positions, in their order in the ``[b, s]`` batch
        (images and videos interleaved as HF's ``visual_pos_masks`` orders them)."""
        assert self.visual is not None
        by_batch = embeds.transpose(0, 1)  # [s, b, h] -> [b, s, h]
        masks: list[torch.Tensor] = []
        features: list[list[torch.Tensor]] = []
        for pixels, grid, token_id, name in media:
            if grid is None:
                key = "image_grid_thw" if name == "image" else "video_grid_thw"
                raise MegatronBridgeError(f"{name} pixel values need {key}")
            out = self.visual(pixels.to(self.visual.dtype), grid_thw=grid, return_dict=True)
            vision_embeds = out.pooler_output
            mask = input_ids == token_id  # [b, s]
            if int(mask.sum()) != vision_embeds.shape[0]:
                raise MegatronBridgeError(
                    f"{int(mask.sum())} <|{name}_pad|> tokens but the vision tower produced "
                    f"{vision_embeds.shape[0]} embeddings; expand each pad to grid.prod() // merge**2"
                )
            by_batch = by_batch.masked_scatter(mask.unsqueeze(-1), vision_embeds.to(by_batch.dtype))
            masks.append(mask)
            features.append(list(out.deepstack_features))
        joint = masks[0]
        for mask in masks[1:]:
            joint = joint | mask
        levels = []
        for level in range(len(features[0])):
            if len(masks) == 1:
                levels.append(features[0][level])
                continue
            first = features[0][level]
            merged = first.new_zeros(int(joint.sum()), first.shape[-1])
            for mask, feats in zip(masks, features, strict=True):
                merged[mask[joint]] = feats[level].to(merged.dtype)
            levels.append(merged)
        self._deepstack = (joint, levels)
        return by_batch.transpose(0, 1).contiguous()

    def load_hf(self, source: TensorSource) -> int:
        """Load this rank's language-model shards and the vision tower from one HF source."""
        from relax_gym.trainer.backends.megatron.bridge import load_hf_weights

        return load_hf_weights(self.language_model, self.dims, source) + self.load_vision_weights(
            source
        )

    @torch.no_grad()
    def load_vision_weights(self, source: TensorSource) -> int:
        """Load ``model.visual.*`` into the vision tower (replicated, no sharding)."""
        if self.visual is None:
            return 0
        state = {}
        for name in self.visual.state_dict():
            state[name] = source.read(VISION_PREFIX + name)
        self.visual.load_state_dict(state, strict=True)
        return len(state)

    def vision_hf_tensors(self) -> Bucket:
        """The vision tower's parameters under their HF names (first stage only)."""
        if self.visual is None:
            return []
        return [
            (VISION_PREFIX + n, t.detach().clone()) for n, t in self.visual.state_dict().items()
        ]
