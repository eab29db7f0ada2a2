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

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.trainer.config import EngineConfig, SGLangLaunchConfig


@dataclass
class EngineFleet:
    """Start/stop the run's engines; ``urls`` lists where they serve."""

    config: EngineConfig
    model_path: Path
    log_dir: Path
    seed: int = 0
    api_key: str | None = None
    index_offset: int = 0  # engines launched later (scale-out) continue the numbering: logs, GPUs, seeds
    in_process: bool = False  # embedded engines run in this process (trainer.engines.in_process), no HTTP
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
        if not self.launches:
            raise ValueError("engine.kind is external: this run launches no engines (register a running one by URL)")
        if self.api_key is None:  # control routes are token-protected even on 127.0.0.1
            self.api_key = self.config.api_key or secrets.token_hex(16)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        i = self.index_offset + len(self._procs)
        proc: Any
        if self.config.kind == "sglang":
            from relax_gym.trainer.engines.sglang_launcher import SGLangServer

            proc = SGLangServer(self._sglang_options(i))
        elif self.in_process:
            from relax_gym.trainer.engines.in_process import InProcessEngine

            proc = InProcessEngine(self.model_path, api_key=self.api_key, seed=self.seed + i,
                                   max_batch_size=self.config.max_batch_size, weight_version="0")
        else:
            from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

            extra = ["--max-batch-size", str(self.config.max_batch_size), "--seed", str(self.seed + i),
                     "--weight-version", "0"]
            proc = EmbeddedEngineProcess(self.model_path, api_key=self.api_key, extra_args=extra,
                                         log_file=self.log_dir / f"engine{i}.log", threads=self.config.threads,
                                         startup_timeout_s=self.config.startup_timeout_s)
        try:
            proc.start()
        except BaseException:
            try:  # a process that never became healthy is not left running
                proc.stop()
            except Exception:  # noqa: BLE001, S110 - the start error is the one to raise
                pass
            raise
        self._procs.append(proc)
        self.urls.append(proc.url)
        return str(proc.url)

    def _sglang_options(self, i: int) -> Any:
        """Engine ``i``'s SGLang launch: a free port, its own GPUs, weight version 0."""
        s = self.config.sglang
        gpus = ",".join(str(g) for g in range(i * s.tp, (i + 1) * s.tp))
        return sglang_launch_options(s, str(self.model_path), api_key=self.api_key,
                                     log_file=str(self.log_dir / f"engine{i}.log"), env={"CUDA_VISIBLE_DEVICES": gpus})

    def stop_url(self, url: str) -> bool:
        """Stop the engine this fleet launched at ``url``; False if it launched none there."""
        for proc in list(self._procs):
            if str(proc.url).rstrip("/") == url.rstrip("/"):
                self._procs.remove(proc)
                if url in self.urls:
                    self.urls.remove(url)
                proc.stop()
                return True
        return False

    @property
    def pids(self) -> list[dict[str, Any]]:
        """``{"pid", "url"}`` of every engine process this fleet started (orphan clean-up on resume)."""
        return [{"pid": p.proc.pid, "url": p.url} for p in self._procs if getattr(p, "proc", None) is not None]

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


def sglang_launch_options(section: SGLangLaunchConfig, model: str, *, api_key: str | None, log_file: str,
                          host: str = "127.0.0.1", env: dict[str, str] | None = None) -> Any:
    """The ``engine.sglang`` section as one server's launch: a free port on this host, weight
    version 0 (the run's starting weights). Used by the fleet and by Ray's engine actors."""
    import sys

    from relax_gym.trainer.engines.sglang_launcher import SGLangOptions
    from relax_gym.trainer.weights.broadcast import free_port

    return SGLangOptions(model=model, host=host, port=free_port(), tp=section.tp,
                         mem_fraction_static=section.mem_fraction_static, api_key=api_key, weight_version="0",
                         log_file=log_file, health_timeout_s=section.health_timeout_s,
                         python=section.python or sys.executable, extra_args=list(section.extra_args),
                         env=dict(env or {}))


class ScaleOutLauncher:
    """Engines started on demand through the control API (``POST /engines {"launch": true}``):
    the run's own engine kind and model, numbered after the run's first engines, recorded in
    ``<out>/engines/pids-scaleout.json`` so a resume after a crash stops orphans, and stopped
    when removed or when the run ends."""

    def __init__(self, config: EngineConfig, model_path: str | Path, out_dir: str | Path, *, api_key: str | None,
                 seed: int = 0) -> None:
        if not api_key:  # the router must reach the new engine's token-protected control routes
            raise ValueError("engines launched for scale-out need the router's API key")
        first = config.num_engines if config.kind != "external" else 0
        self.fleet = EngineFleet(config, Path(model_path), Path(out_dir) / "engines", seed=seed, api_key=api_key,
                                 index_offset=first)
        self._lock = asyncio.Lock()

    async def launch(self) -> str:
        async with self._lock:  # one start at a time: engine numbers and GPUs stay distinct
            url = await asyncio.to_thread(self.fleet.launch_one)
            self._record()
            return url

    async def stop(self, url: str) -> bool:
        stopped = await asyncio.to_thread(self.fleet.stop_url, url)
        self._record()
        return stopped

    async def close(self) -> None:
        await asyncio.to_thread(self.fleet.stop)
        (self.fleet.log_dir / SCALEOUT_PIDS).unlink(missing_ok=True)

    def _record(self) -> None:
        self.fleet.log_dir.mkdir(parents=True, exist_ok=True)
        (self.fleet.log_dir / SCALEOUT_PIDS).write_text(json.dumps(self.fleet.pids), encoding="utf-8")


SCALEOUT_PIDS = "pids-scaleout.json"

__all__ = ["SCALEOUT_PIDS", "EngineFleet", "ScaleOutLauncher", "sglang_launch_options"]
