"""The megatron-core training backend (``backend: megatron``).

It implements :class:`~relax_gym.trainer.backends.base.TrainerBackend` on megatron-core's own
machinery:

- the model is a ``GPTModel`` (Qwen3) or ``Qwen3VLMegatron`` built by :mod:`.model` / :mod:`.vl`,
  loaded from the HF folder through the bridge;
- it is wrapped in Megatron's ``DistributedDataParallel``; the optimizer comes from
  ``get_megatron_optimizer`` (AdamW, gradient clipping, optional distributed optimizer);
- forward and backward run through ``get_forward_backward_func`` (micro-batches with gradient
  accumulation, and the pipeline schedule when PP > 1).

SPMD: every rank constructs the backend and calls each method with the same batch. Rows are
split over data-parallel ranks; each DP rank packs its rows into micro-batches of
``micro_batch_size`` sequences, each one padding-free row (:mod:`.packing`). Results
(logprobs, metrics, paths) are returned on every rank.

Loss scaling: the objective's normaliser is computed once from the *whole* batch (all
micro-batches of all DP ranks), so each micro-batch loss is already its share of the batch
loss. Megatron must then neither divide by the number of micro-batches nor average over DP:
``calculate_per_token_loss=True`` makes the schedule keep the loss as is and DDP *sum* the
gradients, and ``finalize_model_grads`` is called without a token count.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel, Field
from relax_gym.trainer.algorithms import merge_metrics
from relax_gym.trainer.backends.base import (
    LogprobResult,
    MicroBatch,
    NamedTensors,
    Objective,
    OptimizerSettings,
    SequenceBatch,
    TrainerBackend,
    copy_side_files,
    micro_batches,
)
from relax_gym.trainer.backends.megatron.bridge import iter_hf_buckets, load_hf_weights, save_hf_folder
from relax_gym.trainer.backends.megatron.config import (
    MegatronBridgeError,
    MegatronConfig,
    bucket_bytes,
    check_parallel_layout,
    dims_from_hf_config,
    transformer_config,
)
from relax_gym.trainer.backends.megatron.cpu_debug import on_any_thread
from relax_gym.trainer.backends.megatron.model import build_gpt_model, init_model_parallel
from relax_gym.trainer.backends.megatron.packing import (
    PackedRow,
    layout_micro_batch,
    pack_rows,
    pad_rows,
    token_logprobs,
)
from relax_gym.trainer.backends.megatron.sources import SafetensorsSource
from relax_gym.trainer.backends.megatron.writers import guarded_writers
from relax_gym.trainer.safe_state import one_line, read_json_model
from torch import Tensor

from relax_gym.trainer.backends import BackendSetupError

#: files copied from the source model folder next to exported weights (tokenizer, processor)
SIDE_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "generation_config.json",
)


class MegatronBackendError(BackendSetupError):
    """The Megatron backend cannot load a model or a saved state."""


def ensure_distributed(timeout_s: float = 600.0) -> None:
    """Initialise ``torch.distributed`` if the launcher has not (single process: a world of 1).

    Under torchrun the ``env://`` variables are used. Otherwise a one-rank group binds a free
    port on 127.0.0.1. NCCL on CUDA, gloo on CPU. Every collective of the group times out after
    ``timeout_s`` (a dead rank makes the others raise instead of waiting forever).
    """
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timeout)


def _finalize_grads_without_token_scaling(
    model: list[Any], num_tokens: Tensor | None = None, **kwargs: Any
) -> None:
    """DP all-reduce (sum) and tied-embedding sync; the loss is already globally normalised."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, None, **kwargs)


class MegatronBackend(TrainerBackend):
    """Qwen3 / Qwen3-VL trained with megatron-core; see the module docstring."""

    @on_any_thread  # a second backend (the reference model) may be built in a worker thread
    def __init__(
        self,
        model_path: str | Path,
        *,
        megatron: MegatronConfig | dict[str, Any] | None = None,
        micro_batch_size: int = 16,
        logprob_micro_batch_size: int | None = None,
        optimizer: OptimizerSettings | None = None,
    ) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from transformers import AutoConfig

        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise MegatronBackendError(
                f"{self.model_path}: not an HF model folder (no config.json)"
            )
        try:
            self.cfg = (
                megatron if isinstance(megatron, MegatronConfig) else MegatronConfig(**(megatron or {}))
            )
        except ValueError as exc:
            raise MegatronBackendError(f"megatron config: {one_line(exc)}") from None
        self.micro_batch_size = micro_batch_size
        self.logprob_micro_batch_size = logprob_micro_batch_size or micro_batch_size
        from relax_gym.trainer.backends.megatron import cpu_debug

        try:
            cpu_debug.refuse_on_cuda()
        except RuntimeError as exc:
            raise MegatronBackendError(str(exc)) from None
        if not torch.cuda.is_available():
            if not cpu_debug.enable_from_env():
                raise MegatronBackendError(
                    "megatron-core needs a CUDA GPU; for a CPU test/debug run set "
                    f"{cpu_debug.ENV_FLAG}=1 (slow; not for real training)"
                )
        ensure_distributed(self.cfg.collective_timeout_s)
        try:
            init_model_parallel(self.cfg)
        except MegatronBridgeError as exc:
            raise MegatronBackendError(f"parallel layout: {exc}") from None
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )

        self.hf_config = AutoConfig.from_pretrained(str(self.model_path))
        try:
            self.dims = dims_from_hf_config(self.hf_config)
            check_parallel_layout(self.dims, self.cfg)
        except MegatronBridgeError as exc:
            raise MegatronBackendError(f"{self.model_path}: {exc}") from None
        self.is_vision = self.dims.mrope_section is not None
        source = SafetensorsSource(self.model_path)
        self._vision: dict[str, int] | None = None
        if self.is_vision:
            from relax_gym.trainer.backends.megatron.vl import Qwen3VLMegatron

            if self.cfg.pipeline_parallel_size > 1:
                raise MegatronBackendError(
                    "Qwen3-VL training supports pipeline_parallel_size=1 only"
                )
            module = Qwen3VLMegatron(self.hf_config, self.cfg)
            module.load_hf(source)
            self.gpt = module.language_model
            self._vision = {
                "image_token_id": int(self.hf_config.image_token_id),
                "video_token_id": int(self.hf_config.video_token_id),
                "spatial_merge_size": int(self.hf_config.vision_config.spatial_merge_size),
            }
        else:
            config = transformer_config(self.dims, self.cfg)
            module = build_gpt_model(self.dims, self.cfg, config=config)
            load_hf_weights(module, self.dims, source)
            self.gpt = module
        self.module = module
        config = module.config
        config.calculate_per_token_loss = True  # no /num_microbatches, DDP sums over DP
        config.variable_seq_lengths = True  # packed rows differ in length (PP p2p shapes)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=self.cfg.distributed_optimizer,
        )
        self.ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module)
        config.no_sync_func = self.ddp.no_sync
        config.finalize_model_grads_func = _finalize_grads_without_token_scaling
        self.config = config

        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        self.version = 0
        self.updates = 0
        self.optim_settings = optimizer or OptimizerSettings()
        self.optimizer = self._make_optimizer(self.optim_settings)

    # -- optimizer ------------------------------------------------------------------------------
    def _make_optimizer(self, s: OptimizerSettings) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        dtype = self.cfg.torch_dtype
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=s.lr,
            min_lr=0.0,
            weight_decay=s.weight_decay,
            adam_beta1=s.betas[0],
            adam_beta2=s.betas[1],
            adam_eps=s.eps,
            clip_grad=s.grad_clip or 0.0,
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            params_dtype=dtype,
            use_distributed_optimizer=self.cfg.distributed_optimizer,
        )
        return get_megatron_optimizer(opt_config, [self.ddp])

    # -- micro-batches ---------------------------------------------------------------------------
    def _my_rows(self, batch: SequenceBatch) -> list[int]:
        """This DP rank's rows: longest-first round robin, so ranks get similar token counts."""
        order = sorted(range(len(batch)), key=lambda i: -len(batch.input_ids[i]))
        return sorted(order[self.dp_rank :: self.dp_size])

    def _packed(self, batch: SequenceBatch, rows: list[int], size: int) -> list[PackedRow]:
        """This rank's rows cut into micro-batches and packed; a placeholder if it has none.

        Every DP rank must run at least one micro-batch (the gradient all-reduce is
        collective); a rank without rows packs row 0 with weight 0.
        """
        if not rows:
            packed = pack_rows(
                batch.input_ids, [0], batch.multimodal, vision=self._vision, device=self.device
            )
            packed.weight = 0.0
            return [packed]
        sub = batch.select(rows)
        out = []
        for local in micro_batches(sub, size):
            global_rows = [rows[i] for i in local]
            out.append(
                layout_micro_batch(
                    batch.input_ids,
                    global_rows,
                    batch.multimodal,
                    hidden_size=self.dims.hidden_size,
                    layout=self.cfg.micro_batch_layout,
                    vision=self._vision,
                    device=self.device,
                )
            )
        return out

    def _forward(self, packed: PackedRow, model: Any) -> Tensor:
        if self.is_vision:
            out: Tensor = model(
                packed.input_ids,
                position_ids=packed.position_ids,
                pixel_values=packed.multimodal.get("pixel_values"),
                image_grid_thw=packed.multimodal.get("image_grid_thw"),
                pixel_values_videos=packed.multimodal.get("pixel_values_videos"),
                video_grid_thw=packed.multimodal.get("video_grid_thw"),
                attention_mask=packed.attention_mask,
            )
            return out
        logits: Tensor = model(packed.input_ids, packed.position_ids, packed.attention_mask)
        return logits

    def _run(self, packed: list[PackedRow], loss_fn: Any, *, forward_only: bool) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator: Iterator[PackedRow], model: Any) -> tuple[Tensor, Any]:
            row = next(data_iterator)
            return self._forward(row, model), partial(loss_fn, row)

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(packed),
            model=[self.ddp],
            num_microbatches=len(packed),
            seq_length=max(p.num_tokens for p in packed),
            micro_batch_size=max(p.batch_rows for p in packed),
            forward_only=forward_only,
        )

    def _zero(self) -> Tensor:
        return torch.zeros((), dtype=torch.int, device=self.device)

    # -- the interface ---------------------------------------------------------------------------
    @on_any_thread
    @torch.no_grad()
    def compute_logprobs(self, batch: SequenceBatch, *, entropy: bool = False) -> LogprobResult:
        from megatron.core import parallel_state as ps

        self.ddp.eval()
        rows = self._my_rows(batch)
        found: dict[int, tuple[Tensor, Tensor | None]] = {}

        def collect(row: PackedRow, output: Tensor) -> tuple[Tensor, Tensor, dict[str, Any]]:
            lps, ents = token_logprobs(row, output, entropy=entropy, temperature=batch.temperature)
            if row.weight:
                for j, r in enumerate(row.rows):
                    mask = torch.tensor(
                        batch.loss_mask[r], dtype=lps[j].dtype, device=lps[j].device
                    )
                    found[r] = (
                        (lps[j] * mask).cpu(),
                        (ents[j] * mask).cpu() if ents is not None else None,
                    )
            return output.new_zeros(()), self._zero(), {}

        self._run(
            self._packed(batch, rows, self.logprob_micro_batch_size), collect, forward_only=True
        )
        # Results live on the last pipeline stage of every DP replica: share them.
        if ps.get_pipeline_model_parallel_world_size() > 1:
            holder = [found]
            src = dist.get_global_rank(
                ps.get_pipeline_model_parallel_group(),
                ps.get_pipeline_model_parallel_world_size() - 1,
            )
            dist.broadcast_object_list(
                holder, src=src, group=ps.get_pipeline_model_parallel_group()
            )
            found = holder[0]
        if self.dp_size > 1:
            parts: list[Any] = [None] * self.dp_size
            dist.all_gather_object(parts, found, group=ps.get_data_parallel_group())
            found = {k: v for part in parts for k, v in part.items()}
        missing = [i for i in range(len(batch)) if i not in found]
        if missing:
            raise MegatronBackendError(f"no logprobs came back for rows {missing[:5]}")
        return LogprobResult(
            logprobs=[found[i][0] for i in range(len(batch))],
            entropies=[found[i][1] for i in range(len(batch))] if entropy else None,  # type: ignore[misc]
        )

    @on_any_thread
    def train_step(self, batch: SequenceBatch, objective: Objective) -> dict[str, float]:
        if len(batch) == 0:
            raise ValueError("train_step needs a non-empty batch")
        self.ddp.train()
        normalizer = objective.normalizer(batch)  # global: all micro-batches, all DP ranks
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        lr = self._apply_lr()
        merged: dict[str, Tensor] = {}

        def loss_fn(row: PackedRow, output: Tensor) -> tuple[Tensor, Tensor, dict[str, Any]]:
            nonlocal merged
            lps, ents = token_logprobs(
                row, output, entropy=objective.needs_entropy, temperature=batch.temperature
            )
            mb = MicroBatch.from_batch(batch, row.rows).to(output.device)
            width = mb.loss_mask.shape[1]
            lp = pad_rows(lps, width)
            ent = pad_rows(ents, width) if ents is not None else None
            out = objective.loss(mb, lp, ent, normalizer)
            if row.weight:
                merged = merge_metrics(merged, out.metrics)
            return out.loss * row.weight, self._zero(), {}

        self._run(
            self._packed(batch, self._my_rows(batch), self.micro_batch_size),
            loss_fn,
            forward_only=False,
        )

        found_inf = bool(self.optimizer.prepare_grads())
        grad_norm = float(self.optimizer.get_grad_norm())
        metrics = self._reduce_metrics(merged)
        metrics["grad_norm"] = grad_norm
        if found_inf or not math.isfinite(grad_norm):
            metrics["skipped_update"] = 1.0  # a non-finite gradient never reaches the weights
        else:
            ok, _, _ = self.optimizer.step()
            if not ok:
                metrics["skipped_update"] = 1.0
            else:
                self.updates += 1
                self.version += 1
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        metrics.update(lr=lr, num_tokens=float(normalizer.num_tokens), num_seqs=float(len(batch)))
        return metrics

    def _reduce_metrics(self, merged: dict[str, Tensor]) -> dict[str, float]:
        """Sum (or max/min) the micro-batch metrics over DP ranks; share them over PP."""
        from megatron.core import parallel_state as ps

        parts: list[Any] = [{k: float(v) for k, v in merged.items()}]
        if ps.get_pipeline_model_parallel_world_size() > 1:
            src = dist.get_global_rank(
                ps.get_pipeline_model_parallel_group(),
                ps.get_pipeline_model_parallel_world_size() - 1,
            )
            dist.broadcast_object_list(parts, src=src, group=ps.get_pipeline_model_parallel_group())
        if self.dp_size > 1:
            gathered: list[Any] = [None] * self.dp_size
            dist.all_gather_object(gathered, parts[0], group=ps.get_data_parallel_group())
        else:
            gathered = parts
        acc: dict[str, Tensor] = {}
        for part in gathered:
            acc = merge_metrics(
                acc, {k: torch.tensor(v, dtype=torch.float64) for k, v in part.items()}
            )
        return {k: float(v) for k, v in acc.items()}

    @on_any_thread
    def configure_optimizer(self, settings: OptimizerSettings) -> None:
        super().configure_optimizer(settings)

    @on_any_thread
    def export_weights(self, bucket_bytes: int = 256 << 20) -> Iterator[NamedTensors]:
        """HF-named full tensors in buckets (collective over TP x PP; see bridge.iter_hf_buckets)."""
        yield from iter_hf_buckets(self.gpt, self.dims, bucket_bytes=bucket_bytes)
        if self.is_vision:
            vision = self.module.vision_hf_tensors()
            if vision:
                yield vision

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        for bucket in self.export_weights(bucket_bytes(self.cfg)):
            yield from bucket

    @on_any_thread
    def save_pretrained(self, path: str | Path) -> Path:
        out = Path(path)
        extra = self.module.vision_hf_tensors() if self.is_vision else None
        written = save_hf_folder(
            self.gpt,
            self.dims,
            self.hf_config,
            out,
            bucket_bytes=bucket_bytes(self.cfg),
            extra_tensors=extra,
        )
        if written is not None:
            copy_side_files(self.model_path, out, SIDE_FILES)
        dist.barrier()
        return out

    @on_any_thread
    def save_state(self, path: str | Path) -> None:
        """Megatron distributed checkpoint (model + optimizer) plus ``backend.json``."""
        from megatron.core import dist_checkpointing

        out = Path(path)
        ckpt = out / "megatron"
        if dist.get_rank() == 0:
            if ckpt.exists():
                shutil.rmtree(ckpt)
            ckpt.mkdir(parents=True)
        dist.barrier()
        state = {"model": self.module.sharded_state_dict()}
        state["optimizer"] = self.optimizer.sharded_state_dict(state["model"])
        _in_process_results_queue()
        with _children_allowed(), guarded_writers():
            dist_checkpointing.save(state, str(ckpt))
        if dist.get_rank() == 0:
            meta = {
                "version": self.version,
                "updates": self.updates,
                "megatron": self.cfg.model_dump(),
                "optimizer_settings": {
                    **self.optim_settings.__dict__,
                    "betas": list(self.optim_settings.betas),
                },
            }
            (out / "backend.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        dist.barrier()

    @on_any_thread
    def load_state(self, path: str | Path) -> None:
        """Inverse of :meth:`save_state`, reading nothing as a pickle (``backend.json`` by
        pydantic, the distributed checkpoint by :func:`.safe_checkpoint.safe_load`). Every failure
        is a one-line :class:`MegatronBackendError` naming the file."""
        from relax_gym.trainer.backends.megatron.safe_checkpoint import UnsafeCheckpointError, safe_load

        src = Path(path)
        ckpt = src / "megatron"
        if not (src / "backend.json").is_file() or not ckpt.is_dir():
            raise MegatronBackendError(f"{src}: not a saved Megatron backend state")
        meta = _read_meta(src / "backend.json")
        self.configure_optimizer(meta.optimizer_settings)
        state = {"model": self.module.sharded_state_dict()}
        state["optimizer"] = self.optimizer.sharded_state_dict(state["model"], is_loading=True)
        try:
            loaded = safe_load(state, ckpt)
            self.module.load_state_dict(loaded["model"])
            self.optimizer.load_state_dict(loaded["optimizer"])
        except UnsafeCheckpointError as exc:
            raise MegatronBackendError(one_line(exc)) from None
        except Exception as exc:  # noqa: BLE001 - megatron and DCP raise many types on bad data
            raise MegatronBackendError(f"{ckpt}: cannot load the distributed checkpoint ({one_line(exc)[:300]})") from None
        self.updates = meta.updates
        self.version = meta.version


def _in_process_results_queue() -> None:
    """Give megatron's checkpoint writer an in-process results queue before its first save.
    Left alone, it makes its own with a ``spawn`` ``Manager()``: a server process that outlives
    a rank killed mid-run (SIGKILL runs no clean-up), holds the launcher's stderr open and stays
    behind as an orphan. Our saves are synchronous: the writer processes report to their own
    fork queue, and this process alone puts the merged result in this queue and reads it back
    (``get_nowait`` right after the ``put``, so the put must be synchronous, as a thread
    queue's is and a multiprocessing queue's is not)."""
    import queue

    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:  # another megatron-core layout: its own default then
        return
    if getattr(filesystem_async, "_results_queue", "absent") is None:
        filesystem_async._results_queue = queue.Queue()  # noqa: SLF001


@contextlib.contextmanager
def _children_allowed() -> Iterator[None]:
    """Let a daemonic process (the async modes' learner process) start child processes for the
    duration: megatron's distributed-checkpoint writer forks its writers (and a spawn-mode
    results queue) and joins the writers before ``save`` returns. Python refuses children of a
    daemonic process outright ("daemonic processes are not allowed to have children")."""
    import multiprocessing

    config = multiprocessing.current_process()._config  # noqa: SLF001 - the flag the check reads
    daemon = config.get("daemon")
    if daemon:
        config["daemon"] = False
    try:
        yield
    finally:
        if daemon:
            config["daemon"] = daemon


class _SavedMeta(BaseModel):
    """``backend.json`` of a saved Megatron state."""

    version: int = Field(ge=0)
    updates: int = Field(ge=0)
    optimizer_settings: OptimizerSettings


def _read_meta(file: Path) -> _SavedMeta:
    return read_json_model(file, _SavedMeta, MegatronBackendError)


__all__ = ["MegatronBackend", "MegatronBackendError", "ensure_distributed"]
