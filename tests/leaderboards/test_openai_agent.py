"""The ``openai:`` agent over real HTTP against a scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from relax_gym.leaderboards import AgentOptions, FatalAgentError, run_eval
from relax_gym.leaderboards.agents.openai_agent import api_base, tool_calls_from_reply
from relax_gym.leaderboards.records import read_records

from relax_gym.protocol import ChatToolCall, ChatToolCallFunction

from .scripted_server import ScriptedServer


def _run(spec: str, out: Path, options: AgentOptions, **kw: Any):
    kw.setdefault("progress", False)
    return asyncio.run(run_eval(spec, out, options=options, **kw))


def test_native_tools_media_parts_and_options_go_over_the_wire(tmp_path: Path) -> None:
    opts = AgentOptions(model="scripted", temperature=0.7, top_k=20, max_tokens=64, thinking=False, seed=3)
    with ScriptedServer() as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", opts, suite="lbtest/mini-v0", concurrency=4)
    s = res.summary
    assert s["complete"] and res.fatal is None
    # the server can only answer from the pixels and the tool message it received
    for env_id, e in s["results"]["envs"].items():
        assert e["success"]["value"] == 1.0, env_id
    reqs = server.requests
    assert all(
        r["model"] == "scripted"
        and r["temperature"] == 0.7
        and r["top_k"] == 20
        and r["max_tokens"] == 64
        and r["chat_template_kwargs"] == {"enable_thinking": False}
        for r in reqs
    )
    assert len({r["seed"] for r in reqs}) == len(reqs)  # a distinct sampling seed per episode turn
    image_reqs = [r for r in reqs if isinstance(r["messages"][-1]["content"], list)]
    assert len(image_reqs) == 6
    assert all(
        p["image_url"]["url"].startswith("data:image/png;base64,")
        for r in image_reqs
        for p in r["messages"][-1]["content"]
        if p["type"] == "image_url"
    )
    # tools: declared natively, called with structured tool_calls, answered by a tool message
    tool_reqs = [r for r in reqs if r.get("tools")]
    assert tool_reqs and tool_reqs[0]["tools"][0] == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Return the secret word.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
    second = next(r for r in tool_reqs if any(m["role"] == "tool" for m in r["messages"]))
    call = next(m for m in second["messages"] if m["role"] == "assistant")["tool_calls"][0]
    answer = next(m for m in second["messages"] if m["role"] == "tool")
    assert answer["tool_call_id"] == call["id"] and json.loads(call["function"]["arguments"]) == {"key": "secret"}
    rows = read_records(tmp_path / "r" / "episodes.jsonl")
    pictures = [r for r in rows if r.env_id == "lbtest/Picture-v0"]
    assert all(r.media_sent == {"image": 1} and r.prompt_tokens == 60 and r.completion_tokens == 3 for r in pictures)
    assert all(r.tool_calls == 1 and r.turns == 2 for r in rows if r.env_id == "lbtest/Lookup-v0")


def test_a_server_rejecting_images_stops_the_run_with_a_clear_error(tmp_path: Path) -> None:
    with ScriptedServer(mode="reject_images") as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", AgentOptions(), env_ids=["lbtest/Picture-v0"], episodes=3)
    assert res.fatal is not None
    assert "does not accept image input" in res.fatal and "image input is not supported" in res.fatal
    assert not res.summary["complete"] and res.summary["results"]["counts"]["finished"] == 0
    # summary.json says why the run stopped and which episodes a --resume still has to run
    saved = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert saved["run"]["stop_reason"] == res.fatal
    assert len(saved["run"]["missing_episodes"]) == 3
    assert {m["env_id"] for m in saved["run"]["missing_episodes"]} == {"lbtest/Picture-v0"}


def test_thinking_is_split_from_the_answer(tmp_path: Path) -> None:
    with ScriptedServer(mode="think") as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", AgentOptions(), env_ids=["lbtest/Pick-v0"], episodes=2)
    assert res.summary["results"]["envs"]["lbtest/Pick-v0"]["success"]["value"] == 1.0
    row = read_records(tmp_path / "r" / "episodes.jsonl")[0]
    doc = json.loads((tmp_path / "r" / row.transcript).read_text())
    assistant = next(m for m in doc["messages"] if m["role"] == "assistant")
    assert assistant["reasoning"] == "easy one" and assistant["content"][0]["text"] == row_answer(doc)


def row_answer(doc: dict[str, Any]) -> str:
    prompt = doc["messages"][0]["content"][0]["text"]
    return prompt.rstrip(".").split()[-1]


def test_timeouts_are_episode_errors_and_the_run_goes_on(tmp_path: Path) -> None:
    with ScriptedServer(mode="slow") as server:
        res = _run(
            f"openai:{server.url}",
            tmp_path / "r",
            AgentOptions(timeout_s=0.3),
            env_ids=["lbtest/Pick-v0"],
            episodes=3,
            concurrency=3,
        )
    counts = res.summary["results"]["counts"]
    assert res.fatal is None and counts["errors"] == 3 and counts["error_types"] == {"agent": 3}
    assert all("timed out" in (r.error or "") for r in read_records(tmp_path / "r" / "episodes.jsonl"))


def test_unparseable_tool_arguments_are_parse_errors(tmp_path: Path) -> None:
    with ScriptedServer(mode="bad_args") as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", AgentOptions(), env_ids=["lbtest/Lookup-v0"], episodes=2)
    rows = read_records(tmp_path / "r" / "episodes.jsonl")
    assert all(r.parse_errors == 3 and r.tool_calls == 0 and not r.success for r in rows)
    assert res.summary["results"]["envs"]["lbtest/Lookup-v0"]["parse_errors"] == 6


def test_api_key_and_reachability_are_checked_before_any_episode(tmp_path: Path) -> None:
    with ScriptedServer(api_key="sekrit") as server:
        with pytest.raises(FatalAgentError, match="API key"):
            _run(f"openai:{server.url}", tmp_path / "a", AgentOptions(api_key="wrong"), env_ids=["lbtest/Pick-v0"])
        ok = _run(
            f"openai:{server.url}",
            tmp_path / "b",
            AgentOptions(api_key="sekrit"),
            env_ids=["lbtest/Pick-v0"],
            episodes=2,
        )
        assert ok.summary["complete"] and all(r["model"] == "scripted" for r in server.requests)  # the one listed model
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(FatalAgentError, match="cannot reach"):
        _run(f"openai:http://127.0.0.1:{port}/v1", tmp_path / "c", AgentOptions(), env_ids=["lbtest/Pick-v0"])
    assert not (tmp_path / "a").exists()


def test_tool_call_conversion_and_api_base() -> None:
    calls, errors = tool_calls_from_reply(
        [
            ChatToolCall(id="a", function=ChatToolCallFunction(name="f", arguments='{"x": 1}')),
            ChatToolCall(id="b", function=ChatToolCallFunction(name="g", arguments="[1]")),
            ChatToolCall(id="", function=ChatToolCallFunction(name="h", arguments="")),
        ]
    )
    assert [(c.name, c.arguments, c.id) for c in calls] == [("f", {"x": 1}, "a"), ("h", {}, "call_2")]
    assert len(errors) == 1 and "JSON object" in errors[0]
    assert api_base("http://h:1/v1/") == api_base("http://h:1") == "http://h:1"


def test_vllm_shapes_single_model_and_reasoning_field(tmp_path: Path) -> None:
    """No --model: the agent uses the one model /v1/models lists (vLLM 404s "default"), and reads
    vLLM's `reasoning` field."""
    with ScriptedServer(mode="vllm") as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", AgentOptions(), env_ids=["lbtest/Picture-v0"], episodes=2)
    assert res.fatal is None and res.summary["complete"], res.fatal
    assert {r["model"] for r in server.requests} == {"scripted"}
    row = read_records(tmp_path / "r" / "episodes.jsonl")[0]
    doc = json.loads((tmp_path / "r" / row.transcript).read_text())
    assistant = next(m for m in doc["messages"] if m["role"] == "assistant")
    assert assistant["reasoning"] == "thought it over"


def test_an_unsupported_field_is_not_a_modality_refusal(tmp_path: Path) -> None:
    with ScriptedServer(mode="unsupported_param") as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", AgentOptions(), env_ids=["lbtest/Picture-v0"], episodes=2)
    # each episode fails on its own (the field), the run is not stopped as a modality refusal
    assert res.fatal is None and res.summary["results"]["counts"]["finished"] == 0


def test_sglang_agent_against_a_non_sglang_server_stops_once(tmp_path: Path) -> None:
    """An OpenAI-only server (no /model_info): one clear fatal error, no episode tried."""
    from starlette.responses import Response

    with ScriptedServer() as server:
        health = server._server.config.app.router.routes  # type: ignore[union-attr]
        from starlette.routing import Route

        health.append(Route("/health", lambda request: Response(status_code=200)))
        base = server.url.removesuffix("/v1")
        with pytest.raises(FatalAgentError, match="is not an SGLang server"):
            _run(f"sglang:{base}", tmp_path / "r", AgentOptions(tokenizer=None), env_ids=["lbtest/Pick-v0"],
                 episodes=3)
    assert server.requests == []


def test_a_reasoning_model_refusing_sampling_fields_still_runs(tmp_path: Path) -> None:
    with ScriptedServer(mode="reasoning_model") as server:
        res = _run(f"openai:{server.url}", tmp_path / "r", AgentOptions(), env_ids=["lbtest/Pick-v0"], episodes=3)
    assert res.fatal is None and res.summary["complete"]
    assert res.summary["results"]["counts"]["errors"] == 0
    answered = [r for r in server.requests if "max_tokens" not in r and "temperature" not in r]
    assert answered and all(r["max_completion_tokens"] == 512 for r in answered)
    assert 2 <= len(server.requests) - len(answered) <= 6  # each field refused once per episode at most
