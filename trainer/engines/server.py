"""The embedded engine's HTTP server: SGLang's native routes plus OpenAI chat completions.

Routes (bodies are the typed models of :mod:`relax_gym.protocol`, parsed with them here too):

=====================================  ==========================================================
``GET  /health``                       200 while the engine thread runs (never needs a token)
``GET  /get_model_info``               model path, weight version, vision support
``GET  /get_server_info``              load and counters (running/waiting, busy seconds...)
``POST /generate``                     SGLang ``/generate`` (``input_ids`` or ``text``, images)
``POST /v1/chat/completions``          OpenAI chat completions (images, tools, logprobs)
``GET  /v1/models``                    the served model, OpenAI style
``POST /abort_request``                control: abort one ``rid`` or all
``POST /pause_generation``             control: ``abort`` / ``retract`` / ``in_place``
``POST /continue_generation``          control
``POST /flush_cache``                  control: drop cached prefixes (refused while busy)
``POST /update_weights_from_disk``     control: reload weights from a HF folder
``POST /update_weights_from_tensor``   control: safetensors blobs in the body (see weights.py)
``POST /init_weights_update_group``    control: join the trainer's gloo group
``POST /update_weights_from_distributed``  control: receive broadcast tensors
``POST /destroy_weights_update_group`` control
=====================================  ==========================================================

With an API key, control routes need ``Authorization: Bearer <key>`` (401 otherwise); with
``protect_generation`` the generation and info routes need it too. Bad input gets a 4xx with
``{"error": {"message", "type", "code"}}`` and is counted; the engine keeps serving.

Memory stays bounded whatever clients send. :class:`BodyLimitMiddleware` counts every body as
it streams in (Content-Length or chunked alike) and answers 413 the moment it passes the route's
limit, 503 when all bodies held at once would pass ``max_buffered_bytes``, 408 when one trickles
in for longer than ``body_timeout_s``. Bodies over ``small_body_bytes`` and requests with images
are parsed and prepared in a bounded "heavy" lane (``heavy_concurrency`` at a time, off the event
loop), so oversized input waits its turn instead of starving small requests; the per-field
checks (characters before tokenising, tokens against the context, image bytes and pixels before
decoding) are in :mod:`.prepare`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relax_gym.protocol import (
    AbortRequest,
    GenerateRequest,
    SamplingParams,
    InitWeightsUpdateGroupRequest,
    PauseGenerationRequest,
    UpdateWeightsFromDiskRequest,
    UpdateWeightsFromDistributedRequest,
)

from relax_gym.trainer.engines.engine import EngineCore, make_sequence
from relax_gym.trainer.engines.chat_completions import chat_completions, text_completions
from relax_gym.trainer.engines.prepare import BadRequest, HTTPError, InputLimits, PreparedPrompt, check_raw_generate, prepare_prompt, resolve_sampling
from relax_gym.trainer.engines.model_runner import WeightUpdateError
from relax_gym.trainer.engines.shm_weights import SHM_LOAD_FORMAT, host_id, read_shm_blob, shm_dir
from relax_gym.trainer.engines.weight_receiver import (
    UpdateWeightsFromTensorRequest,
    WeightGroupError,
    WeightReceiver,
    WeightTransportError,
    decode_named_tensors,
    validate_distributed_request,
)

log = logging.getLogger("relax_gym.engine.server")

Handler = Callable[[Request], Awaitable[Response]]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

WEIGHT_TENSOR_ROUTE = "/update_weights_from_tensor"
MiB = 1 << 20


@dataclass
class ServerConfig:
    """HTTP-level settings of the embedded engine."""

    model_path: str
    served_model_name: str = "default"
    api_key: str | None = None
    protect_generation: bool = False  # also require the key on generation and info routes
    allow_media_paths: bool = False  # let image_data name local files (off: base64/data URLs only)
    max_queued_requests: int = 4096  # 503 beyond this many requests in flight
    max_request_bytes: int = 32 * MiB  # body of any route but the weight upload (413 beyond)
    max_weight_request_bytes: int = 1024 * MiB  # body of /update_weights_from_tensor
    max_buffered_bytes: int | None = None  # all bodies held at once (503 beyond); None: derived
    small_body_bytes: int = 64 << 10  # bodies up to this size skip the heavy lane and the budget
    heavy_concurrency: int = 2  # large or image requests parsed/prepared at once
    body_timeout_s: float = 300.0  # a body still arriving after this long gets 408
    max_prompt_chars: int | None = None  # None: prompt_chars_per_token * context length
    prompt_chars_per_token: int = 32
    max_images: int = 32  # per request
    max_image_bytes: int = 16 * MiB  # encoded bytes per image
    max_image_pixels: int = 4096 * 4096  # per image, from the header, before decoding
    default_max_tokens: int = 512  # chat completions without max_tokens
    max_new_tokens_cap: int | None = None
    reasoning_parser: str | None = None  # "qwen3": split <think> into reasoning_content
    disconnect_poll_s: float = 0.25

    def input_limits(self) -> InputLimits:
        return InputLimits(
            max_prompt_chars=self.max_prompt_chars,
            chars_per_token=self.prompt_chars_per_token,
            max_images=self.max_images,
            max_image_bytes=self.max_image_bytes,
            max_image_pixels=self.max_image_pixels,
            allow_media_paths=self.allow_media_paths,
        )

    def body_limit(self, path: str) -> int:
        return self.max_weight_request_bytes if path == WEIGHT_TENSOR_ROUTE else self.max_request_bytes

    def buffered_limit(self) -> int:
        """Room for one weight upload and eight maximal other bodies, unless set."""
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        return max(self.max_weight_request_bytes, self.max_request_bytes) + 8 * self.max_request_bytes


def error_response(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(
        {"object": "error", "error": {"message": message, "type": kind, "code": status}}, status_code=status
    )


def _reject_constant(name: str) -> Any:
    """Python's json accepts NaN and Infinity; JSON (and SGLang's parser) does not."""
    raise HTTPError(400, f"malformed JSON body: {name} is not a JSON number")


def _decode(
    body: bytes, model: type[BaseModel] | None, precheck: Callable[[dict[str, Any]], None] | None
) -> Any:
    """JSON body -> ``model`` (or the raw value when ``model`` is None); raises HTTPError 400."""
    if not body:
        data: Any = {}
    else:
        try:
            data = json.loads(body, parse_constant=_reject_constant)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HTTPError(400, f"malformed JSON body: {exc}") from None
        except RecursionError:
            raise HTTPError(400, "malformed JSON body: nested too deeply") from None
    if model is None:
        return data
    if not isinstance(data, dict):
        raise HTTPError(400, f"expected a JSON object, got {type(data).__name__}")
    if precheck is not None:
        precheck(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<body>'}: {e['msg']}" for e in exc.errors()[:8])
        raise HTTPError(400, f"invalid {model.__name__}: {problems}") from None
    except RecursionError:
        raise HTTPError(400, f"invalid {model.__name__}: nested too deeply") from None


async def _send_error(send: Send, status: int, message: str, kind: str, *, close: bool = False) -> None:
    """An error reply sent straight from ASGI middleware, before the body has been read.

    Without ``close`` the server (uvicorn) then reads and discards the rest of the body, keeping
    nothing, so a client that sends its whole body before reading (httpx, requests) still gets
    this reply instead of a connection reset.
    """
    body = json.dumps({"object": "error", "error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class BodyStats:
    """What :class:`BodyLimitMiddleware` refused, and what it holds now."""

    buffered_bytes: int = 0
    too_large: int = 0  # 413
    over_budget: int = 0  # 503
    too_slow: int = 0  # 408


class BodyLimitMiddleware:
    """Read each request body in full with a running byte count before the app sees it.

    Why here and not in the routes: a chunked body has no Content-Length, so only counting the
    ``http.request`` messages as they arrive bounds it. The 413 goes out the moment the count
    passes the route's limit (or at once when Content-Length already says so); the rest of the
    body is then discarded as it arrives, never stored. Bytes past ``free_bytes`` of every body are
    also charged to one shared budget for as long as the request runs, so many large bodies
    at once get 503 instead of exhausting memory, while small requests are never refused.
    A request that ``may_read`` refuses (no valid API key for its route) is passed on with an
    empty body, never buffered, so the 1 GiB weight-upload limit is open to key holders only.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit_for: Callable[[str], int],
        budget_bytes: int,
        free_bytes: int,
        timeout_s: float,
        stats: BodyStats | None = None,
        may_read: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.may_read = may_read or (lambda scope: True)
        self.limit_for = limit_for
        self.budget_bytes = budget_bytes
        self.free_bytes = free_bytes
        self.timeout_s = timeout_s
        self.stats = stats or BodyStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.may_read(scope):  # the route answers 401 without a body; the body is discarded
            await self.app(scope, _replay(b"", receive), send)
            return
        limit = self.limit_for(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            self.stats.too_large += 1
            await _send_error(send, 413, f"request body of {declared} bytes exceeds the limit of {limit}", "PayloadTooLarge")
            return
        held = [0]  # budget bytes this request holds (a list: _read_body adds to it)
        try:
            chunks = await self._read_body(scope, receive, send, limit, held)
            if chunks is not None:
                body = b"".join(chunks)  # one copy; the chunks go now, not when the request ends
                chunks.clear()
                await self.app(scope, _replay(body, receive), send)
        finally:
            self.stats.buffered_bytes -= held[0]

    async def _read_body(
        self, scope: Scope, receive: Receive, send: Send, limit: int, held: list[int]
    ) -> list[bytes] | None:
        """The body's chunks, or None once an error reply has been sent (or the client left)."""
        chunks: list[bytes] = []
        total = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":  # http.disconnect
                        return None
                    body = message.get("body", b"")
                    total += len(body)
                    if total > limit:
                        self.stats.too_large += 1
                        await _send_error(
                            send, 413, f"request body exceeds the limit of {limit} bytes", "PayloadTooLarge"
                        )
                        return None
                    if not self._charge(max(0, total - self.free_bytes) - held[0], held):
                        self.stats.over_budget += 1
                        await _send_error(
                            send,
                            503,
                            f"the engine holds {self.stats.buffered_bytes} bytes of request bodies "
                            f"(limit {self.budget_bytes}); retry later",
                            "ServiceUnavailable",
                        )
                        return None
                    if body:
                        chunks.append(body)
                    if not message.get("more_body", False):
                        return chunks
        except TimeoutError:
            self.stats.too_slow += 1
            await _send_error(
                send,
                408,
                f"request body not received within {self.timeout_s:g} s ({total} bytes came)",
                "RequestTimeout",
                close=True,
            )
            return None

    def _charge(self, extra: int, held: list[int]) -> bool:
        if extra <= 0:
            return True
        if self.stats.buffered_bytes + extra > self.budget_bytes:
            return False
        self.stats.buffered_bytes += extra
        held[0] += extra
        return True


def _bearer_ok(header: str, key: str) -> bool:
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields the buffered body once, then defers to the real one (disconnects)."""
    pending = [body]

    async def replay() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replay


class EngineService:
    """The HTTP-facing side of one :class:`EngineCore`: parse, prepare, submit, await."""

    def __init__(self, engine: EngineCore, config: ServerConfig, receiver: WeightReceiver | None = None) -> None:
        self.engine = engine
        self.config = config
        self.limits = config.input_limits()
        self.receiver = receiver or WeightReceiver()
        self.model_path = config.model_path  # what the weights came from last (a disk update moves it)
        self.in_flight = 0
        self.unauthorized = 0
        self.bodies = BodyStats()
        self._heavy = asyncio.Semaphore(max(1, config.heavy_concurrency))

    @property
    def runner(self) -> Any:
        return self.engine.runner

    # -- helpers ------------------------------------------------------------------------------
    async def read_json(self, request: Request) -> Any:
        """The parsed body (its size was capped by :class:`BodyLimitMiddleware`)."""
        return await self.parse(request, None)

    async def parse(
        self,
        request: Request,
        model: type[BaseModel] | None,
        precheck: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """Parse the body, run ``precheck`` on the raw object, then validate it as ``model``.

        Large bodies do this in the heavy lane (a thread, ``heavy_concurrency`` at a time): a
        64 MB JSON body takes a second of CPU and several times its size in memory to parse.
        """
        body = await request.body()
        request.state.body_bytes = len(body)
        return await self.decode_body(body, model, precheck)

    async def decode_body(
        self,
        body: bytes,
        model: type[BaseModel] | None,
        precheck: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """:meth:`parse` of a body already read (small inline, large in the heavy lane)."""
        if len(body) <= self.config.small_body_bytes:
            return _decode(body, model, precheck)
        async with self.heavy_lane():
            return await run_in_threadpool(_decode, body, model, precheck)

    def heavy_lane(self) -> asyncio.Semaphore:
        """The slots for expensive parsing and preparation (``heavy_concurrency`` of them)."""
        return self._heavy

    def is_heavy(self, request: Request, req: GenerateRequest) -> bool:
        """Whether preparing ``req`` may cost much: a large body or any image to decode."""
        return bool(req.image_data or req.video_data or req.audio_data) or getattr(request.state, "body_bytes", 0) > self.config.small_body_bytes

    def check_auth(self, request: Request) -> None:
        key = self.config.api_key
        if key and not _bearer_ok(request.headers.get("authorization", ""), key):
            self.unauthorized += 1
            raise HTTPError(401, "missing or wrong API key (send Authorization: Bearer <key>)", "AuthenticationError")

    def may_read_body(self, scope: Scope, protected: frozenset[str]) -> bool:
        """False for a request its route will refuse with 401: its body is then never read."""
        key = self.config.api_key
        if not key or (scope["path"] not in protected and not self.config.protect_generation):
            return True
        header = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        return _bearer_ok(header.decode("latin-1"), key)

    # -- generation ---------------------------------------------------------------------------
    async def prepare(self, req: GenerateRequest, *, heavy: bool = True) -> PreparedPrompt:
        """Tokenise and decode off the event loop; heavy requests wait for a heavy-lane slot."""
        if not heavy:
            return await run_in_threadpool(prepare_prompt, req, self.runner, self.limits)
        async with self.heavy_lane():
            return await run_in_threadpool(prepare_prompt, req, self.runner, self.limits)

    async def submit(self, req: GenerateRequest, prepared: PreparedPrompt, request: Request | None) -> dict[str, Any]:
        """Run one prepared request through the engine and return SGLang's reply dict."""
        if self.in_flight >= self.config.max_queued_requests:
            raise HTTPError(503, f"engine is full ({self.in_flight} requests in flight)", "ServiceUnavailable")
        spec = resolve_sampling(req.sampling_params, self.runner, max_new_tokens_cap=self.config.max_new_tokens_cap)
        if not 0 <= req.top_logprobs_num <= 20:
            raise BadRequest("top_logprobs_num must be between 0 and 20")
        if req.return_logprob and req.logprob_start_len > len(prepared.input_ids):
            raise BadRequest(f"logprob_start_len={req.logprob_start_len} is higher than the number of input tokens "
                             f"({len(prepared.input_ids)}); use a smaller logprob_start_len")
        rid = req.rid or uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any) -> None:
            if not fut.done():
                fut.set_result(result)

        def deliver(result: Any) -> None:  # called on the engine thread
            loop.call_soon_threadsafe(settle, result)

        seq = make_sequence(
            self.engine,
            rid=rid,
            prompt_ids=prepared.input_ids,
            spec=spec,
            deliver=deliver,
            vision=prepared.vision,
            seed=req.sampling_params.sampling_seed,
            return_logprob=req.return_logprob,
            logprob_start_len=req.logprob_start_len,
            top_logprobs_num=req.top_logprobs_num,
        )
        self.in_flight += 1
        try:
            self.engine.submit(seq)
            result = await self._wait(fut, rid, request)
        finally:
            self.in_flight -= 1
        if isinstance(result, ValueError):
            raise HTTPError(400, str(result))
        if isinstance(result, BaseException):
            raise HTTPError(500, str(result), "InternalServerError")
        if req.return_text_in_logprobs and req.return_logprob:
            await run_in_threadpool(self._logprob_texts, result["meta_info"])
        return result

    def _logprob_texts(self, meta: dict[str, Any]) -> None:
        """SGLang's ``return_text_in_logprobs``: each triple's third item is its token's text."""
        decode = self.runner.tokenizer.decode
        for key in ("output_token_logprobs", "input_token_logprobs"):
            for triple in meta.get(key) or []:
                triple[2] = decode([int(triple[1])])
        for key in ("output_top_logprobs", "input_top_logprobs"):
            for row in meta.get(key) or []:
                for triple in row or []:
                    triple[2] = decode([int(triple[1])])

    async def _wait(self, fut: asyncio.Future[Any], rid: str, request: Request | None) -> Any:
        """Await the result; abort the request if the client goes away (as SGLang does), or, for a
        caller in this process (no ``request``), if the awaiting task is cancelled."""
        if request is None:
            try:
                return await fut
            except asyncio.CancelledError:
                self.engine.abort(rid, "the caller gave up")
                raise
        while True:
            done, _ = await asyncio.wait({fut}, timeout=self.config.disconnect_poll_s)
            if done:
                return fut.result()
            if request is not None and await request.is_disconnected():
                self.engine.abort(rid, "client disconnected")
                return await fut

    async def generate(self, request: Request) -> Response:
        req = await self.parse(
            request, GenerateRequest, lambda data: check_raw_generate(data, self.runner, self.limits)
        )
        prepared = await self.prepare(req, heavy=self.is_heavy(request, req))
        return JSONResponse(await self.submit(req, prepared, request))

    async def generate_body(self, body: bytes) -> dict[str, Any]:
        """``/generate`` for a caller in this process (:mod:`.in_process`): the route's parsing,
        checks and submission, without a socket and without polling for a disconnect (a caller
        that gives up cancels the awaiting task, which aborts the request). Token ids without
        media are prepared inline: their checks cost microseconds, less than a thread hop."""
        req = await self.decode_body(body, GenerateRequest,
                                     lambda data: check_raw_generate(data, self.runner, self.limits))
        heavy = bool(req.image_data or req.video_data) or len(body) > self.config.small_body_bytes
        if req.input_ids is not None and not heavy:
            prepared = prepare_prompt(req, self.runner, self.limits)
        else:
            prepared = await self.prepare(req, heavy=heavy)
        return await self.submit(req, prepared, None)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("relax-gym")
    except PackageNotFoundError:
        return "unknown"


def _route(service: EngineService, fn: Callable[[Request], Awaitable[Response]], *, control: bool) -> Handler:
    async def handler(request: Request) -> Response:
        try:
            if control or service.config.protect_generation:
                service.check_auth(request)
            return await fn(request)
        except HTTPError as exc:
            if exc.status < 500 and exc.status != 401:
                service.engine.stats.bad_requests += 1
            return error_response(exc.status, exc.message, exc.kind)
        except (BadRequest, WeightTransportError) as exc:
            service.engine.stats.bad_requests += 1
            return error_response(400, str(exc), "BadRequestError")
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            return error_response(500, f"{type(exc).__name__}: {exc}", "InternalServerError")

    return handler


class _InfoRoutes:
    """The read-only routes: health, model and server info, the OpenAI model list, chat."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.engine = service.engine
        self.cfg = service.config

    async def health(self, request: Request) -> Response:
        if not self.engine.alive:
            return error_response(503, "engine thread is not running", "ServiceUnavailable")
        return Response(status_code=200)

    async def model_info(self, request: Request) -> Response:
        runner = self.engine.runner
        return JSONResponse(
            {
                "model_path": self.service.model_path,
                "tokenizer_path": self.cfg.model_path,
                "is_generation": True,
                "weight_version": self.engine.weight_version,
                "served_model_name": self.cfg.served_model_name,
                "load_format": "safetensors",
                "reasoning_parser": self.cfg.reasoning_parser,
                "tool_call_parser": "qwen25",  # the <tool_call> JSON blocks of tool_calls.py
                "has_image_understanding": runner.is_vision,
                "max_context_length": runner.max_context,
                "vocab_size": runner.vocab_size,
            }
        )

    async def server_info(self, request: Request) -> Response:
        service = self.service
        bodies = service.bodies
        snapshot = self.engine.snapshot()
        snapshot["bad_requests"] += bodies.too_large + bodies.too_slow  # refused unread
        return JSONResponse(
            {
                **snapshot,
                "in_flight_http": service.in_flight,
                "unauthorized_requests": service.unauthorized,
                "request_bodies": {
                    "buffered_bytes": bodies.buffered_bytes,
                    "too_large": bodies.too_large,
                    "over_budget": bodies.over_budget,
                    "too_slow": bodies.too_slow,
                },
                "weight_update_groups": service.receiver.group_names,
                "pending_weight_group_joins": service.receiver.pending_joins,
                "logprob_mode": self.engine.logprob_mode,
                # SGLang's server args that clients read (weight sync: one group rank per TP rank)
                "model_path": self.cfg.model_path,
                "served_model_name": self.cfg.served_model_name,
                "tp_size": 1,
                "dp_size": 1,
                "version": f"relax-gym-embedded {_package_version()}",
                # the in-memory weight path: a trainer with the same host id hands over /dev/shm files
                "weight_load_formats": ["safetensors", SHM_LOAD_FORMAT],
                "weight_shm_dir": str(shm_dir()),
                "host_id": host_id(),
            }
        )

    async def health_generate(self, request: Request) -> Response:
        """SGLang's deep health check: generate one token (greedy) through the engine."""
        if not self.engine.alive:
            return error_response(503, "engine thread is not running", "ServiceUnavailable")
        req = GenerateRequest(input_ids=[0], sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0))
        prepared = await self.service.prepare(req, heavy=False)
        await self.service.submit(req, prepared, request)
        return Response(status_code=200)

    async def model_card(self, request: Request) -> Response:
        """``GET /v1/models/{model}``: the card, or OpenAI's 404 for another name."""
        name = request.path_params["model"]
        if name != self.cfg.served_model_name:
            return JSONResponse({"error": {"message": f"The model '{name}' does not exist",
                                           "type": "invalid_request_error", "param": "model",
                                           "code": "model_not_found"}}, status_code=404)
        return JSONResponse(self._card())

    def _card(self) -> dict[str, Any]:
        return {
            "id": self.cfg.served_model_name,
            "object": "model",
            "created": int(self.engine.stats.started),
            "owned_by": "relax-gym",
            "root": self.cfg.model_path,
            "max_model_len": self.engine.runner.max_context,
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def chat(self, request: Request) -> Response:
        return JSONResponse(await chat_completions(self.service, request))

    async def completions(self, request: Request) -> Response:
        return JSONResponse(await text_completions(self.service, request))


class _ControlRoutes:
    """The control routes that steer generation: abort, pause, continue, flush the cache."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.engine = service.engine

    async def abort(self, request: Request) -> Response:
        req = await self.service.parse(request, AbortRequest)
        rid = None if req.abort_all or not req.rid else req.rid
        self.engine.abort(rid, "aborted by abort_request")
        return JSONResponse({"success": True})

    async def pause(self, request: Request) -> Response:
        req = await self.service.parse(request, PauseGenerationRequest)
        engine = self.engine
        held = await asyncio.wrap_future(engine.run_job(lambda: engine.pause(req.mode)))
        return JSONResponse({"success": True, "message": f"paused ({req.mode})", "num_paused_requests": held})

    async def resume(self, request: Request) -> Response:
        await self.service.read_json(request)
        await asyncio.wrap_future(self.engine.run_job(self.engine.resume))
        return JSONResponse({"success": True, "message": "generation continues"})

    async def flush(self, request: Request) -> Response:
        ok = await asyncio.wrap_future(self.engine.run_job(self.engine.flush_cache))
        if not ok:
            return error_response(400, "cache not flushed: requests are running or waiting", "BadRequestError")
        return JSONResponse({"success": True, "message": "cache flushed"})


class _WeightRoutes:
    """The control routes that load new weights: from disk, tensor blobs or a broadcast group."""

    def __init__(self, service: EngineService) -> None:
        self.service = service
        self.engine = service.engine
        self.runner = service.engine.runner

    async def _update(self, load: Callable[[], int], version: str | None, abort_all: bool) -> Response:
        """Run ``load`` as an engine job, then bump the weight version; 400 if loading fails."""
        engine = self.engine

        def job() -> dict[str, Any]:
            start = time.perf_counter()
            count = load()
            engine.after_weight_update(version)
            return {
                "success": True,
                "num_paused_requests": engine.held_count(),
                "message": f"loaded {count} tensors in {time.perf_counter() - start:.3f} s; "
                f"weight_version={engine.weight_version}",
            }

        try:
            result = await asyncio.wrap_future(engine.run_job(job, quiet=True, abort_all=abort_all))
        except (WeightUpdateError, WeightTransportError) as exc:
            return JSONResponse(
                {"success": False, "message": str(exc), "num_paused_requests": engine.held_count()}, status_code=400
            )
        return JSONResponse(result)

    async def from_disk(self, request: Request) -> Response:
        req = await self.service.parse(request, UpdateWeightsFromDiskRequest)
        reply = await self._update(
            lambda: self.runner.load_from_disk(req.model_path), req.weight_version, req.abort_all_requests
        )
        if reply.status_code == 200:  # SGLang's /model_info reports the folder loaded last
            self.service.model_path = req.model_path
        return reply

    async def from_tensor(self, request: Request) -> Response:
        data: dict[str, Any] = {}

        def keep(raw: dict[str, Any]) -> None:
            data.update(load_format=raw.get("load_format"))

        req = await self.service.parse(request, UpdateWeightsFromTensorRequest, keep)
        # SGLang's own items (load_format absent/None, "direct" or "flattened_bucket") are pickles
        # carrying CUDA IPC handles: only a process on the same GPUs can make them, and
        # unpickling a request body would let the caller run code here
        if data["load_format"] == SHM_LOAD_FORMAT:  # paths of /dev/shm files (shm_weights.py)
            limit = self.service.config.max_weight_request_bytes
            named = await run_in_threadpool(
                lambda: [nt for item in req.serialized_named_tensors for nt in read_shm_blob(item, max_bytes=limit)]
            )
            return await self._update(
                lambda: self.runner.load_named_tensors(named), req.weight_version, req.abort_all_requests
            )
        if data["load_format"] != "safetensors":
            raise HTTPError(
                400,
                f"load_format {data['load_format']!r} is not accepted: SGLang's serialized tensors are pickles with "
                "CUDA IPC handles, which the embedded engine never unpickles; send base64 safetensors blobs with "
                "load_format='safetensors' (relax-gym's tensor transport does)",
            )
        named = await run_in_threadpool(
            lambda: [nt for item in req.serialized_named_tensors for nt in decode_named_tensors(item)]
        )
        return await self._update(
            lambda: self.runner.load_named_tensors(named), req.weight_version, req.abort_all_requests
        )

    async def init_group(self, request: Request) -> Response:
        req = await self.service.parse(request, InitWeightsUpdateGroupRequest)
        try:  # bounded by the receiver's timeout, off the event loop and the engine thread
            await self.service.receiver.join(req)
        except WeightTransportError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=400)
        except WeightGroupError as exc:  # conflict, busy, or no rendezvous in time
            return JSONResponse({"success": False, "message": str(exc)}, status_code=exc.status)
        return JSONResponse({"success": True, "message": f"joined {req.group_name} as rank {req.rank_offset}"})

    async def from_distributed(self, request: Request) -> Response:
        req = await self.service.parse(request, UpdateWeightsFromDistributedRequest)
        validate_distributed_request(req)
        try:  # receive first, within the group timeout: the engine thread never waits on the network
            named = await self.service.receiver.receive(req)
        except WeightGroupError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=exc.status)
        return await self._update(
            lambda: self.runner.load_named_tensors(named), req.weight_version, req.abort_all_requests
        )

    async def destroy_group(self, request: Request) -> Response:
        data = await self.service.read_json(request)
        name = data.get("group_name", "weight_update_group") if isinstance(data, dict) else "weight_update_group"
        try:
            ok = self.service.receiver.destroy_group(str(name))
        except WeightGroupError as exc:
            return JSONResponse({"success": False, "message": str(exc)}, status_code=exc.status)
        return JSONResponse({"success": ok, "message": "destroyed" if ok else f"no group {name!r}"})


RouteRow = tuple[str, Handler, list[str]]


def _route_table(service: EngineService) -> tuple[list[RouteRow], list[RouteRow]]:
    """(generation and info routes, control routes): path, handler, methods."""
    info, control, weights = _InfoRoutes(service), _ControlRoutes(service), _WeightRoutes(service)
    open_rows: list[RouteRow] = [
        ("/model_info", info.model_info, ["GET"]),
        ("/server_info", info.server_info, ["GET"]),
        ("/get_model_info", info.model_info, ["GET"]),  # SGLang's deprecated names, still served
        ("/get_server_info", info.server_info, ["GET"]),
        ("/health_generate", info.health_generate, ["GET"]),
        ("/generate", service.generate, ["POST"]),
        ("/v1/chat/completions", info.chat, ["POST"]),
        ("/v1/completions", info.completions, ["POST"]),
        ("/v1/models", info.models, ["GET"]),
        ("/v1/models/{model:path}", info.model_card, ["GET"]),
    ]
    control_rows: list[RouteRow] = [
        ("/abort_request", control.abort, ["POST"]),
        ("/pause_generation", control.pause, ["POST"]),
        ("/continue_generation", control.resume, ["POST"]),
        ("/flush_cache", control.flush, ["POST", "GET"]),
        ("/update_weights_from_disk", weights.from_disk, ["POST"]),
        (WEIGHT_TENSOR_ROUTE, weights.from_tensor, ["POST"]),
        ("/init_weights_update_group", weights.init_group, ["POST"]),
        ("/update_weights_from_distributed", weights.from_distributed, ["POST"]),
        ("/destroy_weights_update_group", weights.destroy_group, ["POST"]),
    ]
    return open_rows, control_rows


def build_app(service: EngineService) -> Starlette:
    """The Starlette app for ``service`` (its engine must be started separately).

    ``/health`` never needs a key; control routes always do when there is one, generation and
    info routes only with ``protect_generation`` (see :func:`_route`).
    """
    open_rows, control_rows = _route_table(service)
    routes = [Route("/health", _InfoRoutes(service).health, methods=["GET"])]
    for rows, control in ((open_rows, False), (control_rows, True)):
        routes += [Route(path, _route(service, fn, control=control), methods=methods) for path, fn, methods in rows]
    protected = frozenset(path for path, _, _ in control_rows)
    cfg = service.config
    body_limit = Middleware(
        BodyLimitMiddleware,
        limit_for=cfg.body_limit,
        budget_bytes=cfg.buffered_limit(),
        free_bytes=cfg.small_body_bytes,
        timeout_s=cfg.body_timeout_s,
        stats=service.bodies,
        may_read=lambda scope: service.may_read_body(scope, protected),
    )
    return Starlette(routes=routes, middleware=[body_limit])


__all__ = [
    "BodyLimitMiddleware",
    "BodyStats",
    "EngineService",
    "HTTPError",
    "ServerConfig",
    "build_app",
    "error_response",
]
