"""Start the embedded engine: load the model, start the scheduler thread, serve HTTP.

``serve(EmbeddedOptions(model=..., port=...))`` blocks until SIGINT/SIGTERM. Port 0 picks a
free port; ``port_file`` receives the bound port once the socket is listening, which is how
:class:`~relax_gym.trainer.engines.launch.EmbeddedEngineProcess` finds a server it started.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the sampler imports torch; this module must stay light until serve() runs
    from .sampling import LogprobMode


@dataclass
class EmbeddedOptions:
    """Everything ``relax-gym engine serve`` takes (see ``relax-gym engine serve --help``)."""

    model: str
    host: str = "127.0.0.1"
    port: int = 30000
    port_file: str | None = None
    api_key: str | None = None
    protect_generation: bool = False
    served_model_name: str | None = None
    max_batch_size: int = 32
    max_prefill_tokens: int = 8192
    prefix_cache_tokens: int = 32768
    threads: int | None = None
    seed: int = 0
    logprob_mode: LogprobMode = "scaled"
    weight_version: str = "default"
    allow_media_paths: bool = False
    default_max_tokens: int = 512
    reasoning_parser: str | None = None
    dtype: str = "float32"
    log_level: str = "warning"


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def serve(opts: EmbeddedOptions) -> int:
    """Run the server until interrupted. Returns the process exit code."""
    if not (Path(opts.model) / "config.json").is_file():  # fail before paying for torch's import
        print(f"error: {opts.model} is not a Hugging Face model folder (no config.json)", file=sys.stderr)
        return 2
    import torch
    import uvicorn

    from .engine import EngineCore
    from .runner import ModelRunner
    from .server import EngineService, ServerConfig, build_app

    logging.basicConfig(
        level=getattr(logging, opts.log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if opts.threads:
        torch.set_num_threads(opts.threads)
    runner = ModelRunner(opts.model, dtype=opts.dtype)
    engine = EngineCore(
        runner,
        max_batch_size=opts.max_batch_size,
        max_prefill_tokens=opts.max_prefill_tokens,
        logprob_mode=opts.logprob_mode,
        seed=opts.seed,
        weight_version=opts.weight_version,
        prefix_cache_tokens=opts.prefix_cache_tokens,
    )
    config = ServerConfig(
        model_path=str(Path(opts.model)),
        served_model_name=opts.served_model_name or Path(opts.model).name,
        api_key=opts.api_key,
        protect_generation=opts.protect_generation,
        allow_media_paths=opts.allow_media_paths,
        default_max_tokens=opts.default_max_tokens,
        reasoning_parser=opts.reasoning_parser,
    )
    app = build_app(EngineService(engine, config))
    sock = bind_socket(opts.host, opts.port)
    port = sock.getsockname()[1]
    engine.start()
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=opts.log_level, access_log=False, lifespan="off", timeout_keep_alive=30)
    )
    if opts.port_file:
        tmp = f"{opts.port_file}.tmp"
        Path(tmp).write_text(str(port), encoding="utf-8")
        os.replace(tmp, opts.port_file)
    logging.getLogger("relax_gym.engine").warning(
        "embedded engine serving %s on http://%s:%d", opts.model, opts.host, port
    )
    try:
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    return 0


__all__ = ["EmbeddedOptions", "bind_socket", "serve"]
