"""What a training run shows and leaves behind: progress, metrics, curves, samples, timings.

* :class:`PhaseTimer` -- the per-step time breakdown (rollout, reward, logprob, train, sync, eval);
* :class:`RunLogger` -- one object the loop calls once per step. It writes every metric to
  ``metrics.jsonl`` (one JSON object per line: ``step``, ``phase``, ``elapsed_s`` and the
  metrics), to TensorBoard event files (``tensorboard/``), to Weights & Biases when it is
  installed and asked for, and drives a progress display (tqdm, rich, plain lines or nothing)
  showing reward, success and step time;
* :func:`dump_samples` -- a few rollouts per step as readable JSONL (``samples/step_XXXXXX.jsonl``:
  prompt and response text, reward components, success, stop reason, token counts);
* :func:`plot_curves` -- reward and success curves as a PNG at the end (matplotlib, Agg backend).

Nothing here may stop training: a failing TensorBoard or W&B writer is reported once and then
left out, and metric values that are not finite numbers are dropped from the writers (counted in
``logging/dropped_values``) rather than crashing a run.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.vision import collapse_image_tokens

PHASES = ("rollout", "reward", "logprob", "train", "sync", "eval", "checkpoint")


class PhaseTimer:
    """Accumulates wall-clock seconds per phase within one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """``time/<phase>`` for each phase seen, plus ``time/step`` (wall time since creation)
        and ``time/other`` (the part no phase covered)."""
        total = time.perf_counter() - self._start
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        out["time/step"] = total
        out["time/other"] = max(0.0, total - sum(self.seconds.values()))
        return out


def _finite(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


class _Progress:
    """tqdm / rich / plain-line progress with the headline numbers."""

    def __init__(self, kind: str, total: int, initial: int, desc: str) -> None:
        self.kind = kind
        self.total = total
        self._bar: Any = None
        self._rich: Any = None
        self._task: Any = None
        if kind == "tqdm":
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                self.kind = "plain"
        elif kind == "rich":
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                self._rich = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
                self._rich.start()
                self._task = self._rich.add_task(desc, total=total, completed=initial, info="")
            except ImportError:
                self.kind = "plain"

    def update(self, step: int, info: dict[str, float]) -> None:
        text = " ".join(f"{k}={v:.3g}" for k, v in info.items())
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.refresh()
        elif self._rich is not None:
            self._rich.update(self._task, completed=step, info=text)
        elif self.kind == "plain":
            print(f"step {step}/{self.total} {text}", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        elif self._rich is not None:
            self._rich.console.print(text)
        elif self.kind != "none":
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._rich is not None:
            self._rich.stop()


@dataclass
class RunLogger:
    """Writes metrics to JSONL, TensorBoard and W&B, and shows progress; see the module doc."""

    out_dir: Path
    progress: str = "tqdm"
    tensorboard: bool = True
    wandb: Mapping[str, Any] | None = None  # {"project", "entity", "mode"} when enabled
    run_name: str = "run"
    config: Mapping[str, Any] = field(default_factory=dict)
    total_steps: int = 0
    initial_step: int = 0
    elapsed_offset_s: float = 0.0  # wall time already spent before a resume

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.out_dir / "metrics.jsonl"
        self._jsonl = self.metrics_path.open("a", encoding="utf-8")
        self._start = time.perf_counter()
        self.dropped = 0
        self._tb: Any = None
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.out_dir / "tensorboard"))
            except Exception as exc:  # noqa: BLE001 -- observability never stops training
                warnings.warn(f"TensorBoard disabled: {type(exc).__name__}: {exc}", stacklevel=2)
        self._wandb: Any = None
        if self.wandb:
            self._wandb = _start_wandb(self.wandb, self.run_name, dict(self.config), self.out_dir)
        self._progress = _Progress(self.progress, self.total_steps, self.initial_step, self.run_name)

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_offset_s + time.perf_counter() - self._start

    def log(self, step: int, metrics: Mapping[str, Any], *, phase: str = "train") -> dict[str, Any]:
        """Record one step's metrics; returns the JSON record written."""
        clean: dict[str, float] = {}
        for key, value in metrics.items():
            number = _finite(value)
            if number is None:
                self.dropped += 1
                continue
            clean[key] = number
        record: dict[str, Any] = {"step": int(step), "phase": phase, "elapsed_s": round(self.elapsed_s, 3), **clean}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            try:
                for key, value in clean.items():
                    self._tb.add_scalar(f"{phase}/{key}", value, step)
                self._tb.flush()
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"TensorBoard disabled after an error: {exc}", stacklevel=2)
                self._tb = None
        if self._wandb is not None:
            try:
                self._wandb.log({f"{phase}/{k}": v for k, v in clean.items()}, step=step)
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"W&B disabled after an error: {exc}", stacklevel=2)
                self._wandb = None
        return record

    def show(self, step: int, info: Mapping[str, float]) -> None:
        """Advance the progress display to ``step`` with the given headline numbers."""
        self._progress.update(step, {k: v for k, v in info.items() if _finite(v) is not None})

    def message(self, text: str) -> None:
        self._progress.message(text)

    def close(self) -> None:
        self._progress.close()
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass


def _start_wandb(settings: Mapping[str, Any], name: str, config: dict[str, Any], out_dir: Path) -> Any:
    """A W&B run, or None (with a warning) when wandb is not installed or cannot start."""
    try:
        import wandb
    except ImportError:
        warnings.warn("logging.wandb.enabled is set but wandb is not installed; skipping W&B", stacklevel=3)
        return None
    try:
        return wandb.init(project=settings.get("project", "relax-gym"), entity=settings.get("entity"),
                          mode=settings.get("mode", "offline"), name=name, config=config, dir=str(out_dir))
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"W&B could not start ({type(exc).__name__}: {exc}); skipping it", stacklevel=3)
        return None


# ------------------------------------------------------------------------------------------------
# reading metrics back, curves
# ------------------------------------------------------------------------------------------------
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a damaged line (e.g. a crash mid-write) is skipped.

    After a resume the file holds the interrupted run's records past the checkpoint as well;
    for each (phase, step) the last record wins.
    """
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    file = Path(path)
    if not file.is_file():
        return []
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            latest[(str(rec.get("phase", "train")), int(rec["step"]))] = rec
    return sorted(latest.values(), key=lambda r: (r.get("elapsed_s", 0.0), r["step"]))


def plot_curves(metrics_path: str | Path, out_png: str | Path, *, title: str = "") -> Path | None:
    """Reward and success curves from ``metrics.jsonl``.

    Left: success against wall-clock minutes -- held-out evaluation (``eval``), the warm-up's
    evaluations (``warmup_eval``) and the training rollouts' success. Right: mean reward of the
    training rollouts against the RL step. Returns the PNG path, or None when there is nothing
    to draw or matplotlib is missing.
    """
    records = read_metrics(metrics_path)
    if not records:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn("matplotlib is not installed; no curves drawn", stacklevel=2)
        return None

    def series(phase: str, key: str, x: str) -> tuple[list[float], list[float]]:
        pts = [(r[x] / (60.0 if x == "elapsed_s" else 1.0), r[key]) for r in records
               if r.get("phase") == phase and key in r and x in r]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for phase, key, style, label in (
        ("warmup_eval", "success", "s--", "warm-up (SFT) eval, held-out"),
        ("eval", "success", "o-", "RL eval, held-out"),
        ("train", "rollout/success", ".:", "RL training rollouts"),
    ):
        xs, ys = series(phase, key, "elapsed_s")
        if xs:
            ax1.plot(xs, ys, style, label=label)
    ax1.set_xlabel("wall-clock minutes")
    ax1.set_ylabel("success rate")
    ax1.set_ylim(-0.02, 1.02)
    ax1.grid(alpha=0.3)
    xs, ys = series("train", "rollout/reward_mean", "step")
    if xs:
        ax2.plot(xs, ys, ".-", label="training reward (mean)")
    xs, ys = series("eval", "reward_mean", "step")
    if xs:
        ax2.plot(xs, ys, "o-", label="held-out reward (mean)")
    ax2.set_xlabel("RL step")
    ax2.set_ylabel("reward")
    ax2.grid(alpha=0.3)
    for ax in (ax1, ax2):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
        else:  # e.g. the RL panel of a warm-up-only run (relax-gym sft)
            ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", va="center", color="gray")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------------
# rollout samples for inspection
# ------------------------------------------------------------------------------------------------
def sample_record(traj: Any, decode: Any, *, reward: float | None = None,
                  reward_components: Mapping[str, float] | None = None, advantage: float | None = None) -> dict[str, Any]:
    """A readable summary of one trajectory (``decode`` turns token ids into text)."""
    prompt_ids = traj.token_ids[: traj.prompt_length]
    response_ids = traj.token_ids[traj.prompt_length:]
    return {
        "env_id": traj.env_id,
        "seed": traj.seed,
        "group_id": traj.group_id,
        "sample_index": traj.sample_index,
        "prompt": decode(collapse_image_tokens(prompt_ids, getattr(traj, "image_token_id", None))),
        "response": decode(response_ids),
        "turns": [t.assistant_text for t in traj.turns],
        "env_reward": traj.reward,
        "reward": reward,
        "reward_components": dict(reward_components or traj.reward_components),
        "advantage": advantage,
        "success": traj.success,
        "stop_reason": traj.stop_reason,
        "error": traj.error,
        "num_tokens": len(traj.token_ids),
        "num_sampled_tokens": traj.num_sampled_tokens,
        "weight_versions": sorted(traj.weight_version_mix),
    }


def dump_samples(out_dir: str | Path, step: int, records: Sequence[Mapping[str, Any]], *, prefix: str = "step") -> Path:
    """Write ``records`` to ``<out_dir>/samples/<prefix>_<step>.jsonl``."""
    folder = Path(out_dir) / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}_{step:06d}.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
    return path


__all__ = [
    "PHASES",
    "PhaseTimer",
    "RunLogger",
    "dump_samples",
    "plot_curves",
    "read_metrics",
    "sample_record",
]
