"""OpenAI-compatible /v1/chat/completions on the embedded engine (text model, tools)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

from relax_gym.protocol import ChatCompletionRequest, EngineClient

from .conftest import ADD_TOOL, TOOL_QUESTION, chat_prompt_ids, load_tokenizer


async def test_tool_call_comes_back_structured(text_engine: EmbeddedEngineProcess) -> None:
    async with EngineClient(text_engine.url) as client:
        out = await client.chat_completions(
            ChatCompletionRequest(
                messages=TOOL_QUESTION, tools=[ADD_TOOL], temperature=0.0, max_tokens=64, logprobs=True, top_logprobs=2
            )
        )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert calls[0].id.startswith("call_") and calls[0].type == "function"
    tokens = choice.logprobs.content if choice.logprobs else []
    assert len(tokens) == out.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)  # type: ignore[attr-defined]
    assert "".join(t.token for t in tokens).startswith("<tool_call>")


async def test_tools_are_rendered_by_the_chat_template(
    text_engine: EmbeddedEngineProcess, scripted_qwen3: Path
) -> None:
    tok = load_tokenizer(scripted_qwen3)
    async with EngineClient(text_engine.url) as client:
        with_tools = await client.chat_completions(
            ChatCompletionRequest(messages=TOOL_QUESTION, tools=[ADD_TOOL], max_tokens=2, seed=1)
        )
        without = await client.chat_completions(ChatCompletionRequest(messages=TOOL_QUESTION, max_tokens=2, seed=1))
    assert with_tools.usage.prompt_tokens == len(chat_prompt_ids(tok, TOOL_QUESTION, [ADD_TOOL]))
    assert without.usage.prompt_tokens == len(chat_prompt_ids(tok, TOOL_QUESTION))
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 20


async def test_multi_turn_with_tool_result_and_n(text_engine: EmbeddedEngineProcess) -> None:
    messages: list[dict[str, Any]] = [
        *TOOL_QUESTION,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    async with EngineClient(text_engine.url) as client:
        out = await client.chat_completions(
            ChatCompletionRequest(messages=messages, tools=[ADD_TOOL], max_tokens=5, n=3, seed=7, temperature=1.0)
        )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.completion_tokens == sum(1 for _ in out.choices) * 5 or out.usage.completion_tokens <= 15
    assert out.model


async def test_chat_bad_input(text_engine: EmbeddedEngineProcess) -> None:
    bad = [
        ({"messages": []}, "empty"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
            "no vision encoder",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "audio"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": -2}, "temperature"),
        ({"messages": "hello"}, "messages"),
    ]
    async with httpx.AsyncClient(base_url=text_engine.url) as http:
        for body, fragment in bad:
            resp = await http.post("/v1/chat/completions", json=body)
            assert resp.status_code == 400, (body, resp.text)
            assert fragment in resp.json()["error"]["message"], (fragment, resp.text)
        models = (await http.get("/v1/models")).json()
        assert models["data"][0]["id"]
