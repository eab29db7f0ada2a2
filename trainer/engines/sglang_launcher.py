"""Launch SGLang's server (GPU machines) with the flags relax-gym relies on, and wait for health.

SGLang's server needs CUDA kernels (``sgl-kernel``) that PyPI ships for GPUs only, so on a CPU
machine use the embedded engine instead; both speak the same protocol. The launcher runs::

    python -m sglang.launch_server --model-path M --host 127.0.0.1 --port P --tp-size N
        [--mem-fraction-static F] [--api-key K] [--weight-version V] [extra flags...]

with its output in a log file, polls ``/health`` until a deadline (failing early, with the log
tail, if the process exits), and stops it with SIGTERM then SIGKILL.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from relax_gym.trainer.engines.launch import ServerProcess, ServerStartError, Terminated, sigterm_raises


@dataclass
class SGLangOptions:
    """The SGLang flags relax-gym sets; anything else goes through ``extra_args``."""

    model: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp: int = 1
    mem_fraction_static: float | None = None
    api_key: str | None = None
    weight_version: str | None = None
    served_model_name: str | None = None
    log_file: str = "sglang.log"
    health_timeout_s: float = 900.0
    python: str = sys.executable
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def sglang_available() -> bool:
    """True when ``sglang`` is importable here (its server still needs a CUDA GPU)."""
    return importlib.util.find_spec("sglang") is not None


def gpu_available() -> bool:
    """A CUDA GPU is visible: ``nvidia-smi`` exists and torch (if installed) sees a device."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return True


def build_command(opts: SGLangOptions) -> list[str]:
    """The ``python -m sglang.launch_server`` command line for ``opts``."""
    cmd = [
        opts.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        opts.model,
        "--host",
        opts.host,
        "--port",
        str(opts.port),
        "--tp-size",
        str(opts.tp),
    ]
    if opts.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(opts.mem_fraction_static)]
    if opts.api_key:
        cmd += ["--api-key", opts.api_key]
    if opts.weight_version:
        cmd += ["--weight-version", opts.weight_version]
    if opts.served_model_name:
        cmd += ["--served-model-name", opts.served_model_name]
    return cmd + list(opts.extra_args)


class SGLangServer(ServerProcess):
    """One SGLang server process; a context manager that waits for health and stops it."""

    def __init__(self, opts: SGLangOptions) -> None:
        env = {**os.environ, **opts.env}
        headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
        super().__init__(build_command(opts), log_file=opts.log_file, env=env, health_headers=headers)
        self.opts = opts

    @property
    def url(self) -> str:
        return f"http://{self.opts.host}:{self.opts.port}"

    def start(self) -> None:
        if not sglang_available():
            raise ServerStartError("sglang is not installed (pip install 'relax-gym[sglang]' on a GPU machine)")
        super().start()
        self.wait_healthy(lambda: f"{self.url}/health", timeout_s=self.opts.health_timeout_s, poll_s=1.0)

    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout_s=60.0)


def run_foreground(opts: SGLangOptions) -> int:
    """``relax-gym engine sglang``: start, report health, then wait until interrupted.

    SIGTERM or Ctrl-C at any point -- while waiting for ``/health`` too -- stops the server
    (SIGTERM to its process group, SIGKILL after 60 s) before this returns."""
    server = SGLangServer(opts)
    stopped = False
    try:
        with sigterm_raises():
            server.start()
            print(f"SGLang healthy at {server.url} (log: {Path(opts.log_file).resolve()})", flush=True)
            while server.running:
                time.sleep(1.0)
    except ServerStartError as exc:
        print(exc, file=sys.stderr)
        return 1
    except (Terminated, KeyboardInterrupt):
        stopped = True
    finally:
        code = server.stop(timeout_s=60.0)
    return 0 if stopped or code in (0, -signal.SIGTERM, None) else int(code or 1)


__all__ = ["SGLangOptions", "SGLangServer", "build_command", "gpu_available", "run_foreground", "sglang_available"]
