"""The engines a training run generates with: embedded CPU engines it starts, or external URLs.

``engine.kind: embedded`` starts ``engine.num_engines`` copies of ``relax-gym engine serve`` as
child processes on 127.0.0.1 (free ports, logs under ``<out>/engines/``), each serving the run's
starting model with weight version 0, and stops them when the run ends -- also on errors and
Ctrl-C. ``engine.kind: external`` uses already running SGLang-protocol servers (SGLang on GPUs);
the run then syncs weights over ``/update_weights_from_disk`` from a folder those servers can read.
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

    def start(self) -> EngineFleet:
        if not self.embedded:
            self.urls = list(self.config.urls)
            self.api_key = self.config.api_key
            return self
        from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

        # Control routes (weight updates, pause) are token-protected even on 127.0.0.1.
        self.api_key = self.config.api_key or secrets.token_hex(16)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.config.num_engines):
                extra = ["--max-batch-size", str(self.config.max_batch_size), "--seed", str(self.seed + i),
                         "--weight-version", "0"]
                proc = EmbeddedEngineProcess(self.model_path, api_key=self.api_key, extra_args=extra,
                                             log_file=self.log_dir / f"engine{i}.log", threads=self.config.threads,
                                             startup_timeout_s=self.config.startup_timeout_s)
                self._procs.append(proc)
                proc.start()
                self.urls.append(proc.url)
        except BaseException:
            self.stop()
            raise
        return self

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
