"""The model side of the embedded engine: load a HF model and run batched prefill / decode steps.

One :class:`ModelRunner` owns the model and is used by a single thread (the scheduler). Text
models (Qwen3) and Qwen-VL models (Qwen3-VL) share one code path: positions are computed per
sequence and passed explicitly -- plain ``0..n-1`` for text, M-RoPE ``(t, h, w)`` positions
from the model's own ``get_rope_index`` for Qwen-VL -- so sequences of different lengths and
with different images batch together under left padding.

A prefill batch computes each distinct sequence once: an RL rollout sends every prompt ``G``
times (one row per sample of a group), and identical rows have identical KV and logits. The
runner forwards one row per distinct prompt and copies its KV, last logits and prompt logits
into every row that shares it (what SGLang's radix cache does by reference; we copy, since each
row's KV then grows on its own). Only text-only rows are shared: a row with image, video or
audio inputs is always computed on its own. Sampling stays per row -- only the prefill is shared.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from relax_gym.content_cache import tensor_digest
from relax_gym.errors import RelaxGymError

from relax_gym.trainer.engines.kv import BatchKV
from relax_gym.trainer.models.architectures import check_servable, served_context


class WeightUpdateError(RelaxGymError, ValueError):
    """New weights do not fit the served model (unknown name, wrong shape, unreadable files)."""


@dataclass(slots=True)
class SeqInput:
    """One sequence to prefill: the full token ids and, for Qwen-VL, its image inputs."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    input_features: torch.Tensor | None = None  # omni audio [clips, mel, frames]
    feature_attention_mask: torch.Tensor | None = None
    mm_token_type_ids: list[int] | None = None
    want_prompt_logits: bool = False
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # cached KV of a token prefix
    past_len: int = 0
    media_digests: tuple[str | None, ...] | None = None  # dedupe_key's memo: admission and prefill both ask


def dedupe_key(seq: SeqInput) -> Hashable | None:
    """What makes two prefill rows identical: token ids, cached-prefix length, the multimodal
    token types of a Qwen-VL row and the content of its image, video or audio inputs (a GRPO
    group sends one image G times). None for a row never shared: media on top of a cached prefix."""
    if seq.media_digests is None:  # hashing a row's pixels is the costly part: once per input
        seq.media_digests = tuple(tensor_digest(t) if t is not None else None
                                  for t in (seq.pixel_values, seq.image_grid_thw, seq.pixel_values_videos,
                                            seq.video_grid_thw, seq.input_features, seq.feature_attention_mask))
    media = seq.media_digests
    if seq.past is not None and any(m is not None for m in media):
        return None
    types = None if seq.mm_token_type_ids is None or not any(seq.mm_token_type_ids) else tuple(seq.mm_token_type_ids)
    return tuple(seq.input_ids), seq.past_len, types, media


@dataclass(slots=True)
class PrefillOutput:
    last_logits: torch.Tensor  # [B, V]
    prompt_logits: list[torch.Tensor | None]  # per row [n, V] over its prompt positions, if asked
    next_positions: list[int]  # text position of each row's next token
    rope_deltas: list[int]  # M-RoPE offset of each row (0 for text models)
    kv: BatchKV

    def expand(self, rows: list[int], want_prompt_logits: list[bool]) -> PrefillOutput:
        """Row ``i`` of the result is row ``rows[i]`` of this one (KV copied per row)."""
        kv = self.kv.select(rows)
        assert kv is not None
        return PrefillOutput(
            last_logits=self.last_logits.index_select(0, torch.tensor(rows, dtype=torch.long)),
            prompt_logits=[self.prompt_logits[r] if w else None for r, w in zip(rows, want_prompt_logits, strict=True)],
            next_positions=[self.next_positions[r] for r in rows],
            rope_deltas=[self.rope_deltas[r] for r in rows],
            kv=kv,
        )


@dataclass(slots=True)
class RunnerStats:
    forward_s: float = 0.0  # time spent inside model forward passes (the engine's busy time)
    prefill_tokens: int = 0  # prompt tokens run through the model
    prefill_rows: int = 0  # rows run through the model (distinct sequences of each prefill)
    prefill_tokens_saved: int = 0  # prompt tokens not run because an identical row in the batch was
    decode_steps: int = 0
    decode_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def _model_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM


class ModelRunner:
    """A HF causal LM (optionally Qwen-VL) on CPU, driven one batched step at a time."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        logits_to_keep_prompt: bool = True,
        dedupe_prefill: bool = True,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.model_path = str(model_path)
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.config = AutoConfig.from_pretrained(self.model_path)
        check_servable(self.config)  # Llama/SmolLM, Qwen2, Qwen3, Qwen3-VL, Gemma-3 text; others refused by name
        self.is_vision = hasattr(self.config, "vision_config")
        self.text_config = self.config.get_text_config(decoder=True)
        self.vocab_size = int(self.text_config.vocab_size)
        self.max_context = served_context(self.text_config)  # a sliding-window family: its window
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = self._load(self.model_path)
        self.image_processor = None
        self.vision_tokens = None
        self.video_support = None  # relax_gym.video.VideoSupport for Qwen3-VL
        self.audio_support = None  # relax_gym.audio.AudioSupport for the Qwen3-Omni thinker
        from relax_gym.audio import AudioSupport, is_omni

        self.is_omni = is_omni(self.config)
        if self.is_omni:
            self.audio_support = AudioSupport.from_folder(self.model_path, self.config, self.tokenizer)
        if self.is_vision:
            from relax_gym.vision import VisionTokens, load_image_processor

            self.image_processor = load_image_processor(self.model_path)
            self.vision_tokens = VisionTokens.from_config(
                self.config, getattr(self.image_processor, "merge_size", None)
            )
            if getattr(self.config, "model_type", "") == "qwen3_vl":
                from relax_gym.video import VideoProcessor, VideoSampling, VideoSupport

                self.video_support = VideoSupport(VideoProcessor.from_image_processor(self.image_processor),
                                                  VideoSampling(), self.vision_tokens.video_token_id)
        self.eos_token_ids = self._eos_ids()
        self.pad_token_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        self.stats = RunnerStats()
        #: compute identical rows of a prefill batch once (see the module doc); off: every row
        self.dedupe_prefill = dedupe_prefill

    def encode_text(self, text: str) -> list[int]:
        """Token ids of plain text (video timestamps), no special tokens added."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- loading ------------------------------------------------------------------------------
    def _load(self, path: str) -> Any:
        model = _model_class(self.config).from_pretrained(path, dtype=self.dtype)
        return model.to(self.device).eval()

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for src in (self.config, self.text_config, getattr(self.model, "generation_config", None)):
            value = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)

    # -- weights ------------------------------------------------------------------------------
    def parameter_names(self) -> list[str]:
        return list(self.model.state_dict().keys())

    def load_named_tensors(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the live model by state-dict name, all or nothing.

        Every name and shape is checked before anything is copied, so a bad update leaves the
        served weights untouched. Tied weights (``lm_head.weight`` = embeddings) may be sent
        under either name. Returns the number of tensors loaded.
        """
        state = self.model.state_dict()
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        problems: list[str] = []
        for name, tensor in named:
            target = state.get(name)
            if target is None:
                problems.append(f"unknown parameter {name!r}")
            elif tuple(target.shape) != tuple(tensor.shape):
                problems.append(f"{name}: shape {tuple(tensor.shape)} != served {tuple(target.shape)}")
            elif not (tensor.is_floating_point() and target.is_floating_point()) and tensor.dtype != target.dtype:
                problems.append(f"{name}: dtype {tensor.dtype} cannot load into {target.dtype}")
            else:
                staged.append((target, tensor))
        if problems:
            more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
            raise WeightUpdateError("; ".join(problems[:5]) + more)
        with torch.no_grad():
            for target, tensor in staged:
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        return len(staged)

    def load_from_disk(self, path: str | Path) -> int:
        """Load every weight of a HF folder saved for the same architecture.

        The folder goes through ``from_pretrained`` (so checkpoint key renames, dtype casts and
        tied weights are handled like at start-up), then is copied into the live model.
        """
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise WeightUpdateError(f"{folder}: not a model folder (no config.json)")
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(folder))
        except (OSError, ValueError, json.JSONDecodeError) as exc:
            raise WeightUpdateError(f"{folder}: unreadable config: {exc}") from None
        if type(config) is not type(self.config):
            raise WeightUpdateError(
                f"{folder}: architecture {type(config).__name__} != served {type(self.config).__name__}"
            )
        try:
            fresh = _model_class(config).from_pretrained(str(folder), dtype=self.dtype)
        except Exception as exc:
            raise WeightUpdateError(f"{folder}: cannot load weights: {type(exc).__name__}: {exc}") from None
        return self.load_named_tensors(fresh.state_dict().items())

    # -- positions ----------------------------------------------------------------------------
    def _positions(self, seq: SeqInput) -> tuple[torch.Tensor, int]:
        """Positions of a sequence's tokens and its M-RoPE delta.

        Text models: ``[n]`` = 0..n-1, delta 0. Qwen-VL: ``[3, n]`` M-RoPE positions, and the
        delta such that the token at text index ``j >= n`` sits at position ``j + delta``.
        """
        n = len(seq.input_ids)
        if not self.is_vision:
            return torch.arange(n), 0
        if seq.image_grid_thw is None and seq.video_grid_thw is None and seq.input_features is None:
            return torch.arange(n).expand(3, n), 0
        ids = torch.tensor([seq.input_ids])
        if self.is_omni:  # the thinker's own rope index (audio spans run on like text)
            from relax_gym.trainer.models.omni import omni_rope_index

            return omni_rope_index(self.model, seq.input_ids, seq.image_grid_thw, seq.video_grid_thw,
                                   seq.feature_attention_mask)
        types = torch.tensor([seq.mm_token_type_ids or [0] * n])
        pos, delta = self.model.model.get_rope_index(ids, types, image_grid_thw=seq.image_grid_thw,
                                                     video_grid_thw=seq.video_grid_thw)
        return pos[:, 0, :], int(delta.reshape(-1)[0].item())

    def _position_ids(self, text_pos: torch.Tensor, rope_pos: torch.Tensor | None) -> torch.Tensor:
        """``[B, L]`` for text models; ``[4, B, L]`` (text row + t/h/w rows) for Qwen-VL."""
        if not self.is_vision:
            return text_pos
        assert rope_pos is not None
        return torch.cat([text_pos[None], rope_pos], dim=0)

    # -- forward passes -----------------------------------------------------------------------
    def _forward(self, **kwargs: Any) -> torch.Tensor:
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model(**kwargs, use_cache=True)
        self.stats.forward_s += time.perf_counter() - start
        return out.logits

    def prefill(self, seqs: list[SeqInput]) -> PrefillOutput:
        """Run the prompts of ``seqs`` as one left-padded batch, one row each in the result.

        With ``dedupe_prefill``, identical text-only rows (see :func:`dedupe_key`) are computed
        once and copied. Rows with a cached prefix must all be one sequence (they are prefilled
        on top of that prefix alone).
        """
        rows = self._distinct_rows(seqs) if self.dedupe_prefill and len(seqs) > 1 else list(range(len(seqs)))
        reps = sorted(set(rows))
        if len(reps) == len(seqs):
            return self._prefill_rows(seqs)
        distinct = []
        for r in reps:  # a shared row keeps its prompt logits when any of its sharers asks for them
            want = any(seqs[i].want_prompt_logits for i in range(len(seqs)) if rows[i] == r)
            distinct.append(dataclasses.replace(seqs[r], want_prompt_logits=want))
        out = self._prefill_rows(distinct)
        self.stats.prefill_tokens_saved += sum(len(s.input_ids) - s.past_len for s in seqs) - sum(
            len(s.input_ids) - s.past_len for s in distinct)
        at = {r: j for j, r in enumerate(reps)}
        return out.expand([at[r] for r in rows], [s.want_prompt_logits for s in seqs])

    @staticmethod
    def _distinct_rows(seqs: list[SeqInput]) -> list[int]:
        """For each row, the first row identical to it (itself when it is the first or unshared)."""
        first: dict[Hashable, int] = {}
        rows = []
        for i, s in enumerate(seqs):
            key = dedupe_key(s)
            rows.append(i if key is None else first.setdefault(key, i))
        return rows

    def _prefill_rows(self, seqs: list[SeqInput]) -> PrefillOutput:
        if any(s.past is not None for s in seqs):
            if len(seqs) != 1:
                raise ValueError("sequences with a cached prefix are prefilled one at a time")
            return self._prefill_with_past(seqs[0])
        positions = [self._positions(s) for s in seqs]
        length = max(len(s.input_ids) for s in seqs)
        batch = len(seqs)
        ids = torch.full((batch, length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, length), dtype=torch.long)
        text_pos = torch.zeros((batch, length), dtype=torch.long)
        rope_pos = torch.zeros((3, batch, length), dtype=torch.long) if self.is_vision else None
        for i, (s, (pos, _)) in enumerate(zip(seqs, positions, strict=True)):
            n = len(s.input_ids)
            ids[i, length - n :] = torch.tensor(s.input_ids)
            mask[i, length - n :] = 1
            text_pos[i, length - n :] = torch.arange(n)
            if rope_pos is not None:
                rope_pos[:, i, length - n :] = pos
        kwargs: dict[str, Any] = {
            "input_ids": ids.to(self.device),
            "attention_mask": mask.to(self.device),
            "position_ids": self._position_ids(text_pos, rope_pos).to(self.device),
            "cache": DynamicCache(),
        }
        pixels = [s.pixel_values for s in seqs if s.pixel_values is not None]
        grids = [s.image_grid_thw for s in seqs if s.image_grid_thw is not None]
        if pixels:
            kwargs["pixel_values"] = torch.cat(pixels, dim=0).to(self.device, self.dtype)
            kwargs["image_grid_thw"] = torch.cat(grids, dim=0).to(self.device)
        videos = [s.pixel_values_videos for s in seqs if s.pixel_values_videos is not None]
        if videos:
            kwargs["pixel_values_videos"] = torch.cat(videos, dim=0).to(self.device, self.dtype)
            kwargs["video_grid_thw"] = torch.cat([s.video_grid_thw for s in seqs if s.video_grid_thw is not None]).to(
                self.device)
        audio = [(s.input_features, s.feature_attention_mask) for s in seqs if s.input_features is not None]
        if audio:
            from relax_gym.audio import cat_features

            kwargs.update({k: v.to(self.device) for k, v in cat_features(audio).items()})
            kwargs["input_features"] = kwargs["input_features"].to(self.dtype)
        want_full = any(s.want_prompt_logits for s in seqs)
        if not want_full:
            kwargs["logits_to_keep"] = 1
        logits = self._forward(**kwargs)
        self.stats.prefill_tokens += int(mask.sum().item())
        self.stats.prefill_rows += batch
        prompt_logits: list[torch.Tensor | None] = []
        for i, s in enumerate(seqs):
            n = len(s.input_ids)
            prompt_logits.append(logits[i, length - n :].float() if s.want_prompt_logits else None)
        return PrefillOutput(
            last_logits=logits[:, -1].float(),
            prompt_logits=prompt_logits,
            next_positions=[len(s.input_ids) for s in seqs],
            rope_deltas=[d for _, d in positions],
            kv=BatchKV(kwargs["cache"], mask),
        )

    def _prefill_with_past(self, seq: SeqInput) -> PrefillOutput:
        """Prefill only the uncached suffix of one sequence on top of its cached prefix KV."""
        assert seq.past is not None
        pos, delta = self._positions(seq)
        n, start = len(seq.input_ids), seq.past_len
        suffix = torch.tensor([seq.input_ids[start:]])
        cache = DynamicCache(ddp_cache_data=seq.past)
        mask = torch.ones((1, n), dtype=torch.long)
        text_pos = torch.arange(start, n)[None]
        rope_pos = pos[:, start:][:, None, :] if self.is_vision else None
        kwargs: dict[str, Any] = {
            "input_ids": suffix.to(self.device),
            "attention_mask": mask.to(self.device),
            "position_ids": self._position_ids(text_pos, rope_pos).to(self.device),
            "cache": cache,
        }
        if not seq.want_prompt_logits:
            kwargs["logits_to_keep"] = 1
        logits = self._forward(**kwargs)
        self.stats.prefill_tokens += n - start
        self.stats.prefill_rows += 1
        return PrefillOutput(
            last_logits=logits[:, -1].float(),
            prompt_logits=[logits[0].float() if seq.want_prompt_logits else None],
            next_positions=[n],
            rope_deltas=[delta],
            kv=BatchKV(cache, mask),
        )

    def decode(self, kv: BatchKV, tokens: list[int], positions: list[int], rope_deltas: list[int]) -> torch.Tensor:
        """One decode step: feed one token per row, return next-token logits ``[B, V]``."""
        text_pos = torch.tensor(positions, dtype=torch.long)[:, None]
        rope_pos = None
        if self.is_vision:
            rope_pos = (text_pos + torch.tensor(rope_deltas, dtype=torch.long)[:, None])[None].expand(3, -1, -1)
        logits = self._forward(
            input_ids=torch.tensor(tokens, dtype=torch.long)[:, None].to(self.device),
            attention_mask=kv.step_mask().to(self.device),
            position_ids=self._position_ids(text_pos, rope_pos).to(self.device),
            cache=kv.cache,
        )
        kv.commit_step()
        self.stats.decode_steps += 1
        self.stats.decode_tokens += len(tokens)
        return logits[:, -1].float()


__all__ = ["ModelRunner", "PrefillOutput", "RunnerStats", "SeqInput", "WeightUpdateError", "dedupe_key"]
