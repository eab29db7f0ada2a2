"""``POST /v1/chat/completions`` on the embedded engine, as SGLang and vLLM serve it.

Messages (text, ``image_url`` parts as data URLs or base64) and ``tools`` are rendered with the
model's chat template, generated through the same engine as ``/generate``, and the reply's
``<tool_call>`` blocks come back as structured ``message.tool_calls``. ``logprobs`` /
``top_logprobs`` follow OpenAI's shape. SGLang's extra request fields ``top_k``, ``min_p``,
``ignore_eos``, ``stop_token_ids``, ``skip_special_tokens``, ``chat_template_kwargs`` (e.g.
``{"enable_thinking": false}``) and ``separate_reasoning`` are honoured.

Limits, each before the work it protects: the text of the messages and tools is measured in
characters before the chat template renders it, the rendered prompt again before it is
tokenised (in pieces that stop once past the context), the image count before any is decoded,
and prompt plus ``max_tokens`` against the context (without ``max_tokens`` the default shrinks to
what the context leaves).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from relax_gym.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest, SamplingParams

from relax_gym.trainer.engines.prepare import BadRequest, HTTPError, check_context, check_image_count, check_prompt_chars, tokenize_bounded
from relax_gym.chat import hidden_special_ids
from relax_gym.trainer.engines.tool_calls import parse_tool_calls, strip_tool_calls, to_openai

if TYPE_CHECKING:  # server.py imports this module for its route; the service is only a type here
    from relax_gym.trainer.engines.server import EngineService

_IMAGE_PARTS = ("image_url", "image")
_UNSUPPORTED_PARTS = ("input_audio", "audio", "audio_url", "video_url", "video")
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def _image_source(part: dict[str, Any], where: str) -> str:
    value = part.get(part["type"])
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}: image part without a url / base64 payload")
    return value


def normalize_messages(messages: list[dict[str, Any]], *, vision: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages the chat template can render, and the image sources in prompt order."""
    out: list[dict[str, Any]] = []
    images: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}]: expected an object with role system/developer/user/assistant/tool")
        content = msg.get("content")
        item = dict(msg)
        if item["role"] == "developer":  # OpenAI's newer name for system, as SGLang maps it
            item["role"] = "system"
        if content is None or isinstance(content, str):
            item["content"] = content or ""
        elif isinstance(content, list):
            parts: list[dict[str, Any]] = []
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                elif kind in _IMAGE_PARTS:
                    if not vision:
                        raise BadRequest(f"{where}: the served model has no vision encoder; send text only")
                    images.append(_image_source(part, where))
                    parts.append({"type": "image"})
                elif kind in _UNSUPPORTED_PARTS:
                    raise BadRequest(f"{where}: {kind} input is not supported by the embedded engine")
                else:
                    raise BadRequest(f"{where}: unknown content part type {kind!r}")
            if vision:
                item["content"] = parts
            else:
                item["content"] = "".join(p["text"] for p in parts)
        else:
            raise BadRequest(f"messages[{i}].content must be a string, a list of parts or null")
        out.append(item)
    if not out:
        raise BadRequest("messages is empty")
    return out, images


def text_size(value: Any) -> int:
    """Characters of every string in a JSON-like value, plus a few per container (what a chat
    template can at least render from it); iterative, so deep nesting cannot overflow."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += 4
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            total += 2
            stack.extend(item)
        else:
            total += 1
    return total


def _sampling(req: ChatCompletionRequest, default_max_tokens: int) -> SamplingParams:
    """SGLang's sampling params from the request; a null value means the default, as in SGLang."""
    extra = {k: v for k, v in (req.model_extra or {}).items() if v is not None}
    max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=int(extra.get("top_k", -1)),
        min_p=float(extra.get("min_p", 0.0)),
        stop=req.stop,
        stop_token_ids=extra.get("stop_token_ids"),
        ignore_eos=bool(extra.get("ignore_eos", False)),
        skip_special_tokens=bool(extra.get("skip_special_tokens", True)),
        **{k: extra[k] for k in ("frequency_penalty", "presence_penalty", "repetition_penalty") if k in extra},
    )


def refuse_unsupported(req: ChatCompletionRequest | dict[str, Any]) -> None:
    """A 400 naming each OpenAI field the embedded engine cannot honour (SGLang honours them with
    grammar backends and logit processors); nothing is dropped silently."""
    fields = req.model_dump() if isinstance(req, ChatCompletionRequest) else req
    fields = {**fields, **((req.model_extra or {}) if isinstance(req, ChatCompletionRequest) else {})}
    fmt = fields.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise BadRequest("response_format other than {'type': 'text'} is not supported by the embedded engine "
                         "(no constrained decoding); SGLang serves it with a grammar backend")
    if fields.get("logit_bias"):
        raise BadRequest("logit_bias is not supported by the embedded engine")
    choice = fields.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise BadRequest(f"tool_choice {choice!r} is not supported by the embedded engine (it cannot force a "
                         "tool call); send 'auto' or 'none'")
    if fields.get("reasoning_effort") is not None:
        raise BadRequest("reasoning_effort is not supported by the embedded engine; for Qwen3 send "
                         "chat_template_kwargs {'enable_thinking': ...}")
    for name in ("regex", "ebnf", "json_schema", "structural_tag"):
        if fields.get(name) is not None:
            raise BadRequest(f"{name} (constrained decoding) is not supported by the embedded engine")


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """Qwen3 style: ``<think>...</think>`` (the opening tag may sit in the prompt)."""
    if "</think>" not in text:
        return None, text
    head, _, tail = text.partition("</think>")
    return head.replace("<think>", "").strip(), tail.lstrip("\n")


def structured_text(tokenizer: Any, output_ids: list[int], text: str, stop: str | list[str] | None) -> str:
    """The completion as the tool-call parser and the reasoning split must read it. ``text`` was
    decoded without special tokens; where the tokenizer marks ``<tool_call>`` or ``<think>``
    special (GGUF-converted vocabularies do), that erased the very call the model made, so the
    ids are decoded again keeping those tags (other special tokens still dropped), and cut at the
    first stop string as ``text`` was."""
    hidden = hidden_special_ids(tokenizer)  # ~0.1 ms: nothing beside a generation
    if hidden is None:
        return text
    full = str(tokenizer.decode([i for i in output_ids if i not in hidden], skip_special_tokens=False))
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cuts = [full.find(s) for s in stops if s and s in full]
    return full[:min(cuts)] if cuts else full


def _logprob_entry(tokenizer: Any, token_id: int, logprob: float, top: list[list[Any]] | None) -> dict[str, Any]:
    """OpenAI's entry; ``top_logprobs`` is always there (empty unless asked for), as OpenAI and
    SGLang send it."""
    piece = tokenizer.decode([token_id])
    return {
        "token": piece,
        "logprob": logprob,
        "bytes": list(piece.encode("utf-8")),
        "top_logprobs": [
            {"token": (p := tokenizer.decode([int(t[1])])), "logprob": t[0], "bytes": list(p.encode("utf-8"))}
            for t in top or []
        ],
    }


async def chat_completions(service: EngineService, request: Request) -> dict[str, Any]:
    req: ChatCompletionRequest = await service.parse(request, ChatCompletionRequest)
    if req.stream:
        raise HTTPError(400, "stream=true is not supported by the embedded engine")
    if not 1 <= req.n <= 16:
        raise HTTPError(400, "n must be between 1 and 16")
    refuse_unsupported(req)
    runner = service.runner
    extra = req.model_extra or {}
    messages, images = normalize_messages(req.messages, vision=runner.is_vision)
    check_image_count(len(images), service.limits)
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    template_kwargs = extra.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    check_prompt_chars(text_size([messages, tools, template_kwargs]), runner, service.limits, "the conversation")

    def render() -> list[int]:
        try:
            text = runner.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **template_kwargs
            )
        except Exception as exc:
            raise BadRequest(f"cannot render the messages with the chat template: {exc}") from None
        check_prompt_chars(len(text), runner, service.limits, "the rendered prompt")
        return tokenize_bounded(runner.tokenizer, text, runner.max_context)

    if getattr(request.state, "body_bytes", 0) > service.config.small_body_bytes:
        async with service.heavy_lane():
            ids = await run_in_threadpool(render)
    else:
        ids = await run_in_threadpool(render)
    try:
        sampling = _sampling(req, service.config.default_max_tokens)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise BadRequest(f"invalid sampling parameters: {exc}") from None
    explicit = bool(req.max_completion_tokens or req.max_tokens)
    probe = GenerateRequest(  # without max_tokens, only the prompt must fit until we know its length
        input_ids=ids,
        image_data=images or None,
        sampling_params=sampling if explicit else sampling.model_copy(update={"max_new_tokens": 0}),
    )
    prepared = await service.prepare(probe, heavy=service.is_heavy(request, probe))
    if not explicit:  # the default shrinks to what the context leaves after image expansion
        room = runner.max_context - len(prepared.input_ids) - 1
        sampling = sampling.model_copy(update={"max_new_tokens": max(1, min(sampling.max_new_tokens, room))})
        check_context(len(prepared.input_ids), sampling.max_new_tokens, runner)
    top_n = int(req.top_logprobs or 0) if req.logprobs else 0
    gen_reqs = [
        GenerateRequest(
            input_ids=ids,
            image_data=images or None,
            sampling_params=sampling.model_copy(update={"sampling_seed": None if req.seed is None else req.seed + k}),
            return_logprob=bool(req.logprobs),
            top_logprobs_num=top_n,
        )
        for k in range(req.n)
    ]
    results = await asyncio.gather(*(service.submit(g, prepared, request) for g in gen_reqs))

    separate = bool(extra.get("separate_reasoning", service.config.reasoning_parser == "qwen3"))
    choices = []
    prompt_tokens = completion_tokens = 0
    for index, res in enumerate(results):
        meta = res["meta_info"]
        prompt_tokens = meta["prompt_tokens"]
        completion_tokens += meta["completion_tokens"]
        text: str = res["text"]
        if (tools or separate) and sampling.skip_special_tokens:
            text = structured_text(runner.tokenizer, list(res["output_ids"]), text, sampling.stop)
        reasoning = None
        if separate:
            reasoning, text = _split_reasoning(text)
        message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": reasoning}
        finish = _FINISH.get(meta["finish_reason"]["type"], "stop")
        if tools:
            calls, _parser = parse_tool_calls(text)
            if calls:
                message["tool_calls"] = to_openai(calls)
                message["content"] = strip_tool_calls(text) or None
                finish = "tool_calls" if finish == "stop" else finish
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "matched_stop": meta["finish_reason"].get("matched"),
        }
        if req.logprobs:
            tops = meta.get("output_top_logprobs") or [None] * len(res["output_ids"])
            choice["logprobs"] = {
                "content": [
                    _logprob_entry(runner.tokenizer, int(t[1]), float(t[0]), top)
                    for t, top in zip(meta["output_token_logprobs"], tops, strict=True)
                ]
            }
        choices.append(choice)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": service.config.served_model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        # SGLang's endpoint metadata: the reply's version and its spans (of the first choice)
        "metadata": {"weight_version": results[0]["meta_info"]["weight_version"],
                     "weight_versions": results[0]["meta_info"]["weight_versions"]},
    }


async def text_completions(service: EngineService, request: Request) -> dict[str, Any]:
    """``POST /v1/completions``: one prompt (text or token ids), OpenAI's ``text_completion``
    reply; ``logprobs: k`` gives OpenAI's legacy logprob lists."""
    req: CompletionRequest = await service.parse(request, CompletionRequest)
    if req.stream:
        raise HTTPError(400, "stream=true is not supported by the embedded engine")
    if req.echo:
        raise BadRequest("echo=true is not supported by the embedded engine")
    extra = req.model_extra or {}
    for name in ("suffix",):
        if extra.get(name):
            raise BadRequest(f"{name} is not supported by the embedded engine")
    if (extra.get("best_of") or 1) != 1:
        raise BadRequest("best_of other than 1 is not supported by the embedded engine")
    refuse_unsupported({**extra})
    if not 1 <= req.n <= 16:
        raise BadRequest("n must be between 1 and 16")
    if req.logprobs is not None and not 0 <= req.logprobs <= 20:
        raise BadRequest("logprobs must be between 0 and 20")
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise BadRequest("a batch of prompts is not supported by the embedded engine; send one prompt")
        prompt = prompt[0]
    runner = service.runner
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), runner, service.limits, "the prompt")
        ids = await run_in_threadpool(tokenize_bounded, runner.tokenizer, prompt, runner.max_context)
    else:
        ids = [int(t) for t in prompt]
    chat_like = ChatCompletionRequest(messages=[], temperature=req.temperature, top_p=req.top_p,
                                      max_tokens=req.max_tokens, stop=req.stop, **extra)
    try:
        sampling = _sampling(chat_like, service.config.default_max_tokens)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"invalid sampling parameters: {exc}") from None
    want = req.logprobs is not None
    gen_reqs = [
        GenerateRequest(input_ids=ids, sampling_params=sampling.model_copy(
            update={"sampling_seed": None if req.seed is None else req.seed + k}),
            return_logprob=want, top_logprobs_num=req.logprobs or 0)
        for k in range(req.n)
    ]
    prepared = await service.prepare(gen_reqs[0], heavy=False)
    results = await asyncio.gather(*(service.submit(g, prepared, request) for g in gen_reqs))
    tok = runner.tokenizer
    choices = []
    completion_tokens = 0
    for index, res in enumerate(results):
        meta = res["meta_info"]
        completion_tokens += meta["completion_tokens"]
        logprobs = None
        if want:
            pieces = [tok.decode([int(t[1])]) for t in meta["output_token_logprobs"]]
            offsets, at = [], 0
            for piece in pieces:
                offsets.append(at)
                at += len(piece)
            tops = meta.get("output_top_logprobs") or []
            logprobs = {
                "tokens": pieces,
                "token_logprobs": [float(t[0]) for t in meta["output_token_logprobs"]],
                "top_logprobs": [{tok.decode([int(e[1])]): float(e[0]) for e in top or []} for top in tops]
                if req.logprobs else None,
                "text_offset": offsets,
            }
        choices.append({"index": index, "text": res["text"], "logprobs": logprobs,
                        "finish_reason": _FINISH.get(meta["finish_reason"]["type"], "stop"),
                        "matched_stop": meta["finish_reason"].get("matched")})
    prompt_tokens = results[0]["meta_info"]["prompt_tokens"]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": service.config.served_model_name,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "metadata": {"weight_version": results[0]["meta_info"]["weight_version"],
                     "weight_versions": results[0]["meta_info"]["weight_versions"]},
    }


__all__ = ["chat_completions", "normalize_messages", "refuse_unsupported", "text_completions", "text_size"]
