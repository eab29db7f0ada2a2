"""The training config: one typed pydantic model, loaded from YAML with dotted overrides.

``relax-gym train CONFIG key.sub=value ...`` reads the YAML file, applies each override (the
value is parsed as YAML, so ``train.lr=3e-4``, ``eval.every=5``, ``data.envs=[...]`` all work)
and validates the result before any work starts. Every section forbids unknown keys, so a typo
fails at once with the dotted path of the bad field, the allowed values and a "did you mean"
suggestion (:class:`ConfigError`).

Sections (each documented field by field below):

* ``model`` -- which model to train (an HF folder, or a tiny model built from config);
* ``engine`` -- the inference engines (embedded CPU engines started by the trainer, or URLs) and
  how weights reach them (``engine.sync``, every mode);
* ``data`` -- where prompts come from (env ids with weights, or a suite) and the training seeds;
* ``rollout`` -- the rollout settings (:class:`~relax_gym.trainer.rollout.config.RolloutConfig`, the
  model the rollout manager runs with): group size, concurrency, sampling, turn and token limits;
* ``rewards`` -- reward composition on top of the env's reward (``relax_gym.rewards``);
* ``algorithm`` -- losses and advantages (:class:`~relax_gym.trainer.algorithms.AlgorithmConfig`);
* ``train`` -- the optimiser and the step structure (mini-batches, micro-batches, dynamic sampling);
* ``warmup`` -- the supervised warm-start from oracle trajectories (also ``relax-gym sft``);
* ``eval`` -- held-out evaluation every K steps;
* ``checkpoint`` / ``logging`` -- saving, resuming and observability;
* ``async_rl`` -- the fully_async and hybrid modes (:class:`~relax_gym.trainer.modes.async_config.AsyncConfig`):
  staleness bound, queue, overlapped weight updates, embedded or Ray runtime.

``mode`` picks how rollout and training share the machine (``relax-gym train`` dispatches on it):

* ``colocate`` -- generate, then train, then sync the weights: strictly on-policy
  (:mod:`relax_gym.trainer.modes.colocate`);
* ``fully_async`` -- rollout runs on its own engines and never waits for training except where
  ``async_rl.max_staleness`` requires it; reference and proximal logprobs run as separate workers
  (:mod:`relax_gym.trainer.modes`);
* ``hybrid`` -- the same overlap and queue, but the trainer computes reference and proximal
  logprobs itself (one process fewer on a small machine).
"""

from __future__ import annotations

import codecs
import difflib
import inspect
import json
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from relax_gym.errors import RegistrationError, RelaxGymError
from relax_gym.trainer.backends.lora import LoraSettings  # torch-free until adapters are applied
from relax_gym.trainer.algorithms.config import AlgorithmConfig  # torch-free; algorithms.py imports torch
from relax_gym.trainer.rollout.config import RolloutConfig  # torch-free, like the algorithm section

# settings.py is plain pydantic (no training-config, torch or ray import), so embedding it here
# keeps `import relax_gym.trainer.config` as light as before
from relax_gym.trainer.modes.async_config import AsyncConfig

#: Training seeds are drawn below this bound; evaluation seeds start at or above it, so held-out
#: episodes are never trained on (checked by :class:`TrainConfig`).
EVAL_SEED_FLOOR = 1_000_000_000


class ConfigError(RelaxGymError, ValueError):
    """A config file or override is invalid; the message names every bad field."""


class _Section(BaseModel):
    # allow_inf_nan=False: `lr: .inf`, `lr=nan` or `1e999` would validate against `gt=0` and
    # poison the run (NaN weights, a schedule that never ends) instead of failing here
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


# ------------------------------------------------------------------------------------------------
# model and engines
# ------------------------------------------------------------------------------------------------
class TinyModelSpec(_Section):
    """A tiny random model built from a config with ``relax_gym.trainer.models.build_tiny_model``."""

    kind: Literal["qwen3", "qwen3_vl", "qwen3_omni", "llama", "qwen2"] = Field(
        "qwen3_vl", description="architecture to build (qwen3_omni: the Qwen3-Omni thinker, audio + image + text)")
    seed: int = Field(0, ge=0, description="weight initialisation seed")
    tokenizer: Literal["qwen3", "tiny-bpe"] = Field("qwen3", description="the real Qwen3 tokenizer or a tiny BPE")
    text: dict[str, Any] = Field(default_factory=dict, description="text-config overrides (hidden_size, ...)")
    vision: dict[str, Any] = Field(default_factory=dict, description="Qwen3-VL vision-config overrides")
    audio: dict[str, Any] = Field(default_factory=dict, description="Qwen3-Omni audio-encoder overrides")
    image_min_pixels: int = Field(32 * 32, ge=1, description="image processor's minimum pixels")
    image_max_pixels: int = Field(256 * 256, ge=1, description="image processor's maximum pixels (resize bound)")


class VideoConfig(_Section):
    """Frame sampling for video observations (``relax_gym.video.VideoSampling``); the defaults
    fit a CPU. Every stage sees the sampled frames: the engine, the trainer, the logs."""

    fps: float = Field(2.0, gt=0, description="most frames kept per second of source video")
    max_frames: int = Field(8, ge=1, le=512, description="most frames kept per clip (evenly spread)")
    min_pixels: int = Field(32 * 32, ge=1, description="least pixels per frame after resizing")
    max_pixels: int = Field(64 * 64, ge=1, description="most pixels per frame after resizing (sides multiples "
                            "of 32 for Qwen3-VL)")
    max_source_frames: int = Field(2048, ge=1, description="a clip with more frames is refused (counted), not sampled")
    max_source_seconds: float = Field(300.0, gt=0, description="a longer clip is refused (counted), not sampled")

    def sampling(self) -> Any:
        from relax_gym.video import VideoSampling

        return VideoSampling(**self.model_dump())


class AudioConfig(_Section):
    """The budget for audio observations (``relax_gym.audio.AudioSampling``): a longer clip is
    replaced by an error text the model reads; more clips in one prompt end the episode. Both
    are counted by reason."""

    max_seconds: float = Field(30.0, gt=0, description="a longer clip is refused (counted as 'duration')")
    max_clips: int = Field(8, ge=1, description="more clips in one prompt are refused (counted as 'clips')")

    def sampling(self) -> Any:
        from relax_gym.audio import AudioSampling

        return AudioSampling(**self.model_dump())


class ModelConfig(_Section):
    path: str | None = Field(None, description="HF model folder to start from (config, weights, tokenizer)")
    build: TinyModelSpec | None = Field(None, description="build a tiny model instead of loading `path`")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="float32, or bfloat16 autocast (fp32 master weights and optimizer state)"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward to save memory")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters (torch backend); the engine gets merged weights")
    template_kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"enable_thinking": False},
        description="extra chat-template variables (Qwen3: enable_thinking)",
    )
    video: VideoConfig = Field(default_factory=lambda: VideoConfig(),
                               description="how video observations are sampled for the model (Qwen3-VL)")
    audio: AudioConfig = Field(default_factory=lambda: AudioConfig(),
                               description="the budget for audio observations (the Qwen3-Omni thinker)")

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.build is None):
            raise ValueError("give exactly one of model.path (an HF folder) or model.build (a tiny model spec)")
        return self


class DistributedSyncConfig(_Section):
    """The process group of ``engine.sync: distributed`` (the trainer is its rank 0)."""

    backend: Literal["gloo", "nccl"] = Field(
        "gloo", description="process-group backend: nccl for SGLang on GPUs; the embedded engine receives over gloo")
    master_address: str = Field("127.0.0.1", description="the trainer's address the engines join the group at")
    master_port: int | None = Field(None, ge=1, le=65535, description="group port (None: a free port)")
    ranks_per_engine: int | None = Field(
        None, ge=1, description="ranks each engine joins with (SGLang: rank_offset + tp_rank, so its TP size); "
        "None: read each engine's tp_size from /server_info (the embedded engine: 1)")
    timeout_s: float = Field(120.0, gt=0, description="bound on the rendezvous and on each bucket's broadcast")


class SGLangLaunchConfig(_Section):
    """How ``engine.kind: sglang`` starts SGLang servers (``python -m sglang.launch_server``)."""

    tp: int = Field(1, ge=1, description="tensor-parallel size of each server (--tp-size)")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="--mem-fraction-static")
    extra_args: list[str] = Field(default_factory=list, description="more launch_server flags, checked by "
                                  "SGLang's own parser before the run starts")
    python: str | None = Field(None, description="the python that has sglang (default: this one)")
    health_timeout_s: float = Field(900.0, gt=0, description="wait this long for each server's /health")


class EngineConfig(_Section):
    kind: Literal["embedded", "external", "sglang"] = Field(
        "embedded",
        description="embedded: the trainer starts CPU engines (relax-gym engine serve) on 127.0.0.1; "
        "sglang: the trainer starts SGLang servers on this host's GPUs (engine.sglang) and stops them at the end; "
        "external: use already running SGLang-protocol servers listed in `urls`",
    )
    sglang: SGLangLaunchConfig = Field(default_factory=SGLangLaunchConfig)
    num_engines: int = Field(1, ge=1, description="embedded engines to start")
    urls: list[str] = Field(default_factory=list, description="external engine base URLs")
    api_key: str | None = Field(None, description="bearer token for the engines' control routes")
    threads: int | None = Field(None, ge=1, description="torch threads per embedded engine (in its own process)")
    placement: Literal["auto", "process", "in_process"] = Field(
        "auto",
        description="where embedded engines run: process = a child process behind HTTP on 127.0.0.1; in_process = "
        "the engine's scheduler thread inside the trainer, its routes called without a socket (colocate only; "
        "engine.threads does not apply, the trainer's threads do); auto = in_process for one embedded engine in "
        "colocate mode, process otherwise (docs/engine.md)",
    )
    max_batch_size: int = Field(64, ge=1, description="embedded engine: requests decoded together")
    startup_timeout_s: float = Field(180.0, gt=0, description="wait this long for an engine's /health")
    sync: Literal["auto", "tensor", "disk", "distributed"] = Field(
        "auto",
        description="weight sync transport, in every mode: tensor = in-memory /update_weights_from_tensor "
        "(engines on this host); disk = HF folder + /update_weights_from_disk (any engine that reads the "
        "folder); distributed = /init_weights_update_group + a bucketed broadcast (engine.distributed; "
        "SGLang on GPUs with nccl); auto = tensor for embedded engines, disk otherwise",
    )
    sync_bucket_mb: int = Field(256, ge=1, description="size of one weight bucket (tensor and distributed)")
    sync_shared_memory: bool = Field(
        True, description="tensor sync: hand engines on this host each bucket as a /dev/shm safetensors file "
        "(its path in the request) instead of base64 in the body; engines elsewhere always get the body")
    distributed: DistributedSyncConfig = Field(default_factory=DistributedSyncConfig)

    @model_validator(mode="after")
    def _urls(self) -> EngineConfig:
        if self.kind == "external" and not self.urls:
            raise ValueError("engine.kind 'external' needs engine.urls (e.g. ['http://127.0.0.1:30000'])")
        if self.sync == "tensor" and self.kind == "sglang":  # external URLs are checked when reached
            raise ValueError(
                f"engine.sync 'tensor' needs embedded engines (got engine.kind {self.kind!r}): SGLang's "
                "/update_weights_from_tensor takes its own serialized tensors (CUDA IPC handles, one item per TP "
                "rank) that only a process on the same GPUs can produce; use sync 'distributed' (nccl) or 'disk'")
        for url in self.urls:
            if not re.match(r"^https?://", url):
                raise ValueError(f"engine.urls entry {url!r} must start with http:// or https://")
        return self


# ------------------------------------------------------------------------------------------------
# data, rollout, rewards
# ------------------------------------------------------------------------------------------------
class EnvEntry(_Section):
    id: str = Field(description="registered env id, e.g. relax/ShapeCount-v0")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to relax_gym.make (difficulty...)")
    weight: float = Field(1.0, gt=0, description="relative sampling weight among the envs")
    entry_point: str | None = Field(
        None,
        description="register `id` first from 'package.module:Class' or 'path/to/file.py:Class' (your own "
        "env, no plugin needed); ignored when the id is already registered",
    )

    @field_validator("entry_point")
    @classmethod
    def _entry_point_form(cls, value: str | None) -> str | None:
        if value is not None and (":" not in value or not value.split(":", 1)[1]):
            raise ValueError(f"entry_point {value!r} must look like 'package.module:Class' or 'file.py:Class'")
        return value


class DataConfig(_Section):
    envs: list[EnvEntry] = Field(default_factory=list, description="envs to sample training episodes from")
    suite: str | None = Field(None, description="or: a registered suite whose envs to train on")
    seed_start: int = Field(0, ge=0, description="training seeds are seed_start, seed_start+1, ... (shuffled)")
    seed_count: int = Field(10_000_000, ge=1, description="size of the training seed pool")
    seed_order: Literal["auto", "random", "sequential"] = Field(
        "auto", description="how training seeds are drawn per env: random (uniform, with replacement), "
        "sequential (seed_start, seed_start+1, ...: a dataset env then walks its rows in shuffled epochs, "
        "no row repeats within an epoch), or auto (sequential for dataset envs, random otherwise)")

    @model_validator(mode="after")
    def _source(self) -> DataConfig:
        if not self.envs and self.suite is None:
            raise ValueError("give data.envs (a list of {id, kwargs, weight}) or data.suite")
        if self.seed_start + self.seed_count > EVAL_SEED_FLOOR:
            raise ValueError(
                f"training seeds must stay below {EVAL_SEED_FLOOR} (held-out evaluation seeds start there); "
                f"seed_start + seed_count = {self.seed_start + self.seed_count}"
            )
        return self


class RewardsConfig(_Section):
    entries: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "env"}],
        description="reward components (relax_gym.rewards entries: name, weight, kwargs, on_failure); "
        "the default is the env's own reward",
    )
    per_env: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description="env id -> entries used instead of `entries` for that env"
    )
    timeout_s: float = Field(60.0, gt=0, description="per reward call")
    failed: Literal["drop", "zero"] = Field(
        "drop", description="a sample whose reward failed: drop its group from the batch, or score it 0"
    )

    @field_validator("entries", "per_env")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        from relax_gym.rewards import get_reward, parse_entries

        for entries in value.values() if isinstance(value, dict) else [value]:
            for entry in parse_entries(entries):
                try:
                    get_reward(entry.name)
                except KeyError as exc:
                    raise ValueError(str(exc.args[0]) if exc.args else str(exc)) from None
        return value


# ------------------------------------------------------------------------------------------------
# optimisation
# ------------------------------------------------------------------------------------------------
class DynamicSampling(_Section):
    enabled: bool = Field(False, description="drop groups whose rewards are all equal (DAPO) and sample more")
    max_rounds: int = Field(4, ge=1, description="rollout rounds per step at most; then train on what there is")


class OptimConfig(_Section):
    steps: int = Field(100, ge=0, description="RL training steps (each: rollout, update(s), weight sync)")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    lr_warmup_steps: int = Field(0, ge=0, description="linear warm-up of the learning rate, in optimizer updates")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="after the warm-up")
    grad_clip: float | None = Field(1.0, gt=0, description="global gradient-norm clip; null = off")
    mini_batches: int = Field(1, ge=1, description="optimizer updates per step (the batch is split in this many)")
    epochs: int = Field(1, ge=1, description="passes over the step's batch")
    micro_batch_size: int = Field(16, ge=1, description="sequences per forward/backward (gradient accumulation)")
    share_prompts: bool = Field(True, description="torch backend, text models: forward each distinct prompt of a "
                                "micro-batch once and the rows' responses on its KV cache (same loss and gradient)")
    dynamic_sampling: DynamicSampling = Field(default_factory=DynamicSampling)

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per RL step; more than one needs the proximal policy's logprobs."""
        return self.mini_batches * self.epochs

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):
            raise ValueError(f"each of train.betas must be in [0, 1) (AdamW's moment decay), got {list(value)}")
        return value


class WarmupConfig(_Section):
    """Supervised warm-start on oracle trajectories of the training envs (``relax-gym sft`` too)."""

    enabled: bool = Field(False, description="run SFT before RL")
    steps: int = Field(100, ge=1, description="optimizer steps at most")
    batch_size: int = Field(32, ge=1, description="oracle episodes per step")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate for SFT")
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    micro_batch_size: int = Field(32, ge=1)
    seed_start: int = Field(500_000_000, ge=0, description="oracle episodes use seeds from here (disjoint from RL)")
    eval_every: int = Field(0, ge=0, description="evaluate every this many SFT steps (0: only at the end)")
    stop_at_success: float | None = Field(
        None, gt=0, le=1,
        description="stop as soon as held-out success reaches this (leaves RL work to do); null = run all steps",
    )
    stop_at_loss: float | None = Field(None, gt=0, description="stop when the SFT loss (EMA) falls below this")
    save_to: str | None = Field(None, description="also export the warmed-up model as an HF folder here")


class TeacherConfig(_Section):
    """On-policy distillation: a teacher engine scores the student's samples (``max_new_tokens=0``)."""

    url: str | None = Field(None, description="SGLang-protocol server of the teacher model")
    api_key: str | None = None
    timeout_s: float = Field(300.0, gt=0)


class EvalConfig(_Section):
    every: int = Field(10, ge=0, description="evaluate every this many RL steps (0 = only start and end)")
    episodes: int = Field(64, ge=1, description="held-out episodes per env")
    envs: list[EnvEntry] | None = Field(None, description="default: the training envs")
    suite: str | None = Field(None, description="or: a registered suite")
    seed_start: int = Field(EVAL_SEED_FLOOR, ge=EVAL_SEED_FLOOR, description="held-out seeds start here")
    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    max_new_tokens: int | None = Field(None, ge=1, description="default: rollout.max_new_tokens")
    at_start: bool = Field(True, description="evaluate before the first step")


class CheckpointConfig(_Section):
    every: int = Field(0, ge=0, description="save every this many steps (0 = only at the end)")
    keep_last: int = Field(2, ge=1, description="keep this many recent checkpoints")
    save_optimizer: bool = Field(True, description="needed for an exact resume")
    export_hf: bool = Field(True, description="also write the final model as an HF folder (out/final_model)")


class WandbConfig(_Section):
    enabled: bool = False
    project: str = "relax-gym"
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] = "offline"


class LoggingConfig(_Section):
    progress: Literal["rich", "tqdm", "plain", "none"] = Field("tqdm", description="progress display")
    tensorboard: bool = Field(True, description="write TensorBoard event files under out/tensorboard")
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    dump_samples: int = Field(4, ge=0, description="rollout samples written per step to out/samples/")
    dump_every: int = Field(1, ge=1, description="dump samples every this many steps")
    plot: bool = Field(True, description="draw reward/success curves to out/curves.png at the end")


# ------------------------------------------------------------------------------------------------
# the whole config
# ------------------------------------------------------------------------------------------------
Mode = Literal["colocate", "fully_async", "hybrid"]
#: The modes run by ``relax_gym.trainer.modes`` (rollout and training overlap, tied by a queue).
ASYNC_MODES: tuple[str, ...] = ("fully_async", "hybrid")
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class TrainConfig(_Section):
    """Everything ``relax-gym train`` needs; see the module docstring for the sections."""

    run_name: str = Field("run", description="name of the run (metrics, W&B)")
    output_dir: str = Field("runs/{run_name}", description="where everything goes; {run_name} is substituted")
    seed: int = Field(0, ge=0, description="seeds data order, sampling and initialisation")
    deterministic: bool = Field(
        False, description="deterministic torch kernels and seeded engine sampling (bit-exact resume)"
    )
    mode: Mode = Field(
        "colocate",
        description="colocate: generate, then train, then sync weights (strictly on-policy); "
        "fully_async: rollout overlaps training on separate engines, samples at most async_rl.max_staleness "
        "versions old, reference/proximal logprobs in separate workers; hybrid: the same overlap, the "
        "trainer computes reference/proximal logprobs itself",
    )
    backend: Literal["torch", "megatron"] = Field("torch", description="training backend")
    device: str = Field("cpu", description="torch device of the trainer: cpu or cuda[:N]")
    threads: int | None = Field(None, ge=1, description="torch threads of the trainer process")
    model: ModelConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    data: DataConfig
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: OptimConfig = Field(default_factory=OptimConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    megatron: dict[str, Any] = Field(default_factory=dict, description="megatron backend settings (its own schema)")
    async_rl: AsyncConfig = Field(
        default_factory=AsyncConfig,
        description="fully_async / hybrid settings: staleness, queue, weight updates, runtime (embedded or ray)",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:
        batch = self.rollout.batch_size
        if self.train.mini_batches > self.rollout.prompts_per_step:
            raise ValueError(
                f"train.mini_batches ({self.train.mini_batches}) exceeds rollout.prompts_per_step "
                f"({self.rollout.prompts_per_step}): each mini-batch needs whole groups"
            )
        if self.algorithm.advantage_estimator in ("grpo", "dr_grpo", "rloo") and self.rollout.group_size < 2:
            raise ValueError(
                f"algorithm.advantage_estimator {self.algorithm.advantage_estimator!r} needs "
                f"rollout.group_size >= 2 (got {self.rollout.group_size}); every group of one gets advantage 0"
            )
        if batch < 1:
            raise ValueError("rollout batch is empty")
        if self.rollout.temperature <= 0:
            raise ValueError(
                f"rollout.temperature must be > 0 for training (got {self.rollout.temperature}): the trainer's "
                "logprobs divide by it; greedy decoding is for evaluation (eval.temperature: 0)"
            )
        if self.rollout.sampling_seed is None:  # reproducible sampling: the run's seed unless set
            self.rollout.sampling_seed = self.seed
        if self.algorithm.distill_coef > 0 and not self.teacher.url:
            raise ValueError("algorithm.distill_coef > 0 needs teacher.url (the teacher engine that scores samples)")
        if self.eval.envs is not None and self.eval.suite is not None:
            raise ValueError("give eval.envs or eval.suite, not both")
        if self.backend == "megatron":
            if self.model.lora is not None:
                raise ValueError("model.lora is implemented by the torch backend only (train.backend: torch)")
            self._megatron_checks()
        self._async_checks()
        if self.engine.placement == "in_process" and (self.engine.kind != "embedded" or self.mode != "colocate"
                                                      or self.engine.sync == "distributed"):
            raise ValueError(
                f"engine.placement 'in_process' runs embedded engines in colocate mode with engine.sync auto, tensor or "
                f"disk (got engine.kind {self.engine.kind!r}, mode {self.mode!r}, sync {self.engine.sync!r}): the "
                "asynchronous modes train while the engines generate, and a broadcast group needs its two ends in "
                "two processes (placement: process or auto)")
        return self

    @property
    def engines_in_process(self) -> bool:
        """Whether the run's embedded engines live in the trainer's process (``engine.placement``)."""
        e = self.engine
        if e.kind != "embedded" or self.mode != "colocate" or e.sync == "distributed":
            return False
        return e.placement == "in_process" or (e.placement == "auto" and e.num_engines == 1)

    def _megatron_checks(self) -> None:
        """The ``megatron:`` section against its own schema (torch-free), before anything starts."""
        from pydantic import ValidationError

        from relax_gym.trainer.backends.megatron.config import MegatronConfig

        try:
            MegatronConfig(**self.megatron)
        except ValidationError as exc:
            problems = "; ".join(f"megatron.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ValueError(problems) from None
        from relax_gym.trainer.backends.megatron.config import omni_refusal
        from relax_gym.trainer.modality_check import model_type

        refusal = omni_refusal(model_type(self)[0])
        if refusal is not None:
            raise ValueError(refusal)

    def _async_checks(self) -> None:
        a = self.async_rl
        if a.stale_policy == "correct" and self.algorithm.rollout_correction == "none":
            raise ValueError(
                "async_rl.stale_policy 'correct' trains too-stale samples with an importance correction: "
                "set algorithm.rollout_correction to tis, mis or decoupled (or use stale_policy: drop)"
            )
        if a.queue_capacity is not None and a.queue_capacity < self.rollout.prompts_per_step:
            raise ValueError(
                f"async_rl.queue_capacity ({a.queue_capacity}) must hold one batch "
                f"(rollout.prompts_per_step = {self.rollout.prompts_per_step} groups)"
            )
        if self.mode == "colocate" and a.runtime == "ray":
            raise ValueError(
                "async_rl.runtime 'ray' runs the fully_async and hybrid modes; colocate runs embedded "
                "(set mode: fully_async or hybrid)"
            )
        for name in a.imports:
            if not _MODULE_NAME.fullmatch(name):
                raise ValueError(f"async_rl.imports entry {name!r} is not a module name")

    # -- views --------------------------------------------------------------------------------------
    @property
    def is_async(self) -> bool:
        """True for fully_async and hybrid (run by ``relax_gym.trainer.modes.async_runner``)."""
        return self.mode in ASYNC_MODES

    @property
    def out_dir(self) -> Path:
        return Path(self.output_dir.replace("{run_name}", self.run_name))

    def eval_rollout(self) -> RolloutConfig:
        """The rollout settings of held-out evaluation: ``rollout`` with one sample per episode,
        ``eval.temperature`` and ``eval.max_new_tokens``, and no nucleus cut."""
        return self.rollout.model_copy(update={
            "group_size": 1,
            "max_new_tokens": self.eval.max_new_tokens or self.rollout.max_new_tokens,
            "temperature": self.eval.temperature,
            "top_p": 1.0,
            "top_k": -1,
        })

    def eval_envs(self) -> list[EnvEntry]:
        """The envs evaluated (eval.envs, else the training envs); suites resolve in the loop."""
        return list(self.eval.envs) if self.eval.envs is not None else list(self.data.envs)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ------------------------------------------------------------------------------------------------
# loading, overrides and readable errors
# ------------------------------------------------------------------------------------------------
#: A training config is a few kilobytes. These bound what a broken or hostile file can cost before
#: validation: its size, the values it expands to (YAML aliases can nest copies of copies) and
#: its depth (an alias can even contain itself).
MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 64
#: Integers beyond int64 overflow in torch, NumPy and the engines' JSON.
_INT_LIMIT = 2**63


# libyaml's parser when PyYAML has it: fast, and it stops deep nesting itself (the pure-Python
# scanner takes seconds on a few thousand nested brackets before its RecursionError)
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last one
    silently, so a second ``lr:`` further down would quietly win)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _value in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """(``"line:column"`` or ``""``, what is wrong) of a PyYAML error, without its multi-line layout."""
    if isinstance(exc, yaml.reader.ReaderError):
        return "", _one_line(f"unacceptable character {exc.character!r} at byte {exc.position}: {exc.reason}")
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        text = exc.problem or exc.context or "syntax error"
        if exc.context and exc.problem:
            text = f"{exc.problem} ({exc.context})"
        return where, _one_line(text)
    return "", _one_line(str(exc)) or type(exc).__name__


def _parse_yaml(text: str) -> Any:
    """YAML text to Python values with :class:`_StrictLoader`; raises YAMLError or RecursionError."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def _shown(file: Path) -> str:
    """The file name as given, quoted when it holds characters that would break the line, and
    shortened when it would drown the message."""
    name = str(file)
    name = name if name.isprintable() else repr(name)
    return name if len(name) <= 300 else f"{name[:150]}...{name[-100:]}"


def read_yaml_file(path: str | Path, *, what: str = "config file") -> Any:
    """Read a YAML file for the CLI; every failure is a :class:`ConfigError` of one line naming the
    file (and the line and column of a syntax error): missing, not a regular file, too large,
    binary or not UTF-8, not valid YAML, nested too deeply."""
    file = Path(path)
    shown = _shown(file)
    try:
        if not file.exists():
            raise ConfigError(f"{what} {shown!r} not found")
        if not file.is_file():  # a folder, or a FIFO / device that would block or never end
            raise ConfigError(f"{what} {shown!r} is not a regular file")
        with file.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except (OSError, ValueError) as exc:  # permissions, a name too long, an embedded NUL
        raise ConfigError(f"{shown}: cannot read the {what}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{shown}: too large for a {what} (more than {MAX_CONFIG_BYTES >> 20} MiB)")
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # also the UTF-32 marks
        raise ConfigError(f"{shown}: UTF-16 or UTF-32 text; a {what} is YAML in UTF-8 (save it as UTF-8)")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"{shown}: binary data (a NUL byte at offset {nul}), not a YAML {what}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                          f"a {what} is YAML in UTF-8") from None
    try:
        return _parse_yaml(text)
    except yaml.YAMLError as exc:
        where, problem = _yaml_problem(exc)
        raise ConfigError(f"{shown}:{where + ':' if where else ''} not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{shown}: nested too deeply to be a {what}") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> (["train", "lr"], 0.0003). The value is read as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, _, raw = item.partition("=")
    key = key.strip()
    if not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", key):
        raise ConfigError(f"override {item!r}: {key!r} is not a dotted key such as train.lr")
    try:
        value = _parse_yaml(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        _where, problem = _yaml_problem(exc)
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem})") from None
    except RecursionError:
        raise ConfigError(f"override {item!r}: the value is nested too deeply") from None
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value):
        value = float(value)  # YAML 1.1 reads "3e-4" as a string
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set each dotted key in a nested dict (sections are created as needed)."""
    out = _deep_copy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(path[: i + 1])} is a value ({child!r}), not a section"
                )
            node = child
        node[path[-1]] = value
    return out


def _map_leaves(data: Any, leaf: Callable[[Any], Any]) -> Any:
    """A copy of nested dicts and lists with ``leaf`` applied to every other value."""
    if isinstance(data, dict):
        return {k: _map_leaves(v, leaf) for k, v in data.items()}
    if isinstance(data, list):
        return [_map_leaves(v, leaf) for v in data]
    return leaf(data)


def _deep_copy(data: Any) -> Any:
    return _map_leaves(data, lambda value: value)


def _yaml_float(value: Any) -> Any:
    """YAML 1.1 (PyYAML) reads ``1e-3`` as a string; turn such a string back into a float."""
    if isinstance(value, str) and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", value):
        return float(value)
    return value


def _fix_yaml_floats(data: Any) -> Any:
    return _map_leaves(data, _yaml_float)


def _leaf_problem(value: Any) -> str | None:
    """What is wrong with one config value, if anything (every section, free-form ones included)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number (got {value!r})"
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        return f"is out of range (got an integer of {len(str(abs(value)))} digits; at most 2**63 - 1)"
    if isinstance(value, (bytes, bytearray)):
        return "binary data (!!binary) is not a config value; use a string"
    if isinstance(value, (set, frozenset)):
        return "a set (!!set) is not a config value; use a list"
    return None


def check_values(data: Any, *, source: str | None = None) -> None:
    """Refuse what no field may hold, wherever it is -- non-finite or int64-overflowing numbers,
    binary data, sets -- and structures too large or too deep to be a config (YAML alias bombs,
    self-referencing aliases), before anything copies or walks them recursively."""
    problems: list[tuple[str, str]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    count = 0
    prefix = f"{source}: " if source else ""
    while stack:
        node, path = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise ConfigError(f"{prefix}the config holds more than {MAX_CONFIG_VALUES} values "
                              "(YAML aliases expanding into copies of copies?)")
        if len(path) > MAX_CONFIG_DEPTH:
            start = _one_line(".".join(str(p) for p in path[:4]))[:200]
            raise ConfigError(f"{prefix}{start}...: nested more than {MAX_CONFIG_DEPTH} levels deep "
                              "(a YAML alias that contains itself?)")
        if isinstance(node, Mapping):
            stack.extend((v, (*path, k)) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
        else:
            problem = _leaf_problem(node)
            if problem is not None:
                problems.append((_one_line(".".join(str(p) for p in path) or "(top level)"), problem))
    if problems:
        lines = [f"  {where}: {problem}" for where, problem in sorted(problems)]
        raise ConfigError(f"{_heading(source)}\n" + "\n".join(lines))


def _fields_at(model: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """Field names of the (nested) model at ``path``, for "did you mean" hints."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        for arg in list(candidates):
            candidates.extend(getattr(arg, "__args__", ()))
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _heading(source: str | None) -> str:
    return f"invalid training config {source}:" if source else "invalid training config:"


def format_validation_error(exc: ValidationError, model: type[BaseModel] = TrainConfig, *,
                            source: str | None = None) -> str:
    """One line per problem: the dotted field, what is wrong, the allowed values, a suggestion."""
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"]]
        where = ".".join(str(p) for p in loc) or "(top level)"
        kind = err["type"]
        msg = err["msg"]
        if kind == "extra_forbidden":
            name = str(loc[-1])
            allowed = _fields_at(model, loc[:-1])
            close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            msg = f"unknown field{hint} (allowed: {', '.join(allowed)})" if allowed else "unknown field"
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            msg = f"must be one of {expected}"
        elif kind == "missing":
            msg = "is required"
        elif kind == "finite_number":
            msg = "must be a finite number"
        got = err.get("input")
        show_input = kind not in ("missing", "model_type") and not isinstance(got, (dict, list))
        suffix = f" (got {got!r})" if show_input else ""
        if kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        lines.append(f"  {where}: {msg}{suffix}")
    return f"{_heading(source)}\n" + "\n".join(lines)


def config_from_dict(data: Mapping[str, Any], overrides: Sequence[str] = (), *,
                     source: str | None = None) -> TrainConfig:
    """Validate a config mapping (plus overrides); raises :class:`ConfigError` with every problem.
    ``source`` (the file the mapping came from) is named in the message."""
    check_values(data, source=source)  # bounded before apply_overrides copies it
    merged = _fix_yaml_floats(apply_overrides(dict(data), overrides))
    check_values(merged, source=source)  # the overrides' values, and "1e999" that _fix_yaml_floats made inf
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source=source)) from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML training config, apply ``key.sub=value`` overrides and validate."""
    file = Path(path)
    data = read_yaml_file(file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{_shown(file)}: the top level must be a mapping of sections, got {type(data).__name__}")
    return config_from_dict(data, overrides, source=_shown(file))


# ------------------------------------------------------------------------------------------------
# the envs a config names: built once before any model loads
# ------------------------------------------------------------------------------------------------
def check_envs(config: TrainConfig) -> None:
    """Build every env the run will use once, with its kwargs, before any model loads or engine
    starts: an unknown id, a misspelt kwarg or a bad kwarg value fails here as one
    :class:`ConfigError` naming the config field (with close matches), instead of failing every
    episode of the run. Imports ``async_rl.imports`` (async modes) and registers the entries'
    ``entry_point`` envs first, as the run does. Building an env imports no model code."""
    if config.is_async:
        _import_modules(config.async_rl.imports)
    _register_entry_points(config)
    envs = _env_entries(config)
    tokenizer = config.model.path if config.model.path and Path(config.model.path).is_dir() else None
    built: set[str] = set()
    for where, env_id, kwargs in envs:
        # a dataset env's prompt-length filter takes the run's tokenizer; a model built from
        # config does not exist yet, so the check builds the env without the filter
        if _needs_run_tokenizer(env_id, kwargs):
            kwargs = {**kwargs, "tokenizer": tokenizer} if tokenizer else {**kwargs, "max_prompt_tokens": None}
        key = json.dumps([env_id, kwargs], sort_keys=True, default=repr)
        if key not in built:
            _build_env(where, env_id, kwargs)
            built.add(key)
    _check_per_env_rewards(config, sorted({env_id for _, env_id, _ in envs}))
    from relax_gym.trainer.modality_check import modality_problem

    problem = modality_problem(config, envs)
    if problem:
        raise ConfigError(problem)
    _check_context(config)


def _check_context(config: TrainConfig) -> None:
    """``rollout.max_total_tokens`` must fit the model's context: an engine (SGLang, or the
    embedded one with its rules) refuses a turn whose prompt plus ``max_new_tokens`` passes it,
    so every long episode would end as an engine error hours in. Checked for a model folder;
    for a tiny built model, the context its spec gives (``model.build.text``, else 8192)."""
    from relax_gym.model_context import folder_context
    from relax_gym.trainer.models.tiny import TEXT_DEFAULTS

    build = config.model.build
    if build is not None:
        context: int | None = int(build.text.get("max_position_embeddings", TEXT_DEFAULTS["max_position_embeddings"]))
        name, where = f"model.build (tiny {build.kind})", "model.build.text"
    else:
        context, name, where = folder_context(str(config.model.path)), str(config.model.path), "its config.json"
    budget = config.rollout.max_total_tokens
    if context is not None and budget > context:
        raise ConfigError(
            f"rollout.max_total_tokens is {budget}, but the model {name} serves a context of {context} "
            f"tokens ({where}): every turn past it would be refused by the engine; set "
            f"rollout.max_total_tokens to at most {context}"
        )


def is_dataset_env(env_id: str) -> bool:
    """Whether the registered env is built from dataset rows (its spec or class is tagged
    ``dataset``); an unknown id is not."""
    from relax_gym.registration import spec

    try:
        return "dataset" in spec(env_id).resolved_tags()
    except Exception:  # an unknown id or an entry point that cannot load is reported elsewhere
        return False


def _needs_run_tokenizer(env_id: str, kwargs: Mapping[str, Any]) -> bool:
    """A dataset env asked to filter prompts by token count (``max_prompt_tokens``, from its
    kwargs, its registration or its ``config:`` file) without naming a tokenizer."""
    if "tokenizer" in kwargs or not is_dataset_env(env_id):
        return False
    try:
        import relax_gym
        from relax_gym.envs.dataset import resolve_options

        options = resolve_options({**relax_gym.spec(env_id).kwargs, **kwargs})
    except Exception:  # noqa: BLE001 - bad options are reported when the env is built
        return False
    return options.max_prompt_tokens is not None and options.tokenizer is None


def bind_run_tokenizer(config: TrainConfig, tokenizer: str | Path) -> None:
    """Give every dataset env entry that filters by prompt tokens without a tokenizer of its own
    the run's tokenizer (the model folder), so the filter counts the tokens the policy sees."""
    for entries in (config.data.envs, config.eval.envs or []):
        for entry in entries:
            if _needs_run_tokenizer(entry.id, entry.kwargs):
                entry.kwargs["tokenizer"] = str(tokenizer)


def _import_modules(names: Sequence[str]) -> None:
    import importlib

    for i, name in enumerate(names):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure of user code is a config error here
            raise ConfigError(f"async_rl.imports.{i}: cannot import {name!r}: {_exc_line(exc)}") from None


def load_entry_point(entry_point: str) -> Any:
    """The object ``entry_point`` names: ``package.module:attr`` or ``path/to/file.py:attr``.

    Here, not in the loop's data module, so validating a config and running it load user envs
    by the same rules without the config importing the loop.
    """
    import importlib
    import importlib.util
    from pathlib import Path

    target, _, attr = entry_point.partition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"env entry point file {target!r} not found (relative to {Path.cwd()})")
        name = f"relax_gym_user_env_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        import sys

        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _register_entry_points(config: TrainConfig) -> None:
    """Register the envs that bring an ``entry_point`` (as the loop does), naming the entry on failure."""
    import relax_gym

    sections = [("data.envs", config.data.envs), ("eval.envs", config.eval.envs or [])]
    for section, entries in sections:
        for i, env in enumerate(entries):
            if not env.entry_point or env.id in relax_gym.registry:
                continue
            try:
                relax_gym.register(env.id, entry_point=load_entry_point(env.entry_point))
            except Exception as exc:  # noqa: BLE001 - importing user code may raise anything
                raise ConfigError(f"{section}.{i}.entry_point: cannot load {env.entry_point!r} for env "
                                  f"{env.id!r}: {_exc_line(exc)}") from None


def env_ids(config: TrainConfig) -> list[str]:
    """Every env id the run trains or evaluates on (suites expanded), once each, in order."""
    return list(dict.fromkeys(env_id for _, env_id, _ in _env_entries(config)))


def _env_entries(config: TrainConfig) -> list[tuple[str, str, dict[str, Any]]]:
    """(config field, env id, kwargs) of every env the run trains or evaluates on."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for section, suite, entries in (("data", config.data.suite, config.data.envs),
                                    ("eval", config.eval.suite, config.eval.envs or [])):
        out.extend((f"{section}.envs.{i}", e.id, dict(e.kwargs)) for i, e in enumerate(entries))
        if suite is not None:
            out.extend(_suite_entries(f"{section}.suite", suite))
    return out


def _suite_entries(where: str, name: str) -> list[tuple[str, str, dict[str, Any]]]:
    import relax_gym

    try:
        suite = relax_gym.make_suite(name)
    except Exception as exc:  # noqa: BLE001 - RegistrationError, or a plugin's own error
        raise ConfigError(f"{where}: {_exc_line(exc)}") from None
    return [(f"{where} ({name!r})", env_id, dict(suite.env_kwargs.get(env_id, {}))) for env_id in suite.env_ids]


def _build_env(where: str, env_id: str, kwargs: dict[str, Any]) -> None:
    import relax_gym

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "resolved to ...-v0; pin the version": the run warns too
            spec = relax_gym.spec(env_id)
        factory = spec.load()
    except Exception as exc:  # noqa: BLE001 - a malformed id, an unknown one, a plugin that cannot import
        message = _exc_line(exc).replace(f"no environment registered as {env_id!r}",
                                         f"env {env_id!r} is not registered", 1)
        raise ConfigError(f"{where}.id: {message}") from None
    accepted = _accepted_kwargs(factory)
    if accepted is not None:
        for name in kwargs:
            if name not in accepted:
                close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{where}.kwargs: env {env_id!r} does not accept kwarg {name!r}{hint} "
                                  f"(accepted: {', '.join(accepted) or 'none'})")
    try:
        env = relax_gym.make(spec, **kwargs)
    except RegistrationError as exc:  # "<id>: cannot build with arguments {...}: <why>"
        raise ConfigError(f"{where}: {_exc_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - an env constructor may raise anything
        shown = repr(kwargs)
        shown = shown if len(shown) <= 200 else shown[:200] + "...}"
        raise ConfigError(f"{where}: env {env_id!r} cannot be built with kwargs {shown}: {_exc_line(exc)}") from None
    try:
        env.close()
    except Exception:  # noqa: BLE001, S110 - building it was the check
        pass


def _accepted_kwargs(factory: Any) -> list[str] | None:
    """The keyword arguments an env's class or factory takes; None when it takes ``**kwargs``
    or has no readable signature (then only building it checks them)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds]


def _check_per_env_rewards(config: TrainConfig, env_ids: list[str]) -> None:
    """A ``rewards.per_env`` key that names no env of the run would silently never apply."""
    for key in config.rewards.per_env:
        if key not in env_ids:
            close = difflib.get_close_matches(key, env_ids, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"rewards.per_env: {key!r} is not an env of this run{hint} "
                              f"(its envs: {', '.join(env_ids)})")


def _exc_line(exc: BaseException) -> str:
    """An exception as one line: its message, or its type when the message is empty."""
    text = _one_line(str(exc))
    if not text:
        return type(exc).__name__
    return text if isinstance(exc, RelaxGymError) else f"{type(exc).__name__}: {text}"


__all__ = [
    "ASYNC_MODES",
    "EVAL_SEED_FLOOR",
    "AsyncConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DynamicSampling",
    "EngineConfig",
    "EnvEntry",
    "EvalConfig",
    "LoggingConfig",
    "Mode",
    "ModelConfig",
    "OptimConfig",
    "RewardsConfig",
    "RolloutConfig",
    "SGLangLaunchConfig",
    "TeacherConfig",
    "TinyModelSpec",
    "TrainConfig",
    "WandbConfig",
    "WarmupConfig",
    "apply_overrides",
    "check_envs",
    "env_ids",
    "check_values",
    "config_from_dict",
    "format_validation_error",
    "load_entry_point",
    "load_config",
    "parse_override",
    "read_yaml_file",
]
