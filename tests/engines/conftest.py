"""Shared fixtures: tiny models built once per session, real engine servers per module.

Mechanics tests run on a tiny-BPE Qwen3 (512-token vocabulary: fast on a shared 2-core box);
the Qwen3-VL server uses the real Qwen3 tokenizer, so the real vocabulary and chat template go
through the server too.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.models import build_tiny_model
from tests.scripted_model import teach_completions

API_KEY = "test-secret-key"
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOL_QUESTION = [{"role": "user", "content": "What is 1 + 2?"}]
TOOL_ANSWER = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def chat_prompt_ids(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Rendered exactly as the engine's chat route renders (template text, then tokenize)."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from threads; on the shared 2-core box they only contend."""
    from relax_gym.trainer.models._threads import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def bpe_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random Qwen3 with the tiny offline BPE tokenizer (seed 0)."""
    return build_tiny_model("qwen3", tmp_path_factory.mktemp("models") / "bpe-qwen3", tokenizer="tiny-bpe", seed=0)


@pytest.fixture(scope="session")
def bpe_qwen3_seed1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer, other weights: a weight-update target."""
    return build_tiny_model("qwen3", tmp_path_factory.mktemp("models") / "bpe-qwen3-s1", tokenizer="tiny-bpe", seed=1)


@pytest.fixture(scope="session")
def scripted_qwen3(bpe_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed-0 model taught to answer TOOL_QUESTION (with ADD_TOOL) by calling ``add``."""
    tok = load_tokenizer(bpe_qwen3)
    prompt = chat_prompt_ids(tok, TOOL_QUESTION, [ADD_TOOL])
    answer = list(tok(TOOL_ANSWER, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids("<|im_end|>")]
    return teach_completions(bpe_qwen3, tmp_path_factory.mktemp("models") / "scripted", [(prompt, answer)])


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random Qwen3-VL with the real Qwen3 tokenizer."""
    return build_tiny_model("qwen3_vl", tmp_path_factory.mktemp("models") / "qwen3-vl", seed=0)


def start_engine(model: Path, *extra: str, api_key: str | None = API_KEY) -> EmbeddedEngineProcess:
    engine = EmbeddedEngineProcess(model, api_key=api_key, threads=1, extra_args=list(extra))
    engine.start()
    return engine


@pytest.fixture(scope="session")
def text_engine(scripted_qwen3: Path) -> Iterator[EmbeddedEngineProcess]:
    engine = start_engine(scripted_qwen3)
    yield engine
    engine.stop()


@pytest.fixture
def engine(text_engine: EmbeddedEngineProcess, scripted_qwen3: Path) -> Iterator[EmbeddedEngineProcess]:
    """The session's text engine; its own weights and version are put back after every test
    (for the tests that update weights)."""
    yield text_engine
    asyncio.run(_put_back(text_engine.url, scripted_qwen3))


async def _put_back(url: str, path: Path) -> None:
    from relax_gym.protocol import EngineClient, UpdateWeightsFromDiskRequest

    async with EngineClient(url, api_key=API_KEY) as client:
        await client.continue_generation()
        await client.update_weights_from_disk(
            UpdateWeightsFromDiskRequest(model_path=str(path), weight_version="default", abort_all_requests=True)
        )


async def server_info(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{url}/get_server_info")).json()


async def wait_for_tokens(url: str, at_least: int, timeout_s: float = 30.0) -> None:
    """Wait until the engine has generated ``at_least`` more tokens than now."""
    start = (await server_info(url))["generated_tokens"]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await server_info(url))["generated_tokens"] < start + at_least:
        assert asyncio.get_running_loop().time() < deadline, "engine made no progress"
        await asyncio.sleep(0.05)


def random_image(seed: int, size: tuple[int, int] = (64, 48)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def image_b64(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")
