"""Launch SGLang's server (GPU machines) with the flags relax-gym relies on, and wait for health.

SGLang's server needs CUDA kernels (``sgl-kernel``) that PyPI ships for GPUs only, so on a CPU
machine use the embedded engine instead; both speak the same protocol. The launcher runs::

    python -m sglang.launch_server --model-path M --host 127.0.0.1 --port P --tp-size N
        [--mem-fraction-static F] [--api-key K] [--weight-version V] [extra flags...]

with its output in a log file, polls ``/health`` until a deadline (failing early, with the log
tail, if the process exits), and stops it with SIGTERM then SIGKILL.

Before a run starts, :func:`preflight` gives one clear line for each way a launch would fail
late: sglang missing or older than :data:`MIN_SGLANG` in the python that will run it, no CUDA GPU,
or a flag the installed version's own parser (``prepare_server_args``) rejects. For servers
someone else started, :func:`check_sglang_server` tells a non-SGLang server or a too-old one
from a good one by its ``/server_info``.
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

import subprocess
from typing import Any

from relax_gym.trainer.engines.launch import ServerProcess, ServerStartError, Terminated, sigterm_raises

#: the oldest SGLang whose protocol we checked (weight_versions spans, /model_info, the group layout)
MIN_SGLANG = (0, 5, 23)

# Runs in the python that will serve: the installed version, then SGLang's own parser on our
# flags (an unknown flag exits 2). sglang/__init__ is skipped (a bare package): it imports much
# that the parser does not need.
_PARSE_FLAGS = """
import importlib.util, sys, types
from importlib.metadata import version
print("sglang-version", version("sglang"), flush=True)
if sys.argv[1] == "parse":
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(importlib.util.find_spec("sglang").submodule_search_locations)
    sys.modules["sglang"] = pkg
    from sglang.srt.server_args import prepare_server_args
    prepare_server_args(sys.argv[2:])
"""


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


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def preflight(opts: SGLangOptions, *, need_gpu: bool = True, parse_flags: bool = True,
              timeout_s: float = 180.0) -> str:
    """Check ``opts`` before any server starts; returns the installed sglang version.

    Raises :class:`ServerStartError` with one line: sglang missing or too old in ``opts.python``,
    no CUDA GPU (``need_gpu``), or a flag SGLang's own parser rejects (``parse_flags``; its
    import takes 5-15 s)."""
    argv = build_command(opts)[3:]
    try:
        done = subprocess.run([opts.python, "-c", _PARSE_FLAGS, "parse" if parse_flags else "version", *argv],
                              capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **opts.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerStartError(f"cannot run {opts.python} to check sglang: {exc}") from None
    lines = done.stdout.splitlines()
    found = next((ln.split()[1] for ln in lines if ln.startswith("sglang-version ")), None)
    if found is None:
        raise ServerStartError(f"sglang is not installed for {opts.python} (pip install sglang=="
                               f"{'.'.join(map(str, MIN_SGLANG))} on a GPU machine; on CPU use engine.kind embedded)")
    if _version_tuple(found) < MIN_SGLANG:
        raise ServerStartError(f"sglang {found} is too old: relax-gym needs {'.'.join(map(str, MIN_SGLANG))} or "
                               "newer (weight_versions spans, /model_info, the weight-update group layout)")
    if done.returncode != 0:
        err = [ln for ln in done.stderr.splitlines() if ln.strip()]
        detail = next((ln for ln in reversed(err) if "error:" in ln), err[-1] if err else f"exit {done.returncode}")
        raise ServerStartError(f"sglang {found} rejects the launch flags {' '.join(argv)}: {detail.strip()}")
    if need_gpu and not gpu_available():
        raise ServerStartError("engine.kind sglang needs a CUDA GPU (SGLang's PyPI server has no CPU build); "
                               "on CPU use engine.kind embedded")
    return found


def check_sglang_server(info: dict[str, Any], url: str) -> str:
    """One line for a server's ``/server_info`` that is not a usable SGLang (else its version)."""
    version = info.get("version")
    if not isinstance(version, str) or not version:
        raise ServerStartError(f"{url} is not an SGLang server (its /server_info has no version)")
    if version.startswith("relax-gym-embedded"):
        return version
    if _version_tuple(version) < MIN_SGLANG:
        raise ServerStartError(f"{url} runs sglang {version}; relax-gym needs "
                               f"{'.'.join(map(str, MIN_SGLANG))} or newer")
    return version


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
        if self.opts.python == sys.executable and not sglang_available():
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


__all__ = [
    "MIN_SGLANG",
    "SGLangOptions",
    "SGLangServer",
    "build_command",
    "check_sglang_server",
    "gpu_available",
    "preflight",
    "run_foreground",
    "sglang_available",
]
