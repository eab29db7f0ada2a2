"""Server launchers: the embedded engine's failure path and OpenMP policy, SGLang's command line,
SGLang on a GPU."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from relax_gym.trainer.engines.embedded import sleeping_openmp_workers
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess, ServerStartError
from relax_gym.trainer.engines.sglang_launcher import (
    SGLangOptions,
    SGLangServer,
    build_command,
    gpu_available,
    sglang_available,
)
from relax_gym.trainer.models import build_tiny_model

from relax_gym.protocol import (
    EngineClient,
    GenerateRequest,
    SamplingParams,
    UpdateWeightsFromDiskRequest,
)


def test_sglang_command_line() -> None:
    cmd = build_command(
        SGLangOptions(
            model="/m",
            port=31000,
            tp=2,
            mem_fraction_static=0.7,
            api_key="k",
            weight_version="v0",
            extra_args=["--attention-backend", "triton"],
        )
    )
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(cmd)
    for flag in (
        "--model-path /m",
        "--host 127.0.0.1",
        "--port 31000",
        "--tp-size 2",
        "--mem-fraction-static 0.7",
        "--api-key k",
        "--weight-version v0",
        "--attention-backend triton",
    ):
        assert flag in joined
    assert "--mem-fraction-static" not in build_command(SGLangOptions(model="/m"))


def test_engine_lets_idle_openmp_workers_sleep_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "")  # so that the teardown undoes what the call sets
    monkeypatch.delenv("OMP_WAIT_POLICY")
    sleeping_openmp_workers()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a user's choice stays
    sleeping_openmp_workers()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_embedded_engine_that_cannot_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    start = time.monotonic()
    engine = EmbeddedEngineProcess(tmp_path / "no-model-here", log_file=tmp_path / "engine.log", startup_timeout_s=120)
    with pytest.raises(ServerStartError) as info:
        engine.start()
    engine.stop()
    assert "exited with code" in str(info.value)
    assert "no-model-here" in str(info.value)  # the log tail names the problem
    assert time.monotonic() - start < 100


@pytest.mark.gpu
@pytest.mark.skipif(not (gpu_available() and sglang_available()), reason="needs a CUDA GPU and sglang")
def test_sglang_server_on_gpu(tmp_path: Path) -> None:
    """Same client, same protocol, against SGLang itself (tiny model with GPU-kernel-friendly heads)."""
    model = build_tiny_model(
        "qwen3",
        tmp_path / "tiny",
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=256,
    )
    opts = SGLangOptions(
        model=str(model),
        port=31987,
        mem_fraction_static=0.3,
        api_key="gpu-key",
        log_file=str(tmp_path / "sglang.log"),
        health_timeout_s=600,
        extra_args=["--disable-cuda-graph"],
    )

    async def exercise(url: str) -> None:
        async with EngineClient(url, api_key="gpu-key") as client:
            out = await client.generate(
                GenerateRequest(
                    input_ids=[1, 2, 3, 4],
                    return_logprob=True,
                    sampling_params=SamplingParams(max_new_tokens=8, ignore_eos=True),
                )
            )
            assert len(out.token_ids()) == 8 == len(out.token_logprobs())
            reply = await client.update_weights_from_disk(
                UpdateWeightsFromDiskRequest(model_path=str(model), weight_version="v-gpu")
            )
            assert reply.success
            assert (await client.model_info()).weight_version == "v-gpu"

    with SGLangServer(opts) as server:
        asyncio.run(exercise(server.url))
