"""A small OpenAI-compatible server on 127.0.0.1 for the ``openai:`` agent tests.

It stands for a hosted API whose behaviour a test must choose: it answers the lbtest envs
correctly *only from what it was sent* -- the colour is read from the pixels of the image part,
the secret word from the tool message -- so a passing episode proves the media and the tool
round trip went over the wire. Every request body is recorded. Modes: ``reject_images``
(HTTP 400 on image parts, as text-only servers answer), ``slow`` (never answers in time),
``bad_args`` (tool calls whose arguments are not JSON), ``think`` (replies wrapped in
``<think>`` blocks), ``vllm`` (vLLM 0.32's shapes: a 404 for a model it does not serve, the
reasoning in ``message.reasoning``), ``unsupported_param`` (a 400 saying a request field is
unsupported, with no media named), ``reasoning_model`` (a hosted reasoning model: a 400 for
``max_tokens`` or ``temperature``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import socket
import threading
import time
from typing import Any

import uvicorn
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .envs_for_tests import COLOURS


def _colour_of(data_url: str) -> str:
    raw = base64.b64decode(data_url.split(",", 1)[1])
    pixel = Image.open(io.BytesIO(raw)).convert("RGB").getpixel((5, 5))
    return min(COLOURS, key=lambda c: sum((a - b) ** 2 for a, b in zip(COLOURS[c], pixel, strict=True)))  # type: ignore[arg-type]


class ScriptedServer:
    def __init__(self, mode: str = "normal", api_key: str | None = None) -> None:
        self.mode = mode
        self.api_key = api_key
        self.requests: list[dict[str, Any]] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _authorised(self, request: Request) -> bool:
        return self.api_key is None or request.headers.get("authorization") == f"Bearer {self.api_key}"

    async def _models(self, request: Request) -> JSONResponse:
        if not self._authorised(request):
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def _chat(self, request: Request) -> JSONResponse:
        if not self._authorised(request):
            return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
        body = await request.json()
        self.requests.append(body)
        if self.mode == "vllm" and body.get("model") != "scripted":
            return JSONResponse({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                           "type": "NotFoundError", "param": None, "code": 404}}, status_code=404)
        if self.mode == "reasoning_model" and ("max_tokens" in body or "temperature" in body):
            field = "max_tokens" if "max_tokens" in body else "temperature"
            return JSONResponse({"error": {"message": f"Unsupported parameter: '{field}' is not supported with this "
                                           "model.", "type": "invalid_request_error"}}, status_code=400)
        if self.mode == "unsupported_param":
            return JSONResponse({"error": {"message": "Unsupported parameter: 'seed' is not supported with this model.",
                                           "type": "invalid_request_error"}}, status_code=400)
        messages = body["messages"]
        parts = [p for m in messages if isinstance(m.get("content"), list) for p in m["content"]]
        images = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
        if self.mode == "reject_images" and images:
            return JSONResponse(
                {"error": {"message": "image input is not supported by this model", "type": "BadRequestError"}},
                status_code=400,
            )
        if self.mode == "slow":
            await asyncio.sleep(1.5)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        tool_msgs = [m for m in messages if m["role"] == "tool"]
        if body.get("tools") and not tool_msgs:
            args = "{not json" if self.mode == "bad_args" else '{"key": "secret"}'
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}",
                    "type": "function",
                    "function": {"name": body["tools"][0]["function"]["name"], "arguments": args},
                }
            ]
        elif tool_msgs:
            message["content"] = tool_msgs[-1]["content"]
        elif images:
            message["content"] = _colour_of(images[-1])
        else:
            last = messages[-1]["content"]
            message["content"] = str(last).rstrip(".").split()[-1]
        if self.mode == "think" and message["content"]:
            message["content"] = f"<think>easy one</think>{message['content']}"
        if self.mode == "vllm":
            message["reasoning"] = "thought it over"
        return JSONResponse(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", ""),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10 + 50 * len(images), "completion_tokens": 3, "total_tokens": 13},
            }
        )

    def __enter__(self) -> ScriptedServer:
        app = Starlette(
            routes=[Route("/v1/models", self._models), Route("/v1/chat/completions", self._chat, methods=["POST"])]
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)
