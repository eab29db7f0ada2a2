"""Qwen3-VL on Megatron: a Megatron language model plus Hugging Face's vision tower.

The language model is a ``GPTModel`` (TP/PP-sharded like any Qwen3) with Qwen3-VL's
interleaved mRoPE. The vision tower is transformers' ``Qwen3VLVisionModel`` run as a plain
torch module, replicated on every TP rank of the first pipeline stage (it is small next to the
decoder). The glue is what Qwen3-VL itself does:

- the vision tower turns ``pixel_values`` into one embedding per merged patch; those are
  scattered into the ``<|image_pad|>`` positions of the token embeddings;
- its DeepStack features (from intermediate vision layers) are added to the hidden states of
  the first decoder layers at the same positions (forward hooks on those layers);
- position ids are 3-D (temporal, height, width): text tokens advance all three together, an
  image's tokens get its (t, h, w) grid coordinates (``mrope_position_ids``).

Images are supported; videos are not wired yet and are rejected with a clear error.
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


def mrope_position_ids(
    input_ids: torch.Tensor,
    image_token_id: int,
    image_grid_thw: torch.Tensor | None,
    spatial_merge_size: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Qwen3-VL's ``[3, batch, seq]`` (t, h, w) position ids for a batch with images.

    Text tokens take ``current, current, current`` and advance by one. An image run starts at
    ``current`` and spans its merged grid: ``t = current + frame``, ``h = current + row``,
    ``w = current + col``; afterwards ``current`` advances by ``max(rows, cols)``. Padding
    (``attention_mask == 0``) gets position 0 and is skipped, as in transformers.
    """
    batch, seq = input_ids.shape
    positions = torch.zeros(3, batch, seq, dtype=torch.long, device=input_ids.device)
    grids = iter(image_grid_thw.tolist()) if image_grid_thw is not None else iter(())
    for b in range(batch):
        valid = (
            attention_mask[b].bool()
            if attention_mask is not None
            else torch.ones(seq, dtype=torch.bool, device=input_ids.device)
        )
        is_image = (input_ids[b][valid] == image_token_id).tolist()
        pieces: list[torch.Tensor] = []
        current = 0
        for image, run in itertools.groupby(is_image):
            length = len(list(run))
            if not image:
                pieces.append(torch.arange(current, current + length).expand(3, -1))
                current += length
                continue
            try:
                t, h, w = next(grids)
            except StopIteration:
                raise MegatronBridgeError(
                    "more image runs in input_ids than image_grid_thw rows"
                ) from None
            gh, gw = h // spatial_merge_size, w // spatial_merge_size
            if t * gh * gw != length:
                raise MegatronBridgeError(
                    f"an image run has {length} <|image_pad|> tokens but its grid {t}x{h}x{w} "
                    f"needs {t * gh * gw} (= t*h*w / merge_size**2)"
                )
            tt, hh, ww = torch.meshgrid(
                torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij"
            )
            pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + current)
            current += max(gh, gw)
        if pieces:
            positions[:, b, valid] = torch.cat(pieces, dim=1).to(positions.device)
    if next(grids, None) is not None:
        raise MegatronBridgeError("image_grid_thw has more rows than image runs in input_ids")
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
    ) -> torch.Tensor:
        """Vocab-parallel logits ``[b, s, vocab/tp]`` (or hidden states on non-last stages).

        ``padding_mask`` is the HF-style ``[b, s]`` mask (1 = real token); it only shapes the
        default position ids (right padding never influences earlier tokens under causal
        attention). ``attention_mask`` is Megatron's bool ``[b, 1, s, s]`` (True = blocked),
        e.g. block-diagonal for packed sequences; None means causal.
        """
        if pixel_values_videos is not None:
            raise MegatronBridgeError("video inputs are not supported by the Megatron Qwen3-VL yet")
        if position_ids is None:
            position_ids = mrope_position_ids(
                input_ids,
                self.image_token_id,
                image_grid_thw,
                self.spatial_merge_size,
                padding_mask,
            )
        decoder_input = None
        self._deepstack = None
        if self.pre_process:
            decoder_input = self.language_model.embedding(input_ids=input_ids, position_ids=None)
            if pixel_values is not None:
                decoder_input = self._merge_images(
                    input_ids, decoder_input, pixel_values, image_grid_thw
                )
        try:
            logits: torch.Tensor = self.language_model(
                input_ids, position_ids, attention_mask, decoder_input=decoder_input
            )
            return logits
        finally:
            self._deepstack = None

    def _merge_images(
        self,
        input_ids: torch.Tensor,
        embeds: torch.Tensor,
        pixel_values: torch.Tensor,
        image_grid_thw: torch.Tensor | None,
    ) -> torch.Tensor:
        assert self.visual is not None
        if image_grid_thw is None:
            raise MegatronBridgeError("pixel_values need image_grid_thw")
        out = self.visual(
            pixel_values.to(self.visual.dtype), grid_thw=image_grid_thw, return_dict=True
        )
        image_embeds = out.pooler_output
        mask = input_ids == self.image_token_id  # [b, s]
        if int(mask.sum()) != image_embeds.shape[0]:
            raise MegatronBridgeError(
                f"{int(mask.sum())} <|image_pad|> tokens but the vision tower produced "
                f"{image_embeds.shape[0]} embeddings; expand each pad to grid.prod() // merge**2"
            )
        by_batch = embeds.transpose(0, 1)  # [s, b, h] -> [b, s, h]
        by_batch = by_batch.masked_scatter(mask.unsqueeze(-1), image_embeds.to(by_batch.dtype))
        self._deepstack = (mask, list(out.deepstack_features))
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
