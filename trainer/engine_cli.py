"""``relax-gym engine``: serve a model with the embedded engine, build tiny models, launch SGLang.

relax-gym engine build-tiny --kind qwen3-vl --out models/tiny-vl
relax-gym engine serve --model models/tiny-vl --port 30000 [--api-key TOKEN]
relax-gym engine sglang --model Qwen/Qwen3-VL-2B-Instruct --port 30000 --tp 1   # GPU machines
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relax_gym.trainer.engines.embedded import EmbeddedOptions
    from relax_gym.trainer.engines.sglang_launcher import SGLangOptions


def _positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive, finite number of seconds")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="engine_command", metavar="ACTION")
    _add_serve_arguments(sub.add_parser("serve", help="serve a HF model over SGLang's HTTP protocol on CPU"))
    _add_build_tiny_arguments(
        sub.add_parser("build-tiny", help="build a tiny random Qwen3 / Qwen3-VL model folder (no download)")
    )
    _add_sglang_arguments(sub.add_parser("sglang", help="launch SGLang's server (GPU machines) and wait until healthy"))


def _add_serve_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", required=True, help="HF model folder (config, safetensors, tokenizer)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=30000, help="port; 0 picks a free one (see --port-file)")
    s.add_argument("--port-file", default=None, help="write the bound port here once listening")
    s.add_argument(
        "--api-key",
        default=os.environ.get("RELAX_GYM_ENGINE_API_KEY"),
        help="bearer token for control routes (env RELAX_GYM_ENGINE_API_KEY)",
    )
    s.add_argument(
        "--protect-generation",
        action="store_true",
        help="also require the token on /generate, /v1/* and the info routes",
    )
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--max-batch-size", type=int, default=32, help="most requests decoded together")
    s.add_argument("--max-prefill-tokens", type=int, default=8192, help="prompt tokens per prefill batch")
    s.add_argument("--prefix-cache-tokens", type=int, default=32768, help="token budget of the prefix cache (0: off)")
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    s.add_argument("--seed", type=int, default=0, help="seeds requests that bring no sampling_seed")
    s.add_argument(
        "--logprob-mode",
        choices=["scaled", "raw"],
        default="scaled",
        help="scaled: log_softmax(logits/T) (default); raw: log_softmax(logits)",
    )
    s.add_argument("--weight-version", default="default")
    s.add_argument("--allow-media-paths", action="store_true", help="let image_data name local files")
    s.add_argument("--default-max-tokens", type=int, default=512, help="chat completions without max_tokens")
    s.add_argument(
        "--reasoning-parser",
        choices=["qwen3"],
        default=None,
        help="split <think> blocks into reasoning_content on /v1/chat/completions",
    )
    _add_input_limit_arguments(s)
    s.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    s.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    s.add_argument(
        "--weight-group-timeout",
        type=_positive_seconds,
        default=60.0,
        help="seconds a weight-group rendezvous or broadcast may take before it fails (default 60)",
    )
    s.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started the engine exits (set by the trainer's launcher)",
    )
    s.add_argument(
        "--shutdown-grace",
        type=_positive_seconds,
        default=3.0,
        help="on SIGTERM, seconds in-flight requests get before they are cancelled (default 3)",
    )


def _add_input_limit_arguments(s: argparse.ArgumentParser) -> None:
    lim = s.add_argument_group("input limits (each refused request gets 4xx; see docs/engine.md)")
    lim.add_argument("--max-request-mb", type=int, default=32, help="request body cap, MiB (413 beyond)")
    lim.add_argument("--max-weight-request-mb", type=int, default=1024, help="/update_weights_from_tensor body cap")
    lim.add_argument("--max-buffered-mb", type=int, default=None, help="all bodies held at once (503 beyond)")
    lim.add_argument("--body-timeout", type=float, default=300.0, help="seconds to receive a body (408 after)")
    lim.add_argument("--max-prompt-chars", type=int, default=None, help="default: 32 x the context length")
    lim.add_argument("--max-images", type=int, default=32, help="images per request")
    lim.add_argument("--max-image-mb", type=int, default=16, help="encoded size per image, MiB")
    lim.add_argument("--max-image-pixels", type=int, default=4096 * 4096, help="width x height per image")
    lim.add_argument("--heavy-concurrency", type=int, default=2, help="large/image requests prepared at once")
    lim.add_argument("--max-connections", type=int, default=4096, help="open connections (503 beyond)")


def _add_build_tiny_arguments(b: argparse.ArgumentParser) -> None:
    b.add_argument("--kind", default="qwen3", choices=["qwen3", "qwen3-vl", "qwen3_vl", "qwen3-omni", "qwen3_omni", "llama", "qwen2", "gemma3"])
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--tokenizer",
        default="qwen3",
        choices=["qwen3", "tiny-bpe"],
        help="the real Qwen3 tokenizer (151k vocab) or a tiny offline BPE (512)",
    )
    b.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    b.add_argument("--hidden-size", type=int, default=None, help="override hidden_size")


def _add_sglang_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--model", required=True)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--mem-fraction-static", type=float, default=None)
    g.add_argument("--api-key", default=os.environ.get("RELAX_GYM_ENGINE_API_KEY"))
    g.add_argument("--log-file", default="sglang.log")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for /health")
    g.add_argument("extra", nargs=argparse.REMAINDER, help="more sglang.launch_server flags after --")


def run(args: argparse.Namespace) -> int:
    command = getattr(args, "engine_command", None)
    if command == "serve":
        from relax_gym.trainer.engines.embedded import serve

        return int(serve(serve_options(args)))
    if command == "build-tiny":
        return _build_tiny(args)
    if command == "sglang":
        from relax_gym.trainer.engines.sglang_launcher import run_foreground

        return int(run_foreground(sglang_options(args)))
    print("usage: relax-gym engine {serve,build-tiny,sglang} ... (see --help)", file=sys.stderr)
    return 2


def _same_named(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The parsed flags whose name is a field of ``cls`` (``--max-batch-size`` -> ``max_batch_size``)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: value for name, value in vars(args).items() if name in names}


def _mib(value: int | None) -> int | None:
    return None if value is None else value << 20


def serve_options(args: argparse.Namespace) -> EmbeddedOptions:
    """``engine serve``'s flags as options: same-named ones as they are, the MiB and seconds ones converted."""
    from relax_gym.trainer.engines.embedded import EmbeddedOptions

    return EmbeddedOptions(
        **_same_named(args, EmbeddedOptions),
        max_request_bytes=args.max_request_mb << 20,
        max_weight_request_bytes=args.max_weight_request_mb << 20,
        max_buffered_bytes=_mib(args.max_buffered_mb),
        max_image_bytes=args.max_image_mb << 20,
        body_timeout_s=args.body_timeout,
        weight_group_timeout_s=args.weight_group_timeout,
        shutdown_grace_s=args.shutdown_grace,
    )


def sglang_options(args: argparse.Namespace) -> SGLangOptions:
    """``engine sglang``'s flags as options (what follows ``--`` goes to SGLang unchanged)."""
    from relax_gym.trainer.engines.sglang_launcher import SGLangOptions

    extra = [a for a in (args.extra or []) if a != "--"]
    return SGLangOptions(**_same_named(args, SGLangOptions), health_timeout_s=args.timeout, extra_args=extra)


def _build_tiny(args: argparse.Namespace) -> int:
    from relax_gym.trainer.models import build_tiny_model, folder_size_bytes

    overrides = {}
    if args.layers:
        overrides["num_hidden_layers"] = args.layers
    if args.hidden_size:
        overrides["hidden_size"] = args.hidden_size
    path = build_tiny_model(args.kind, args.out, seed=args.seed, tokenizer=args.tokenizer, **overrides)
    print(f"built tiny {args.kind} at {path} ({folder_size_bytes(path) / 1e6:.1f} MB)")
    return 0
