"""One episode, two paths, the same tokens: ``relax-gym eval``'s ``sglang:`` agent and the rollout
manager that builds training samples send the engine identical prompt token ids.

The model is a tiny Qwen3 (offline BPE, the real Qwen3 chat template) taught to answer the first
prompt of a shipped tool env (``relax/CalcArithmetic-v0``) with the oracle's calculator call, so
the episode has a real tool call, a real tool result and a second generation from the context that
holds them. Thinking is off, so the template puts an empty ``<think>`` block in every generation
prompt: an eval path that re-rendered the history would drop it from the earlier turn and the
second prompts would differ. Every ``/generate`` request of both runs is recorded at the client.

Slow-marked: building and teaching the model and booting its engine take about 25 s of CPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "relax/CalcArithmetic-v0"
MAX_NEW = 48  # the taught tool call (40 tokens) fits; the untaught second reply stops here at the latest


@pytest.fixture(scope="module")
def episode_seed() -> int:
    from relax_gym.registration import episode_seed

    return episode_seed(0, ENV, 0)  # the eval runner's seed for episode 0 of an env list


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, episode_seed: int) -> Path:
    """The tiny model taught to open the episode with the oracle's first tool call."""
    pytest.importorskip("transformers")
    import relax_gym
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.models import build_tiny_model
    from tests.scripted_model import teach_completions

    root = tmp_path_factory.mktemp("parity")
    base = build_tiny_model("qwen3", root / "base", tokenizer="tiny-bpe", seed=0)
    codec = ChatCodec.from_pretrained(base, template_kwargs={"enable_thinking": False})
    env = relax_gym.make(ENV)
    obs, _ = env.reset(seed=episode_seed)
    first, _ = codec.adapt_messages(env.format_observation(obs, "hf"))
    prompt = codec.prompt(first, [t.to_openai() for t in obs.tools]).ids
    call = next(iter(env.oracle()))
    answer = codec.encode(call if isinstance(call, str) else call.text) + codec.closing_glue[:1]
    assert len(answer) <= MAX_NEW
    return teach_completions(base, root / "taught", [(prompt, answer)])


@pytest.fixture(scope="module")
def engine(model: Path) -> Iterator[Any]:
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

    with EmbeddedEngineProcess(model, threads=1) as proc:
        yield proc


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The ``input_ids`` of every /generate request, in order (both paths use the core client)."""
    from relax_gym.protocol import EngineClient

    seen: list[list[int]] = []
    generate = EngineClient.generate

    async def recording(self: EngineClient, request: Any, **kw: Any) -> Any:
        seen.append(list(request.input_ids or []))
        return await generate(self, request, **kw)

    monkeypatch.setattr(EngineClient, "generate", recording)
    return seen


def _evaluate(engine: Any, model: Path, out: Path) -> Any:
    from relax_gym.leaderboards import AgentOptions, run_eval
    from relax_gym.leaderboards.records import read_records

    options = AgentOptions(model=str(model), max_tokens=MAX_NEW, temperature=0.0, thinking=False)
    result = asyncio.run(run_eval(f"sglang:{engine.url}", out, options=options, env_ids=[ENV], episodes=1,
                                  concurrency=1, progress=False))
    assert result.fatal is None
    (row,) = read_records(out / "episodes.jsonl")
    return row


def _train(engine: Any, model: Path, seed: int) -> Any:
    from relax_gym.chat import ChatCodec
    from relax_gym.trainer.rollout import EngineRouter, EpisodeSpec, RolloutConfig, RolloutManager

    codec = ChatCodec.from_pretrained(model, template_kwargs={"enable_thinking": False})

    async def go() -> Any:
        async with EngineRouter([engine.url]) as router:
            config = RolloutConfig(max_new_tokens=MAX_NEW, temperature=0.0, concurrency=1, group_size=1)
            return await RolloutManager(router, codec, config).generate([EpisodeSpec(ENV, seed=seed)])

    (traj,) = asyncio.run(go())
    return traj


@pytest.mark.slow
def test_eval_and_training_send_the_same_prompt_tokens(engine: Any, model: Path, episode_seed: int,
                                                        sent: list[list[int]], tmp_path: Path) -> None:
    row = _evaluate(engine, model, tmp_path / "eval")
    assert row.error is None and row.seed == episode_seed
    eval_prompts = list(sent)
    sent.clear()
    traj = _train(engine, model, episode_seed)
    assert traj.error is None and traj.turns[0].tool_calls[0].name == "calculator"
    train_prompts = list(sent)

    assert len(train_prompts) >= 2 and traj.messages[2].role == "tool"  # user, call, result, a second turn
    assert eval_prompts == train_prompts
    # the training sample is those prompts, grown append-only
    assert traj.token_ids[: len(train_prompts[-1])] == train_prompts[-1]
