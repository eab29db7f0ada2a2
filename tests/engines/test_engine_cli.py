"""``relax-gym engine``'s flags reach the option objects, each with its unit converted."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from relax_gym.trainer.engine_cli import add_arguments, serve_options, sglang_options
from relax_gym.trainer.engines.embedded import EmbeddedOptions
from relax_gym.trainer.engines.sglang_launcher import SGLangOptions


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


SERVE_ARGV = [
    "serve", "--model", "m", "--host", "0.0.0.0", "--port", "1", "--port-file", "p", "--api-key", "k",
    "--protect-generation", "--served-model-name", "n", "--max-batch-size", "2", "--max-prefill-tokens", "3",
    "--prefix-cache-tokens", "4", "--threads", "5", "--seed", "6", "--logprob-mode", "raw",
    "--weight-version", "v", "--allow-media-paths", "--default-max-tokens", "7", "--reasoning-parser", "qwen3",
    "--max-request-mb", "1", "--max-weight-request-mb", "2", "--max-buffered-mb", "3", "--body-timeout", "8",
    "--max-prompt-chars", "9", "--max-images", "10", "--max-image-mb", "4", "--max-image-pixels", "11",
    "--heavy-concurrency", "12", "--max-connections", "13", "--dtype", "bfloat16", "--log-level", "info",
    "--weight-group-timeout", "14", "--shutdown-grace", "15", "--exit-with-parent",
]  # fmt: skip


def test_every_serve_option_has_a_flag_that_reaches_it() -> None:
    options = serve_options(_parse(SERVE_ARGV))
    defaults = EmbeddedOptions(model="default-model")
    fields = [f.name for f in dataclasses.fields(EmbeddedOptions)]
    unchanged = [name for name in fields if getattr(options, name) == getattr(defaults, name)]
    assert unchanged == []
    assert options.max_request_bytes == 1 << 20 and options.max_weight_request_bytes == 2 << 20
    assert options.max_buffered_bytes == 3 << 20 and options.max_image_bytes == 4 << 20
    assert (options.body_timeout_s, options.shutdown_grace_s, options.logprob_mode) == (8.0, 15.0, "raw")


def test_serve_defaults_are_the_options_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAX_GYM_ENGINE_API_KEY", raising=False)
    assert serve_options(_parse(["serve", "--model", "m"])) == EmbeddedOptions(model="m")


def test_sglang_flags_and_extra_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAX_GYM_ENGINE_API_KEY", "secret")
    args = _parse(["sglang", "--model", "q", "--tp", "2", "--timeout", "5", "--log-file", "l", "--", "--x", "1"])
    assert sglang_options(args) == SGLangOptions(
        model="q", tp=2, health_timeout_s=5.0, log_file="l", api_key="secret", extra_args=["--x", "1"]
    )
