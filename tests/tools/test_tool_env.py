"""ToolEnv: the oracle episode with three tools (one returning an image), error handling,
budget, answer tools, env-provided tools, parallelism, truncation, async, determinism."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from PIL import Image
from relax_gym.tools import (
    SandboxPool,
    ToolContext,
    ToolEnv,
    ToolError,
    calculator,
    finish,
    get_parser,
    make_python_tool,
    search,
    submit_answer,
    tool,
    zoom,
)

import relax_gym
from relax_gym import EpisodeGuard, check_env
from relax_gym.types import Action, ImagePart, Message, Observation, TextPart, ToolCall

from .toy_envs import CounterEnv, GalleryEnv, count_dark_blobs

HERMES = get_parser("hermes")


def gallery(**kwargs: Any) -> EpisodeGuard:
    return EpisodeGuard(ToolEnv(GalleryEnv(), tools=[calculator, zoom, search], **kwargs))


def call(name: str, **arguments: Any) -> str:
    return HERMES.render([ToolCall(name, arguments)])


def texts(obs: Observation) -> list[str]:
    return [m.text for m in obs.messages]


# ------------------------------------------------------------------------------------------------
# the acceptance episode
# ------------------------------------------------------------------------------------------------
def test_oracle_episode_uses_three_tools_one_returning_an_image() -> None:
    env = gallery()
    obs, info = env.reset(seed=11)
    inner: GalleryEnv = env.unwrapped  # type: ignore[assignment]
    assert [t.name for t in obs.tools] == ["calculator", "zoom", "search"]
    assert "[image id: gallery]" in obs.messages[0].text  # the model is told the image's id
    seen: list[Observation] = []
    for action in env.oracle():
        obs, reward, terminated, truncated, info = env.step(action)
        seen.append(obs)
        if terminated or truncated:
            break
    assert terminated and not truncated and reward == 1.0 and info["success"] is True
    counts = info["tools"]
    assert counts["per_tool"] == {n: {"calls": 1, "errors": 0} for n in ("calculator", "zoom", "search")}
    assert (counts["tool_calls"], counts["tool_errors"], counts["parse_errors"]) == (3, 0, 0)
    assert counts["budget_left"] == 8 - 3 and counts["tool_turns"] == 3

    search_msg, zoom_msg, calc_msg = (o.messages[0] for o in seen[:3])
    assert (search_msg.role, search_msg.name, search_msg.tool_call_id) == ("tool", "search", "call_0_0")
    hits = json.loads(search_msg.text)
    assert hits[0]["id"] == f"doc-{inner.color}" and str(inner.multiplier) in hits[0]["text"]

    assert (zoom_msg.name, zoom_msg.tool_call_id) == ("zoom", "call_1_0")
    (zoomed,) = [p for p in zoom_msg.content if isinstance(p, ImagePart)]
    assert zoomed.id == "img_1" and zoomed.image.size == (inner.size, inner.size)  # 2x the quarter
    assert "[image id: img_1, 128x128]" in zoom_msg.text
    assert count_dark_blobs(zoomed.image) == inner.dots  # the zoom shows the right region

    assert (calc_msg.name, calc_msg.text) == ("calculator", str(inner.dots * inner.multiplier))
    assert seen[-1].messages == [] and seen[-1].tools == []


def test_check_env_passes_for_tool_envs() -> None:
    report = check_env(gallery(), raise_on_failure=False)
    assert report.passed, str(report)
    report = check_env(EpisodeGuard(ToolEnv(CounterEnv(), tools=[submit_answer])), raise_on_failure=False)
    assert report.passed, str(report)


def test_made_through_the_registry() -> None:
    relax_gym.register(
        "tooltest/Gallery-v0",
        entry_point=lambda **kw: ToolEnv(GalleryEnv(**kw), tools=[calculator, zoom, search], max_tool_calls=4),
    )
    try:
        env = relax_gym.make("tooltest/Gallery-v0", size=64)
        assert env.max_turns == GalleryEnv.max_turns + 4 + 1
        assert "tools" in env.tags and env.modalities == ("text", "image")
        assert check_env(env, raise_on_failure=False).passed
    finally:
        relax_gym.deregister("tooltest/Gallery-v0")


# ------------------------------------------------------------------------------------------------
# errors become messages
# ------------------------------------------------------------------------------------------------
def test_malformed_unknown_bad_arguments_and_failing_tools() -> None:
    env = gallery()
    env.reset(seed=0)
    text = (
        "<think>let me try several things</think>"
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1",}}</tool_call>'
        + call("zom", image_id="gallery", bbox=[0, 0, 9, 9])
        + call("zoom", image_id="gallery", bbox=[0, 0, 9])
        + call("zoom", image_id="nope", bbox=[0, 0, 9, 9])
        + call("calculator", expression="2*21")
    )
    obs, reward, terminated, truncated, info = env.step(text)
    assert not (terminated or truncated) and reward == 0.0 and info["success"] is False
    msgs = obs.messages
    assert [m.tool_call_id for m in msgs] == [f"call_0_{i}" for i in range(5)]
    assert all(m.role == "tool" for m in msgs)
    assert msgs[0].text.startswith("Error: could not parse your tool call: malformed JSON") and msgs[0].name is None
    assert msgs[1].text == "Error: unknown tool 'zom'. Did you mean 'zoom'? Available tools: calculator, zoom, search."
    assert msgs[2].text.startswith("Error: invalid arguments for tool 'zoom': argument 'bbox'")
    assert '"bbox": {' in msgs[2].text  # the schema is repeated for the model
    assert msgs[3].text == "Error: no image with id 'nope' in this conversation (image ids: gallery)"
    assert msgs[4].text == "42" and msgs[4].name == "calculator"
    counts = info["tools"]
    assert counts["parse_errors"] == 1 and counts["tool_errors"] == 3 and counts["tool_calls"] == 3
    assert counts["per_tool"]["zoom"] == {"calls": 2, "errors": 2}
    assert counts["budget_left"] == 8 - 5  # every attempt counts


def test_error_penalty_is_applied_and_declared() -> None:
    env = gallery(error_penalty=0.25)
    assert env.reward_range[0] == -0.25 * 8
    env.reset(seed=0)
    _, reward, _, _, info = env.step(call("nope") + call("calculator", expression="1"))
    assert reward == -0.25 and info["reward_components"] == {"tool_penalty": -0.25}


def test_preparsed_actions_are_used_as_they_are() -> None:
    env = gallery(parser="openai")
    env.reset(seed=0)
    action = Action(
        text="",
        tool_calls=[ToolCall("calculator", {"expression": "6*7"})],  # no id: one is assigned
        parse_errors=["call_0_1: malformed JSON in arguments"],
    )
    obs, *_ = env.step(action)
    assert [(m.tool_call_id, m.text) for m in obs.messages] == [
        ("call_0_0", "42"),
        ("call_0_1", "Error: could not parse your tool call: malformed JSON in arguments"),
    ]
    message = {"content": None, "tool_calls": [{"id": "srv_1", "type": "function",
                                                "function": {"name": "calculator", "arguments": '{"expression": "2"}'}}]}
    obs, *_ = env.step(get_parser("openai").parse(message, turn=1))
    assert obs.messages[0].tool_call_id == "srv_1"  # the server's id answers its call


def test_qwen3_coder_parser_in_a_tool_env() -> None:
    env = gallery(parser="qwen3_coder")
    env.reset(seed=2)
    text = "<tool_call>\n<function=zoom>\n<parameter=image_id>\ngallery\n</parameter>\n<parameter=bbox>\n[0, 0, 32, 32]\n</parameter>\n</function>\n</tool_call>"
    obs, *_ = env.step(text)
    assert any(isinstance(p, ImagePart) and p.image.size == (64, 64) for p in obs.messages[0].content)


# ------------------------------------------------------------------------------------------------
# budget and turn limits
# ------------------------------------------------------------------------------------------------
def test_budget_spent_then_answer_is_still_scored() -> None:
    env = gallery(max_tool_calls=2)
    env.reset(seed=4)
    inner: GalleryEnv = env.unwrapped  # type: ignore[assignment]
    obs, _, _, _, info = env.step(call("calculator", expression="1") * 1 + call("calculator", expression="2") + call("calculator", expression="3"))
    assert texts(obs)[:2] == ["1", "2"]
    assert texts(obs)[2].startswith("Error: tool budget exhausted (max_tool_calls=2): this call was not run")
    assert "You have used all 2 tool calls" in texts(obs)[2]
    assert obs.tools == [] and info["tools"]["budget_left"] == 0
    _, reward, terminated, _, info = env.step(f"\\boxed{{{inner.dots * inner.multiplier}}}")
    assert terminated and reward == 1.0 and info["success"]


def test_tool_calls_after_the_budget_end_the_episode() -> None:
    env = gallery(max_tool_calls=1)
    env.reset(seed=4)
    env.step(call("calculator", expression="1"))
    obs, reward, terminated, truncated, info = env.step(call("calculator", expression="2"))
    assert truncated and not terminated and reward == 0.0 and info["truncation"] == "tool_budget"
    assert "the episode ends" in obs.messages[0].text and obs.tools == []
    with pytest.raises(relax_gym.EpisodeEndedError):
        env.step("anything")


def test_junk_forever_ends_within_max_turns() -> None:
    env = gallery(max_tool_calls=3)
    assert env.max_turns == 1 + 3 + 1
    env.reset(seed=0)
    for turn in range(env.max_turns):
        _, _, terminated, truncated, _ = env.step("<tool_call>{oops</tool_call>")
        if terminated or truncated:
            break
    assert truncated and turn + 1 <= env.max_turns


def test_max_calls_per_turn() -> None:
    env = gallery(max_calls_per_turn=1)
    env.reset(seed=0)
    obs, *_ , info = env.step(call("calculator", expression="1") + call("calculator", expression="2"))
    assert texts(obs)[0] == "1" and "too many tool calls in one turn: at most 1" in texts(obs)[1]
    assert info["tools"]["parse_errors"] == 1


# ------------------------------------------------------------------------------------------------
# answers
# ------------------------------------------------------------------------------------------------
def test_env_provided_tools_and_submit_answer() -> None:
    env = EpisodeGuard(ToolEnv(CounterEnv(), tools=[submit_answer]))
    obs, info = env.reset(seed=5)
    inner: CounterEnv = env.unwrapped  # type: ignore[assignment]
    assert [t.name for t in obs.tools] == ["submit_answer", "reveal"]
    obs, *_ = env.step(Action(tool_calls=[ToolCall("reveal", {})]))
    assert obs.messages[0].text == str(inner.secret) and inner.reveals == 1
    obs, reward, terminated, _, info = env.step(Action(tool_calls=[ToolCall("submit_answer", {"answer": inner.secret})]))
    assert terminated and reward == 1.0 and info["success"]
    assert obs.messages[0].text == "answer submitted" and obs.messages[0].tool_call_id == "call_1_0"


def test_wrong_submit_answer_lets_a_multi_turn_env_continue() -> None:
    env = EpisodeGuard(ToolEnv(CounterEnv(), tools=[submit_answer]))
    env.reset(seed=5)
    obs, reward, terminated, truncated, _ = env.step(call("submit_answer", answer="1"))
    assert not (terminated or truncated) and reward == 0.0
    assert texts(obs) == ["answer submitted", "Wrong; try again."]  # the inner env's reply follows
    assert [t.name for t in obs.tools] == ["submit_answer", "reveal"]
    _, _, terminated, truncated, info = env.step("still wrong")
    assert truncated and info["truncation"] == "max_turns"  # the inner env's 2 answers are spent


def test_finish_ends_the_episode_and_skips_other_calls() -> None:
    env = EpisodeGuard(ToolEnv(CounterEnv(), tools=[submit_answer, finish]))
    env.reset(seed=5)
    obs, reward, terminated, truncated, info = env.step(call("reveal") + call("finish", answer="0"))
    assert terminated and not truncated and reward == 0.0 and not info["success"]
    assert info["tools"]["finished"] is True and info["tools"]["skipped_calls"] == 1
    assert env.unwrapped.reveals == 0  # type: ignore[attr-defined]
    assert texts(obs)[:2] == ["not run: the answer in this turn ended the tool phase", "finished"]


def test_bad_answer_call_costs_budget() -> None:
    env = EpisodeGuard(ToolEnv(CounterEnv(), tools=[submit_answer], max_tool_calls=1))
    env.reset(seed=5)
    obs, _, _, truncated, info = env.step(call("submit_answer"))
    assert not truncated and "missing required argument 'answer'" in obs.messages[0].text
    assert info["tools"]["budget_left"] == 0
    _, _, _, truncated, info = env.step(call("submit_answer"))
    assert truncated and info["truncation"] == "tool_budget"


# ------------------------------------------------------------------------------------------------
# execution
# ------------------------------------------------------------------------------------------------
def test_calls_of_a_turn_run_in_parallel_when_allowed() -> None:
    barrier = threading.Barrier(2, timeout=2.0)

    @tool
    def meet(who: str) -> str:
        """Wait until the other call arrives."""
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            raise ToolError(f"{who} waited alone") from None
        return f"{who} met"

    two = call("meet", who="a") + call("meet", who="b")
    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[meet], parallel=True))
    env.reset(seed=0)
    obs, *_ = env.step(two)
    assert texts(obs) == ["a met", "b met"]  # both were waiting at the same time

    barrier.reset()
    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[meet], parallel=False))
    env.reset(seed=0)
    obs, *_ = env.step(two)
    assert texts(obs)[0] == "Error: a waited alone"  # sequential: the first never met the second


def test_slow_tools_time_out() -> None:
    @tool
    async def slow() -> str:
        """Take forever."""
        await asyncio.sleep(30)
        return "done"

    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[slow], tool_timeout_s=0.2))
    env.reset(seed=0)
    obs, *_ , info = env.step(call("slow"))
    assert texts(obs) == ["Error: tool 'slow' did not finish within 0.2 s"]
    assert info["tools"]["per_tool"]["slow"] == {"calls": 1, "errors": 1}


def test_long_results_are_truncated() -> None:
    @tool
    def chatty(n: int) -> str:
        """Say a lot."""
        return "".join(str(i % 10) for i in range(n))

    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[chatty], max_result_chars=1000))
    env.reset(seed=0)
    obs, *_ , info = env.step(call("chatty", n=20_000))
    text = texts(obs)[0]
    assert len(text) < 1100 and "characters truncated" in text
    assert text.startswith("0123456789") and text.endswith("9")
    assert info["tools"]["truncated_results"] == 1


def test_media_ids_and_labels_for_images_without_ids() -> None:
    class Plain(GalleryEnv):
        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            obs, info = super().reset(seed=seed, options=options)
            msg = obs.messages[0]
            parts = [ImagePart(p.image) if isinstance(p, ImagePart) else p for p in msg.content]
            return Observation([Message.user(*parts)]), info

    @tool
    def tile(image_id: str, ctx: ToolContext) -> list[Any]:
        """Return two tiles of an image."""
        img = ctx.image(image_id).image
        return ["tiles:", img.crop((0, 0, 8, 8)), ImagePart(img.crop((8, 8, 16, 16)), id="mine")]

    env = EpisodeGuard(ToolEnv(Plain(), tools=[tile]))
    obs, _ = env.reset(seed=0)
    parts = obs.messages[0].content
    assert isinstance(parts[-1], ImagePart) and parts[-1].id == "img_1"
    assert parts[-2] == TextPart("[image id: img_1]")
    obs, *_ = env.step(call("tile", image_id="img_1"))
    ids = [p.id for p in obs.messages[0].content if isinstance(p, ImagePart)]
    assert ids == ["img_2", "mine"]
    obs, *_ = env.step(call("tile", image_id="mine"))  # a tool result can be referenced again
    assert [p.id for p in obs.messages[0].content if isinstance(p, ImagePart)] == ["img_3", "img_4"]


def test_tool_modalities_are_declared() -> None:
    class TextOnly(CounterEnv):
        modalities = ("text",)

    env = ToolEnv(TextOnly(), tools=[zoom, calculator])
    assert env.modalities == ("text", "image")


def test_stateful_python_session_lives_for_one_episode(pool: SandboxPool) -> None:
    py = make_python_tool(stateful=True, pool=pool, timeout_s=5)
    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[py]))
    env.reset(seed=0)
    env.step(call("python", code="x = 41"))
    obs, *_ = env.step(call("python", code="print(x + 1)"))
    assert texts(obs) == ["42"]
    env.reset(seed=1)  # the old session is closed; a new episode starts clean
    obs, *_ = env.step(call("python", code="print(x)"))
    assert "NameError" in texts(obs)[0]
    env.close()


def test_stateless_python_tool(pool: SandboxPool) -> None:
    py = make_python_tool(pool=pool, timeout_s=2)
    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[py]))
    env.reset(seed=0)
    obs, *_ = env.step(call("python", code="import time\nprint('a')\ntime.sleep(10)"))
    assert texts(obs)[0].startswith("a\n[timed out after 2.")


# ------------------------------------------------------------------------------------------------
# async and determinism
# ------------------------------------------------------------------------------------------------
def _episode(env: EpisodeGuard, seed: int) -> list[Any]:
    out: list[Any] = []
    obs, info = env.reset(seed=seed)
    out.append((obs, json.dumps(info, sort_keys=True)))
    for action in env.oracle():
        obs, reward, terminated, truncated, info = env.step(action)
        info = {k: v for k, v in info.items() if k != "timing"}
        out.append((obs, reward, terminated, truncated, json.dumps(info, sort_keys=True)))
        if terminated or truncated:
            break
    return out


def test_same_seed_same_episode() -> None:
    a, b = _episode(gallery(), 21), _episode(gallery(), 21)
    assert a == b
    assert _episode(gallery(), 22) != a


async def test_astep_matches_step() -> None:
    sync_env, async_env = gallery(), ToolEnv(GalleryEnv(), tools=[calculator, zoom, search])
    sync_obs = [o[0] for o in _episode(sync_env, 3)]
    obs, _ = await async_env.areset(seed=3)
    async_obs = [obs]
    for action in async_env.oracle():
        obs, reward, terminated, _, info = await async_env.astep(action)
        async_obs.append(obs)
        if terminated:
            break
    assert async_obs == sync_obs and reward == 1.0
    assert "timing" not in info or set(info["timing"]) <= {"tools_s", "per_call_s"}


def test_info_keys() -> None:
    env = gallery()
    env.reset(seed=0)
    _, _, _, _, info = env.step(call("calculator", expression="1") + call("search", query="gallery"))
    assert set(info["timing"]) == {"tools_s", "per_call_s"} and set(info["timing"]["per_call_s"]) == {"call_0_0", "call_0_1"}
    assert all(isinstance(v, float) for v in info["reward_components"].values())
    assert "latency" not in json.dumps(info["tools"])


def test_image_part_is_a_pil_image() -> None:
    env = gallery()
    obs, _ = env.reset(seed=0)
    assert isinstance(obs.parts(ImagePart)[0].image, Image.Image)


def test_penalty_is_capped_to_the_declared_range() -> None:
    env = gallery(error_penalty=0.1, max_tool_calls=2)
    env.reset(seed=0)
    _, reward, *_ = env.step("<tool_call>{bad</tool_call>" * 10)
    assert reward == pytest.approx(-0.2) and env.reward_range[0] == pytest.approx(-0.2)


def test_a_hung_sync_tool_does_not_hold_up_the_step() -> None:
    import time

    release = threading.Event()

    @tool
    def stuck() -> str:
        """Never come back (until the test lets it)."""
        release.wait(30)
        return "late"

    env = EpisodeGuard(ToolEnv(GalleryEnv(), tools=[stuck], tool_timeout_s=0.2))
    env.reset(seed=0)
    start = time.monotonic()
    obs, *_ = env.step(call("stuck"))
    assert time.monotonic() - start < 5
    assert texts(obs) == ["Error: tool 'stuck' did not finish within 0.2 s"]
    release.set()


def test_repeated_server_ids_keep_their_own_results() -> None:
    env = gallery(parser="openai")
    env.reset(seed=0)
    action = Action(tool_calls=[ToolCall("calculator", {"expression": "1+1"}, "dup"), ToolCall("calculator", {"expression": "2+2"}, "dup")])
    obs, *_ = env.step(action)
    assert [(m.tool_call_id, m.text) for m in obs.messages] == [("dup", "2"), ("dup", "4")]
