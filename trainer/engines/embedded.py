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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the sampler imports torch; this module must stay light until serve() runs
    import uvicorn

    from relax_gym.trainer.engines.sampling import LogprobMode


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
    max_request_bytes: int = 32 << 20
    max_weight_request_bytes: int = 1 << 30
    max_buffered_bytes: int | None = None
    body_timeout_s: float = 300.0
    max_prompt_chars: int | None = None
    max_images: int = 32
    max_image_bytes: int = 16 << 20
    max_image_pixels: int = 4096 * 4096
    heavy_concurrency: int = 2
    max_connections: int = 4096  # uvicorn answers 503 beyond this many
    dtype: str = "float32"
    log_level: str = "warning"
    weight_group_timeout_s: float = 60.0  # rendezvous and each broadcast of the distributed weight path
    shutdown_grace_s: float = 3.0  # SIGTERM: in-flight requests get this long, then are cancelled
    exit_with_parent: bool = False  # stop when the process that started us is gone (no orphans)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: Starlette sends a reply's headers and body in two writes,
    # and with Nagle on the body waited for the client's delayed ACK -- 40 ms on every JSON
    # reply of a kept-alive connection (each /generate answer, each step of a weight sync)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def bound_shutdown(server: uvicorn.Server, grace_s: float) -> None:
    """Make SIGTERM/SIGINT stop ``server`` within about ``grace_s`` seconds, whatever is in flight.

    uvicorn waits for open requests before it exits, without limit by default: one request
    waiting on a trainer that never comes (a weight-group rendezvous, a long generation) kept
    the engine alive for minutes. Requests still running after ``grace_s`` are cancelled, and a
    watchdog ends the process ``grace_s + 5`` seconds after the first signal in case anything
    else (a thread stuck in C++, a blocking destructor) still holds it.
    """
    server.config.timeout_graceful_shutdown = max(0.0, grace_s)
    handle_exit = server.handle_exit

    def on_signal(sig: int, frame: FrameType | None) -> None:
        arm_exit_watchdog(max(0.0, grace_s) + 5.0)
        handle_exit(sig, frame)

    server.handle_exit = on_signal  # type: ignore[method-assign]


_watchdog_lock = threading.Lock()
_watchdog: threading.Timer | None = None


def arm_exit_watchdog(after_s: float) -> None:
    """End the process ``after_s`` seconds from the first call, unless it exits before."""
    global _watchdog
    with _watchdog_lock:
        if _watchdog is not None:
            return
        _watchdog = threading.Timer(after_s, _force_exit, args=(after_s,))
        _watchdog.daemon = True
        _watchdog.start()


def _force_exit(after_s: float) -> None:
    logging.getLogger("relax_gym.engine").error("shutdown took over %.0f s; exiting now", after_s)
    logging.shutdown()
    os._exit(1)


def sleeping_openmp_workers() -> None:
    """Let idle OpenMP workers sleep (``OMP_WAIT_POLICY=PASSIVE``) unless the user chose a policy.

    Must run before torch loads: libgomp reads the variable once. Its default keeps a worker
    spinning for milliseconds after every parallel region, so while a forward pass waits for
    the GIL (HTTP, image preparation) or for a core, its workers burn the cores the trainer and
    the engine's own threads need: on 2 cores that doubled the quickstart's rollout time.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_engine(opts: EmbeddedOptions) -> tuple[Any, Any]:
    """The engine (:class:`EngineCore`, not started) and the service behind its routes, as
    ``opts`` describe them. ``serve`` puts the service's app behind uvicorn; the in-process
    engine calls the app (and the service's ``generate_body``) directly."""
    import torch

    from relax_gym.trainer.engines.engine import EngineCore
    from relax_gym.trainer.engines.model_runner import ModelRunner
    from relax_gym.trainer.engines.server import EngineService, ServerConfig
    from relax_gym.trainer.engines.weight_receiver import WeightReceiver

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
        max_request_bytes=opts.max_request_bytes,
        max_weight_request_bytes=opts.max_weight_request_bytes,
        max_buffered_bytes=opts.max_buffered_bytes,
        body_timeout_s=opts.body_timeout_s,
        max_prompt_chars=opts.max_prompt_chars,
        max_images=opts.max_images,
        max_image_bytes=opts.max_image_bytes,
        max_image_pixels=opts.max_image_pixels,
        heavy_concurrency=opts.heavy_concurrency,
    )
    model_elements = sum(t.numel() for t in runner.model.state_dict().values())
    receiver = WeightReceiver(opts.weight_group_timeout_s, max_receive_bytes=16 * model_elements)  # 2x in fp64
    return engine, EngineService(engine, config, receiver)


def serve(opts: EmbeddedOptions) -> int:
    """Run the server until interrupted. Returns the process exit code."""
    if not (Path(opts.model) / "config.json").is_file():  # fail before paying for torch's import
        print(f"error: {opts.model} is not a Hugging Face model folder (no config.json)", file=sys.stderr)
        return 2
    sleeping_openmp_workers()
    import uvicorn

    logging.basicConfig(
        level=getattr(logging, opts.log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from relax_gym.trainer.engines.server import build_app

    engine, service = build_engine(opts)
    app = build_app(service)
    sock = bind_socket(opts.host, opts.port)
    port = sock.getsockname()[1]
    engine.start()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=opts.log_level,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
            limit_concurrency=opts.max_connections,
        )
    )
    bound_shutdown(server, opts.shutdown_grace_s)
    if opts.exit_with_parent:
        watch_parent(server)
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


def watch_parent(server: Any, interval_s: float = 1.0) -> threading.Thread:
    """Stop ``server`` (as SIGTERM would) once the process that started this one is gone: a
    trainer killed with SIGKILL, or a torchrun rank ended before its clean-up ran, must not leave
    its engines running. The parent's death shows as a new parent id (we are re-parented)."""
    parent = os.getppid()

    def watch() -> None:
        while not server.should_exit:
            if os.getppid() != parent:
                logging.getLogger("relax_gym.engine").warning(
                    "the process that started this engine (pid %d) is gone; stopping", parent)
                server.should_exit = True
                return
            time.sleep(interval_s)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["EmbeddedOptions", "bind_socket", "build_engine", "serve", "sleeping_openmp_workers", "watch_parent"]
