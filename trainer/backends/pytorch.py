"""The plain-PyTorch backend: a Hugging Face causal LM or Qwen-VL model, AdamW, CPU or GPU.

Design choices (see ``docs/training.md``):

* **Padding, not packing.** Each micro-batch is right-padded to its own longest sequence, and
  rows are grouped by length before cutting (:func:`~relax_gym.trainer.backends.base.micro_batches`),
  so padding stays small. Packing several sequences into one row needs a block-diagonal
  attention mask (flash-attention's varlen kernels, absent on CPU) and per-sequence M-RoPE
  positions for Qwen-VL; the megatron backend packs, this one keeps the HF forward untouched.
* **Logits only where they are needed.** The base model returns hidden states; the LM head runs
  only on positions that predict a loss-mask token. With a 151k-token vocabulary this is the
  difference between megabytes and gigabytes per micro-batch.
* **Mixed precision.** ``dtype="bfloat16"`` runs the forward under ``torch.autocast`` while the
  parameters and AdamW state stay float32 (master weights); logits are upcast before the softmax.
* **Global normalisers.** ``train_step`` asks the objective for its normaliser over the whole
  batch first, then sums micro-batch losses (no division by the micro-batch count), so the
  gradient does not depend on ``micro_batch_size``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field
from torch import Tensor

from relax_gym.audio import cat_features, is_omni
from relax_gym.errors import RelaxGymError
from relax_gym.trainer.algorithms import merge_metrics
from relax_gym.trainer.backends.base import (
    LogprobResult,
    MicroBatch,
    Objective,
    OptimizerSettings,
    SequenceBatch,
    TrainerBackend,
    copy_side_files,
    micro_batches,
)
from relax_gym.trainer.backends.lora import LoraSettings, apply_lora, merged_weights, save_merged_folder
from relax_gym.trainer.backends.shared_prefix import (
    group_order,
    media_key,
    plan_shared_prefixes,
    prompt_cut,
    shared_prefix_hidden,
)
from relax_gym.trainer.models.architectures import UnsupportedArchitecture, check_servable
from relax_gym.trainer.safe_state import StateFileError, load_tree, one_line, read_json_model, save_tree

#: files copied from the source model folder next to exported weights (tokenizer, processor)
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
    "video_preprocessor_config.json", "processor_config.json", "relax_gym_tiny.json",
)


#: the AdamW state inside a saved backend state (see :meth:`TorchBackend.save_state`)
OPTIMIZER_FILE = "optimizer.safetensors"
_OPTIMIZER_KIND = "torch_optimizer"


class BackendError(RelaxGymError, RuntimeError):
    """The backend cannot load a model or a saved state."""


class _SavedMeta(BaseModel):
    """``backend.json`` of a saved state."""

    version: int = Field(ge=0)
    updates: int = Field(ge=0)
    dtype: str = "float32"
    optimizer_settings: OptimizerSettings


def _read_meta(file: Path) -> _SavedMeta:
    return read_json_model(file, _SavedMeta, BackendError)


def _model_class(config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM


class TorchBackend(TrainerBackend):
    """An HF model trained with AdamW; see the module docstring."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: Literal["float32", "bfloat16"] = "float32",
        micro_batch_size: int = 16,
        logprob_micro_batch_size: int | None = None,
        gradient_checkpointing: bool = False,
        optimizer: OptimizerSettings | None = None,
        lora: LoraSettings | None = None,
        share_prompts: bool = True,
    ) -> None:
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise BackendError(f"{self.model_path}: not an HF model folder (no config.json)")
        self.device = torch.device(device)
        self.dtype = dtype
        self.micro_batch_size = micro_batch_size
        self.logprob_micro_batch_size = logprob_micro_batch_size or micro_batch_size
        self.config = AutoConfig.from_pretrained(str(self.model_path))
        try:
            check_servable(self.config, "the torch backend", for_training=True)
        except UnsupportedArchitecture as exc:
            raise BackendError(str(exc)) from None
        self.model = _model_class(self.config).from_pretrained(str(self.model_path), dtype=torch.float32)
        self.model.to(self.device)
        self.model.config.use_cache = False
        if gradient_checkpointing:
            if hasattr(self.model, "activation_checkpointing_enable"):  # transformers >= 5.2x
                self.model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.is_vision = hasattr(self.config, "vision_config")
        self.is_omni = is_omni(self.config)  # the Qwen3-Omni thinker: no mm_token_type_ids, audio features
        # one forward per distinct prompt of a micro-batch (shared_prefix.py): text and Qwen-VL decoders
        self.share_prompts = share_prompts and not (self.is_omni or gradient_checkpointing)
        self.image_token_id = getattr(self.config, "image_token_id", None)
        self.video_token_id = getattr(self.config, "video_token_id", None)
        text_cfg = self.config.get_text_config(decoder=True)
        pad = getattr(text_cfg, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.config, "pad_token_id", None)
        self.pad_token_id = int(pad) if isinstance(pad, int) else 0
        self.lora = lora
        if lora is not None:  # adapters on the chosen linears; the engine still gets merged HF weights
            self.model = apply_lora(self.model, lora)
        hf_model = self.model.get_base_model() if lora is not None else self.model
        self._base = hf_model.model if hasattr(hf_model, "model") else getattr(hf_model, hf_model.base_model_prefix)
        self._head = hf_model.get_output_embeddings()
        self.version = 0
        self.updates = 0  # optimizer updates in the current phase (drives the schedule)
        self.optim_settings = optimizer or OptimizerSettings()
        self.optimizer = self._make_optimizer(self.optim_settings)

    # -- optimizer ------------------------------------------------------------------------------
    def _make_optimizer(self, s: OptimizerSettings) -> torch.optim.Optimizer:
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.dim() < 2 or "norm" in name.lower() else decay).append(p)
        groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        fused = self.device.type == "cuda"
        return torch.optim.AdamW(groups, lr=s.lr, betas=s.betas, eps=s.eps, foreach=not fused, fused=fused or None)

    # -- forward ---------------------------------------------------------------------------------
    def _autocast(self) -> Any:
        if self.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def _inputs(self, sub: SequenceBatch) -> tuple[dict[str, Tensor], Tensor]:
        """Padded model inputs of a (micro-)batch and the padded ids."""
        width = max(len(ids) for ids in sub.input_ids)
        ids = torch.full((len(sub), width), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(sub), width), dtype=torch.long)
        for i, row in enumerate(sub.input_ids):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attn[i, : len(row)] = 1
        inputs: dict[str, Tensor] = {"input_ids": ids, "attention_mask": attn}
        keys = sorted({k for mm in sub.multimodal for k in mm} - {"input_features", "feature_attention_mask"})
        for key in keys:
            parts = [mm[key] for mm in sub.multimodal if key in mm]
            inputs[key] = torch.cat(parts, dim=0)
        audio = [(mm["input_features"], mm["feature_attention_mask"]) for mm in sub.multimodal if "input_features" in mm]
        if audio:  # omni: clips of different lengths, padded to the longest (relax_gym.audio)
            inputs.update(cat_features(audio))
        if self.is_vision and not self.is_omni:
            types = torch.zeros_like(ids)
            if self.image_token_id is not None:
                types[ids == int(self.image_token_id)] = 1
            if self.video_token_id is not None:
                types[ids == int(self.video_token_id)] = 2
            inputs["mm_token_type_ids"] = types
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        return inputs, ids

    def _token_logprobs(self, sub: SequenceBatch, *, entropy: bool) -> tuple[Tensor, Tensor | None]:
        """``[b, T]`` logprobs (and entropies) of the loss-mask tokens of ``sub``; zeros elsewhere."""
        inputs, ids = self._inputs(sub)
        b, width = ids.shape
        mask = sub.padded_mask(width).to(self.device)
        with self._autocast():
            hidden = self._shared_prompt_hidden(sub, inputs, width) if self.share_prompts else None
            if hidden is None:
                hidden = self._base(**inputs, use_cache=False).last_hidden_state
        predict = mask[:, 1:]  # position t-1 predicts token t
        h = hidden[:, :-1][predict]
        with self._autocast():
            logits = self._head(h)
        logits = logits.float()
        if sub.temperature != 1.0:
            logits = logits / sub.temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        targets = ids[:, 1:].to(self.device)[predict]
        lp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
        zeros = torch.zeros((b, width - 1), dtype=lp.dtype, device=self.device)
        out = torch.cat([torch.zeros((b, 1), dtype=lp.dtype, device=self.device), zeros.masked_scatter(predict, lp)], 1)
        ent = None
        if entropy:
            e = -(logp_all.exp() * logp_all).sum(-1)
            ent = torch.cat([torch.zeros((b, 1), dtype=e.dtype, device=self.device), zeros.masked_scatter(predict, e)], 1)
        return out, ent

    def _micro_batches(self, batch: SequenceBatch, size: int) -> list[list[int]]:
        """Length-sorted micro-batches; with prompt sharing, a prompt's rows stay together."""
        if not self.share_prompts or size >= len(batch):
            return micro_batches(batch, size)
        order = group_order(batch.input_ids, batch.loss_mask)
        return [order[i : i + size] for i in range(0, len(order), size)]

    def _shared_prompt_hidden(self, sub: SequenceBatch, inputs: dict[str, Tensor], width: int) -> Tensor | None:
        """Hidden states from one forward per distinct prompt (shared_prefix.py), or None when
        this micro-batch keeps the padded forward (nothing repeats, or media after a prompt)."""
        media = positions = None
        types = inputs.get("mm_token_type_ids")
        if types is not None:
            cuts = [prompt_cut(r, m) for r, m in zip(sub.input_ids, sub.loss_mask, strict=True)]
            if any(bool(types[i, c:].any()) for i, c in enumerate(cuts)):
                return None
            media = [media_key(mm) for mm in sub.multimodal]
        plan = plan_shared_prefixes(sub.input_ids, sub.loss_mask, media)
        if plan is None:
            return None
        prefix_inputs: dict[str, Tensor] = {}
        if types is not None:  # the prompts' media and M-RoPE positions, as the padded forward computes them
            positions, _ = self._base.get_rope_index(
                inputs["input_ids"], mm_token_type_ids=types, image_grid_thw=inputs.get("image_grid_thw"),
                video_grid_thw=inputs.get("video_grid_thw"), attention_mask=inputs["attention_mask"])
            reps = plan.representatives
            prefix_inputs["mm_token_type_ids"] = types[reps, : max(len(p) for p in plan.prefixes)]
            for key in sorted({k for r in reps for k in sub.multimodal[r]}):
                prefix_inputs[key] = torch.cat([sub.multimodal[r][key] for r in reps if key in sub.multimodal[r]]
                                               ).to(self.device)
        return shared_prefix_hidden(self._base, sub.input_ids, plan, width, self.pad_token_id, self.device,
                                    prefix_inputs=prefix_inputs, positions=positions)

    # -- the interface ---------------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(self, batch: SequenceBatch, *, entropy: bool = False) -> LogprobResult:
        self.model.eval()
        logprobs: list[Tensor | None] = [None] * len(batch)
        entropies: list[Tensor | None] = [None] * len(batch)
        for rows in self._micro_batches(batch, self.logprob_micro_batch_size):
            lp, ent = self._token_logprobs(batch.select(rows), entropy=entropy)
            for j, i in enumerate(rows):
                n = len(batch.input_ids[i])
                logprobs[i] = lp[j, :n].cpu()
                if ent is not None:
                    entropies[i] = ent[j, :n].cpu()
        return LogprobResult(
            logprobs=[t for t in logprobs if t is not None],
            entropies=[t for t in entropies if t is not None] if entropy else None,
        )

    def train_step(self, batch: SequenceBatch, objective: Objective) -> dict[str, float]:
        if len(batch) == 0:
            raise ValueError("train_step needs a non-empty batch")
        self.model.train()
        normalizer = objective.normalizer(batch)  # global: before any micro-batch
        self.optimizer.zero_grad(set_to_none=True)
        lr = self._apply_lr()
        merged: dict[str, Tensor] = {}
        for rows in self._micro_batches(batch, self.micro_batch_size):
            sub = batch.select(rows)
            lp, ent = self._token_logprobs(sub, entropy=objective.needs_entropy)
            mb = MicroBatch.from_batch(batch, rows)
            out = objective.loss(mb.to(self.device), lp, ent, normalizer)
            out.loss.backward()
            merged = merge_metrics(merged, out.metrics)
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.optim_settings.grad_clip
        if clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in params]))
        metrics = {k: float(v) for k, v in merged.items()}
        metrics["grad_norm"] = float(grad_norm)
        if not math.isfinite(metrics["grad_norm"]):
            self.optimizer.zero_grad(set_to_none=True)
            metrics["skipped_update"] = 1.0  # a non-finite gradient never reaches the weights
        else:
            self.optimizer.step()
            self.updates += 1
            self.version += 1
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update(lr=lr, num_tokens=float(normalizer.num_tokens), num_seqs=float(len(batch)))
        return metrics

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        if self.lora is not None:
            with torch.no_grad():
                yield from merged_weights(self.model)
            return
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            ptr = tensor.data_ptr()
            if ptr in seen:  # a tied duplicate (lm_head = embeddings)
                continue
            seen.add(ptr)
            yield name, tensor.detach()

    def save_pretrained(self, path: str | Path) -> Path:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if self.lora is not None:
            save_merged_folder(self.model, out, dict(self.named_weights()), adapter=self.lora.save_adapter)
        else:
            self.model.save_pretrained(str(out))
        copy_side_files(self.model_path, out, SIDE_FILES)
        return out

    def save_state(self, path: str | Path) -> None:
        """Weights (``model.safetensors``), AdamW state (``optimizer.safetensors``, a
        :mod:`~relax_gym.trainer.safe_state` tree) and counters (``backend.json``): no pickles."""
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({n: t.contiguous().cpu() for n, t in self._state_items()}, str(out / "model.safetensors"))
        save_tree({"optimizer": self.optimizer.state_dict(), "updates": self.updates}, out / OPTIMIZER_FILE,
                  kind=_OPTIMIZER_KIND)
        (out / "backend.json").write_text(json.dumps({
            "version": self.version, "updates": self.updates, "dtype": self.dtype,
            "optimizer_settings": {**self.optim_settings.__dict__, "betas": list(self.optim_settings.betas)},
        }, indent=2), encoding="utf-8")

    def load_state(self, path: str | Path) -> None:
        """Inverse of :meth:`save_state`; reads JSON and safetensors only. Every failure is a
        one-line :class:`BackendError` naming the file."""
        src = Path(path)
        if not (src / "model.safetensors").is_file():
            raise BackendError(f"{src}: no model.safetensors (not a saved backend state)")
        meta = _read_meta(src / "backend.json")
        self._load_weights(src / "model.safetensors")
        self.configure_optimizer(meta.optimizer_settings)
        if (src / OPTIMIZER_FILE).is_file():
            try:
                tree = load_tree(src / OPTIMIZER_FILE, kind=_OPTIMIZER_KIND, device=self.device)
            except StateFileError as exc:
                raise BackendError(str(exc)) from None
            self._load_optimizer(tree, src / OPTIMIZER_FILE)
        self.updates = meta.updates
        self.version = meta.version

    def _load_weights(self, file: Path) -> None:
        from safetensors.torch import load_file

        try:
            weights = load_file(str(file))
        except Exception as exc:  # noqa: BLE001 - safetensors raises several types on a bad file
            raise BackendError(f"{file}: not a readable safetensors file ({one_line(exc)})") from None
        try:
            missing, unexpected = self.model.load_state_dict(weights, strict=False)
        except RuntimeError as exc:  # wrong shapes
            raise BackendError(f"{file}: state does not fit the model ({one_line(exc)[:300]})") from None
        tied = {n for n, _ in self.model.state_dict().items()} - set(weights)
        real_missing = [m for m in missing if m not in tied or not self._is_tied(m)]
        if unexpected or real_missing:
            raise BackendError(f"{file}: state does not fit the model (missing {real_missing[:5]}, unexpected {unexpected[:5]})")

    def _load_optimizer(self, tree: Any, file: Path) -> None:
        """Load a saved AdamW state after checking it belongs to this model's parameters."""
        state = tree.get("optimizer") if isinstance(tree, dict) else None
        if not isinstance(state, dict) or not isinstance(state.get("state"), dict) \
                or not isinstance(state.get("param_groups"), list):
            raise BackendError(f"{file}: not an optimizer state")
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        try:
            order = [i for g in state["param_groups"] for i in g["params"]]
        except (KeyError, TypeError):
            raise BackendError(f"{file}: optimizer param_groups without params") from None
        if len(order) != len(params):
            raise BackendError(f"{file}: optimizer state for {len(order)} parameters, the model has {len(params)}")
        by_id = dict(zip(order, params, strict=True))
        for pid, pstate in state["state"].items():
            if pid not in by_id or not isinstance(pstate, dict):
                raise BackendError(f"{file}: optimizer state for unknown parameter {pid!r}")
            for key, value in pstate.items():
                if isinstance(value, Tensor) and value.dim() > 0 and value.shape != by_id[pid].shape:
                    raise BackendError(f"{file}: optimizer {key} of parameter {pid} has shape {tuple(value.shape)}, "
                                       f"the parameter {tuple(by_id[pid].shape)}")
        try:
            self.optimizer.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise BackendError(f"{file}: does not fit the optimizer ({one_line(exc)})") from None

    def _state_items(self) -> Iterator[tuple[str, Tensor]]:
        """The model's own state (adapters unmerged, under peft's names with LoRA), tied once."""
        if self.lora is None:
            yield from self.named_weights()
            return
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                yield name, tensor.detach()

    def _is_tied(self, name: str) -> bool:
        emb = self.model.get_input_embeddings()
        head = self.model.get_output_embeddings()
        return head is not None and emb is not None and head.weight is emb.weight and name.endswith("lm_head.weight")


__all__ = ["OPTIMIZER_FILE", "SIDE_FILES", "BackendError", "TorchBackend"]
