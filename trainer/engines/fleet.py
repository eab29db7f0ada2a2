"""The engines a training run generates with: engines it starts itself, or external URLs.

``engine.kind: embedded`` starts ``engine.num_engines`` copies of ``relax-gym engine serve`` as
child processes on 127.0.0.1 (free ports, logs under ``<out>/engines/``); ``engine.kind: sglang``
starts as many SGLang servers (``engine.sglang``: TP size, memory fraction, extra flags), engine
``i`` on GPUs ``i*tp .. i*tp+tp-1``, after :func:`~relax_gym.trainer.engines.sglang_launcher.preflight`
has checked the install, the GPU and every flag. Both serve the run's starting model with weight
version 0 through one code path (:meth:`EngineFleet.launch_one`, also what scale-out calls to add
an engine) and are stopped when the run ends -- also on errors and Ctrl-C.
``engine.kind: external`` uses already running SGLang-protocol servers; the run then syncs
weights over ``/update_weights_from_disk`` from a folder those servers can read.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import EngineConfig


@dataclass
class EngineFleet:
    """Start/stop the run's engines; ``urls`` lists where they serve."""

    config: EngineConfig
    model_path: Path
    log_dir: Path
    seed: int = 0
    api_key: str | None = None
    _procs: list[Any] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    @property
    def embedded(self) -> bool:
        return self.config.kind == "embedded"

    @property
    def launches(self) -> bool:
        """True when the fleet starts its engines (embedded or sglang), False for external URLs."""
        return self.config.kind != "external"

    def start(self) -> EngineFleet:
        if not self.launches:
            self.urls = list(self.config.urls)
            self.api_key = self.config.api_key
            return self
        # Control routes (weight updates, pause) are token-protected even on 127.0.0.1.
        self.api_key = self.config.api_key or secrets.token_hex(16)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.config.kind == "sglang":  # one clear line before anything starts
            from relax_gym.trainer.engines.sglang_launcher import preflight

            preflight(self._sglang_options(0))
        try:
            for _ in range(self.config.num_engines):
                self.launch_one()
        except BaseException:
            self.stop()
            raise
        return self

    def launch_one(self) -> str:
        """Start one more engine of the configured kind, wait for its health; returns its URL."""
        i = len(self._procs)
        proc: Any
        if self.config.kind == "sglang":
            from relax_gym.trainer.engines.sglang_launcher import SGLangServer

            proc = SGLangServer(self._sglang_options(i))
        else:
            from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

            extra = ["--max-batch-size", str(self.config.max_batch_size), "--seed", str(self.seed + i),
                     "--weight-version", "0"]
            proc = EmbeddedEngineProcess(self.model_path, api_key=self.api_key, extra_args=extra,
                                         log_file=self.log_dir / f"engine{i}.log", threads=self.config.threads,
                                         startup_timeout_s=self.config.startup_timeout_s)
        self._procs.append(proc)
        proc.start()
        self.urls.append(proc.url)
        return str(proc.url)

    def _sglang_options(self, i: int) -> Any:
        """Engine ``i``'s SGLang launch: a free port, its own GPUs, weight version 0."""
        import sys

        from relax_gym.trainer.engines.sglang_launcher import SGLangOptions
        from relax_gym.trainer.weights.broadcast import free_port

        s = self.config.sglang
        gpus = ",".join(str(g) for g in range(i * s.tp, (i + 1) * s.tp))
        return SGLangOptions(model=str(self.model_path), port=free_port(), tp=s.tp,
                             mem_fraction_static=s.mem_fraction_static, api_key=self.api_key, weight_version="0",
                             log_file=str(self.log_dir / f"engine{i}.log"), health_timeout_s=s.health_timeout_s,
                             python=s.python or sys.executable, extra_args=list(s.extra_args),
                             env={"CUDA_VISIBLE_DEVICES": gpus})

    def stop(self) -> None:
        for proc in self._procs:
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 -- stopping must reach every engine
                pass
        self._procs.clear()

    def __enter__(self) -> EngineFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["EngineFleet"]
