"""GenRM end to end against the embedded engine: a tiny Qwen3 taught two verdicts serves as the
judge over both routes (OpenAI chat and SGLang /generate with the chat template applied
locally), exercising the full request -> generation -> verdict-parsing path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relax_gym.formatting import format_messages
from relax_gym.rewards import GenRMClient, RewardInput
from relax_gym.rewards.judge_templates import get_template

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # builds and teaches a tiny judge model (~15-35 s)

from relax_gym.trainer.engines.launch import EmbeddedEngineProcess  # noqa: E402
from relax_gym.trainer.models import build_tiny_model  # noqa: E402
from tests.scripted_model import teach_completions  # noqa: E402

API_KEY = "judge-key"
RIGHT = RewardInput.from_text("What is the capital of France?", "Paris", label="Paris")
WRONG = RewardInput.from_text("What is the capital of France?", "Lyon", label="Paris")


def _judge_prompt_ids(tok, client: GenRMClient, sample: RewardInput) -> list[int]:
    messages = client.build_messages(get_template("reference"), sample, reference=str(sample.label))
    text = tok.apply_chat_template(format_messages(messages, "openai"), add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def judge_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedEngineProcess, Path]]:
    from transformers import AutoTokenizer

    base = build_tiny_model("qwen3", tmp_path_factory.mktemp("judge") / "base", tokenizer="tiny-bpe", seed=3)
    tok = AutoTokenizer.from_pretrained(str(base))
    probe = GenRMClient({"base_url": "http://127.0.0.1:1"})
    end = [tok.convert_tokens_to_ids("<|im_end|>")]
    examples = [
        (_judge_prompt_ids(tok, probe, RIGHT), list(tok("VERDICT: CORRECT", add_special_tokens=False)["input_ids"]) + end),
        (_judge_prompt_ids(tok, probe, WRONG), list(tok("VERDICT: INCORRECT", add_special_tokens=False)["input_ids"]) + end),
    ]
    judge = teach_completions(base, tmp_path_factory.mktemp("judge") / "taught", examples)
    engine = EmbeddedEngineProcess(judge, api_key=API_KEY, threads=1)
    engine.start()
    yield engine, judge
    engine.stop()


@pytest.mark.parametrize("api", ["openai", "sglang"])
async def test_genrm_scores_through_the_embedded_engine(judge_engine, api: str) -> None:
    engine, model_path = judge_engine
    config = {
        "base_url": engine.url, "api": api, "api_key": API_KEY, "max_tokens": 40,
        "render_prompt": f"hf:{model_path}" if api == "sglang" else None,
    }
    async with GenRMClient(config, seed=0) as client:
        results = await client.score_batch([RIGHT, WRONG], "reference")
        assert [r.total for r in results] == [1.0, 0.0], [r.details["genrm"].get("judge_text") for r in results]
        assert all(not r.failed for r in results)
        assert results[0].details["genrm"]["judge_text"].strip().startswith("VERDICT: CORRECT")
        again = await client.score(RIGHT, "reference")  # the same prompt: served from the cache
        assert again.total == 1.0 and again.details["genrm"]["cached"] is True
        assert client.stats.requests == 2 and client.stats.retries == 0


async def test_genrm_truncated_verdict_is_a_recorded_failure(judge_engine) -> None:
    """A judge cut off by max_tokens ("VERDICT:") is an unparseable verdict: a failure, not 0."""
    engine, _ = judge_engine
    config = {"base_url": engine.url, "api": "openai", "api_key": API_KEY, "max_retries": 0, "max_tokens": 3}
    async with GenRMClient(config, seed=0) as client:
        result = (await client.score_batch([WRONG]))[0]
        assert client.stats.failures == {"unparseable": 1}
    assert result.failed and result.total is None and "unparseable" in (result.error or "")
