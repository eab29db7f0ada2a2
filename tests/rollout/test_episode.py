"""Multi-turn tool episodes through a real embedded engine serving a tiny Qwen3 on 127.0.0.1:
exact token/mask structure, engine logprobs against a fresh forward pass, failures as stop
reasons, the think policies, partial rollouts across a weight update, and both schedulers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from relax_gym.chat import ChatCodec
from relax_gym.trainer.rollout import (
    EngineRouter,
    EpisodeSpec,
    RolloutConfig,
    RolloutManager,
    Trajectory,
    parse_weight_version,
)

from relax_gym.formatting import format_messages

from .envs import FixedToolEnv
from .forward import load_model, max_sampled_diff


@pytest.fixture(scope="module")
def model(tiny_qwen3: Path) -> Any:
    return load_model(tiny_qwen3)


def tool_specs(n: int, **env_kwargs: Any) -> list[EpisodeSpec]:
    return [EpisodeSpec("test/FixedTool", seed=s, env_factory=lambda: FixedToolEnv(**env_kwargs)) for s in range(n)]


async def run(engine: Any, codec: ChatCodec, specs: list[EpisodeSpec], *, run_id: str | None = None,
              **config: Any) -> tuple[list[Trajectory], RolloutManager]:
    async with EngineRouter([engine.url], health_interval_s=0.5) as router:
        manager = RolloutManager(router, codec, RolloutConfig(**{"max_new_tokens": 12, "group_size": 1, **config}),
                                 run_id=run_id)
        return await manager.generate(specs), manager


def assert_tool_structure(traj: Trajectory, codec: ChatCodec) -> None:
    """Mask 1 exactly on the sampled spans; before them exactly the rendered prompt; between
    them exactly the template glue and the delta of that turn's observation; nothing else."""
    traj.validate()
    spans = traj.sampled_spans()
    assert len(spans) == len(traj.turns) >= 1
    assistant_at = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
    assert len(assistant_at) == len(spans)

    def rendered(messages: list[Any]) -> list[dict[str, Any]]:
        return codec.adapt_messages(format_messages(messages, "hf"))[0]

    assert traj.prompt_length == spans[0][0]
    assert traj.token_ids[: traj.prompt_length] == codec.prompt(rendered(traj.messages[: assistant_at[0]]), traj.tools).ids
    for k, (start, end) in enumerate(spans):
        segment = traj.token_ids[start:end]
        assert len(segment) == traj.turns[k].num_sampled_tokens
        _, glue = codec.split_segment(segment)
        expected = list(glue)
        if k + 1 < len(spans):
            observation = traj.messages[assistant_at[k] + 1: assistant_at[k + 1]]
            expected += codec.observation_delta(rendered(observation), traj.tools).ids
        following = traj.token_ids[end: spans[k + 1][0] if k + 1 < len(spans) else len(traj)]
        assert following == expected, f"turn {k}: mask-0 tokens after the segment are not glue + delta"


async def test_tool_episodes_exact_tokens_and_logprobs(qwen3_engine: Any, codec: ChatCodec, model: Any) -> None:
    trajs, manager = await run(qwen3_engine, codec, tool_specs(2, turns=3), run_id="7-step3", group_size=2,
                               concurrency=4)
    assert [(t.group_id, t.sample_index) for t in trajs] == [
        ("test/FixedTool#0", 0), ("test/FixedTool#0", 1), ("test/FixedTool#1", 0), ("test/FixedTool#1", 1)]
    assert sorted(t.episode_id for t in trajs) == ["7-step3-0", "7-step3-1", "7-step3-2", "7-step3-3"]
    worst = 0.0
    for traj in trajs:
        assert traj.stop_reason == "env_done" and traj.error is None
        assert len(traj.turns) == 3 and traj.trainable
        assert_tool_structure(traj, codec)
        assert traj.drift.kind == "none"
        assert len(traj.weight_version_mix) == 1  # one weight version served the whole episode
        assert all(len(t.engine_ids) == 1 for t in traj.turns)
        assert [t.tool_latency_s for t in traj.turns[:2]] == [0.001, 0.001]
        assert traj.turns[0].tool_calls[0].name == "calculator"
        assert traj.reward_components["turns"] == 3.0
        worst = max(worst, max_sampled_diff(model, traj))
    print(f"\nmax |engine logprob - fresh forward logprob| over sampled tokens (fp32): {worst:.2e}")
    assert worst < 1e-4
    snap = manager.metrics.snapshot()
    assert snap["episodes_finished"] == 4 and snap["stop_reasons/env_done"] == 4 and snap["turns"] == 12
    assert snap["unexpected_drift"] == 0 and snap["engine_prompt_mismatch"] == 0


async def test_failures_become_stop_reasons(qwen3_engine: Any, codec: ChatCodec) -> None:
    def broken_factory() -> FixedToolEnv:
        raise OSError("no such dataset")

    specs = [*tool_specs(1, turns=3, fail_at=2), EpisodeSpec("test/Broken", seed=0, env_factory=broken_factory),
             *tool_specs(1, turns=2)]
    trajs, manager = await run(qwen3_engine, codec, specs)
    failing, broken, healthy = trajs
    assert failing.stop_reason == "env_error" and "broke on purpose" in (failing.error or "")
    assert len(failing.turns) == 1 and failing.num_sampled_tokens > 0  # the turn's tokens are kept
    assert len(failing.sampled_spans()) == 2 and not failing.trainable
    assert broken.stop_reason == "env_error" and "no such dataset" in (broken.error or "") and len(broken) == 0
    assert healthy.stop_reason == "env_done" and healthy.trainable
    assert manager.metrics.env_errors == 2
    # an engine that refuses the request (HTTP 400): a clear stop reason, counted, no crash
    bad, manager = await run(qwen3_engine, codec, tool_specs(2, turns=2), stop_token_ids=[10**9])
    assert [t.stop_reason for t in bad] == ["engine_error", "engine_error"]
    assert "HTTP 400" in (bad[0].error or "") and manager.metrics.engine_errors["EngineError"] == 2
    # a trajectory budget: stops with max_tokens and never exceeds it
    limit = healthy.prompt_length + 50  # 8 turns need > 8 * (1 sampled + glue + ~13 delta) tokens
    short, _ = await run(qwen3_engine, codec, tool_specs(1, turns=8), max_total_tokens=limit)
    assert short[0].stop_reason == "max_tokens" and len(short[0]) <= limit and len(short[0].turns) < 8


async def test_think_policies(qwen3_engine: Any, tiny_qwen3: Path) -> None:
    """With enable_thinking=False the generation prompt holds an empty think block that Qwen3's
    template drops from earlier turns: keep flags it as expected drift, split re-renders."""
    codec = ChatCodec.from_pretrained(tiny_qwen3, template_kwargs={"enable_thinking": False})
    assert codec.assistant_prefix == "<think>\n\n</think>\n\n"
    specs = tool_specs(1, turns=3, user_turn_at=1)
    (keep,), manager = await run(qwen3_engine, codec, specs, think_policy="keep", max_new_tokens=6)
    assert keep.stop_reason == "env_done" and keep.num_parts == 1
    assert (keep.drift.kind, keep.drift.expected) == ("think_dropped", True) and keep.trainable
    assert manager.metrics.drift["think_dropped"] == 1
    parts, manager = await run(qwen3_engine, codec, specs, think_policy="split", max_new_tokens=6)
    assert [p.part for p in parts] == [0, 1, 2] and all(p.num_parts == 3 for p in parts)
    assert {p.episode_id for p in parts} == {parts[0].episode_id}
    for p in parts:
        p.validate()
        assert p.drift.kind in ("none", "unchecked") and p.trainable
        assert len(p.turns) == 1 and len(p.sampled_spans()) == 1
    # each later part starts from the template's own render of the history (mask 0)
    assert parts[1].prompt_length > parts[0].prompt_length
    assert manager.metrics.samples == 3 and manager.metrics.unexpected_drift == 0


async def test_partial_rollouts_resume_across_a_weight_update(qwen3_engine: Any, codec: ChatCodec,
                                                              tiny_qwen3: Path) -> None:
    async with EngineRouter([qwen3_engine.url], health_interval_s=0.5) as router, httpx.AsyncClient() as http:
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=120, concurrency=4, group_size=1))
        old = parse_weight_version((await router.engines[0].client.model_info()).weight_version)

        async def generated() -> int:
            return int((await http.get(qwen3_engine.url + "/get_server_info")).json()["generated_tokens"])

        start = await generated()
        task = asyncio.create_task(manager.generate(tool_specs(4, turns=1)))
        for _ in range(600):  # bounded: until every episode is a few tokens into its segment
            if await generated() - start >= 4 * 8:
                break
            await asyncio.sleep(0.02)
        assert not task.done()
        await manager.update_weights(str(tiny_qwen3), old + 1)
        trajs = await asyncio.wait_for(task, 120)
        assert router.weight_version == str(old + 1)
        assert (await router.engines[0].client.model_info()).weight_version == str(old + 1)
    assert all(t.stop_reason == "env_done" for t in trajs)
    mixed = [t for t in trajs if set(t.weight_version_mix) == {old, old + 1}]
    assert mixed, [t.weight_version_mix for t in trajs]
    for t in mixed:
        t.validate()
        assert t.turns[0].resumes >= 1 and t.turns[0].weight_versions == [old, old + 1]
        versions = [v for v, m in zip(t.weight_versions, t.loss_mask) if m]
        assert versions == sorted(versions)  # old tokens first, then the new version's
    assert manager.metrics.resumes >= len(mixed)


async def test_turn_sync_baseline_and_stream(qwen3_engine: Any, codec: ChatCodec) -> None:
    trajs, _ = await run(qwen3_engine, codec, tool_specs(3, turns=2), scheduling="turn_sync", concurrency=2)
    assert [t.seed for t in trajs] == [0, 1, 2] and all(t.stop_reason == "env_done" for t in trajs)
    async with EngineRouter([qwen3_engine.url]) as router:
        manager = RolloutManager(router, codec, RolloutConfig(max_new_tokens=8, concurrency=3, group_size=1))
        seen = [t async for t in manager.stream(tool_specs(3, turns=1))]
    assert sorted(t.seed for t in seen) == [0, 1, 2]  # type: ignore[type-var]


async def test_registered_tool_env(qwen3_engine: Any, codec: ChatCodec) -> None:
    """A shipped tool env (ToolEnv + calculator) by id: tools in the prompt, ToolEnv's own
    parsing and timing, and the same exact structure."""
    specs = [EpisodeSpec("relax/CalcArithmetic-v0", seed=s) for s in (0, 1)]
    trajs, manager = await run(qwen3_engine, codec, specs, max_new_tokens=10)
    for traj in trajs:
        assert [t["function"]["name"] for t in traj.tools] == ["calculator", "submit_answer"], (traj.stop_reason, traj.error)
        assert '"name": "calculator"' in codec.decode(traj.token_ids[: traj.prompt_length])
        assert traj.stop_reason in ("env_done", "max_turns", "env_truncated") and traj.error is None
        assert_tool_structure(traj, codec)
        assert traj.drift.kind == "none"
    assert manager.metrics.env_errors == 0
