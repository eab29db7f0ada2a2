"""The engine wire protocol, written once: SGLang's native HTTP API and OpenAI chat completions.

Both sides use these models: the rollout manager, the GenRM judge and the evaluator send them
through :class:`EngineClient`; the embedded CPU engine parses them on the server side. Field
names are SGLang's own (``/generate`` with ``input_ids``, ``image_data``, ``sampling_params``,
``return_logprob``; replies with ``output_ids`` and ``meta_info.output_token_logprobs``,
``finish_reason``, ``weight_version``), so one client talks to a real SGLang server on a GPU and
to the embedded engine on a laptop.

Requests accept extra fields (SGLang has many we do not use) and pass them through; replies are
parsed leniently, since servers add fields over time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relax_gym.errors import RelaxGymError


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
class EngineError(RelaxGymError):
    """An engine answered with an error status or a reply we cannot parse."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        self.url = url
        self.status = status
        super().__init__(f"{url}: {message}" + (f" (HTTP {status})" if status is not None else ""))


class EngineUnavailable(EngineError):
    """The engine could not be reached (refused, reset, DNS...): a failover candidate."""


class EngineTimeout(EngineError):
    """The engine did not answer within the timeout."""


class EngineClosed(EngineUnavailable):
    """The client was closed (its engine was removed): the call was not sent, or was cut off
    after the close's grace period. A failover candidate like any unreachable engine."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# ------------------------------------------------------------------------------------------------
# SGLang native API
# ------------------------------------------------------------------------------------------------
class SamplingParams(_Model):
    """SGLang's ``sampling_params`` (the subset with meaning on every engine)."""

    max_new_tokens: int = Field(default=128, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """A null value means the default, as SGLang reads it (no 400 for ``"top_p": null``)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class GenerateRequest(_Model):
    """``POST /generate``. Give ``input_ids`` (token-in) or ``text``; media lists hold base64
    strings, data URLs or paths, in the order their placeholders appear in the prompt."""

    text: str | None = None
    input_ids: list[int] | None = None
    image_data: list[str] | None = None
    audio_data: list[str] | None = None
    video_data: list[str] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: str | None = None
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _single_media(cls, data: Any) -> Any:
        """SGLang takes one media item as a bare string too; it is a list of one here."""
        if isinstance(data, dict):
            for key in ("image_data", "audio_data", "video_data"):
                if isinstance(data.get(key), str):
                    data = {**data, key: [data[key]]}
            if data.get("sampling_params", 0) is None:
                data = {k: v for k, v in data.items() if k != "sampling_params"}
        return data

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of `text` or `input_ids`")
        if self.stream:
            raise ValueError("streaming is not supported by this client; set stream=false")
        return self


class FinishReason(_Model):
    """Why generation stopped: ``stop`` (EOS / stop string; ``matched`` says which),
    ``length`` (max_new_tokens), or ``abort`` (aborted or paused for a weight update)."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | list[int] | None = None
    length: int | None = None
    message: str | None = None


class WeightVersionSpan(_Model):
    """SGLang's ``meta_info.weight_versions`` item: output tokens ``[start, end)`` were sampled
    with ``version`` (a request can span a weight update that paused it in place)."""

    version: str = ""
    start: int = 0
    end: int = 0


class MetaInfo(_Model):
    """SGLang's ``meta_info`` (0.5.23: ``GenerateMetaInfo`` in ``sglang/api/v1/api_types.py``)."""

    id: str | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    # SGLang: one [logprob, token_id, token_text_or_None] triple per generated token.
    output_token_logprobs: list[list[Any]] | None = None
    # From logprob_start_len on; SGLang's first entry is always [None, id, text].
    input_token_logprobs: list[list[Any]] | None = None
    output_top_logprobs: list[Any] | None = None
    input_top_logprobs: list[Any] | None = None
    output_token_logprobs_length: int | None = None
    weight_version: str | None = None
    # Spans over output_ids; on every finished reply of SGLang >= 0.5.23 and the embedded engine.
    weight_versions: list[WeightVersionSpan] | None = None
    num_retractions: int | None = None
    e2e_latency: float | None = None

    def token_versions(self, n: int) -> list[str | None]:
        """One weight version per output token: from the ``weight_versions`` spans when they
        cover exactly ``n`` tokens, else ``weight_version`` for all (older servers)."""
        spans = self.weight_versions
        if spans:
            out: list[str | None] = []
            for span in spans:
                if span.start != len(out) or span.end < span.start:
                    break
                out.extend([span.version] * (span.end - span.start))
            else:
                if len(out) == n:
                    return out
        return [self.weight_version] * n


def weight_version_spans(versions: list[str], current: str) -> list[dict[str, Any]]:
    """Per-token versions as SGLang's spans ``[{version, start, end}]``; a reply with no tokens
    has one empty span of the ``current`` version, as SGLang sends."""
    if not versions:
        return [{"version": current, "start": 0, "end": 0}]
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


class GenerateResponse(_Model):
    text: str = ""
    output_ids: list[int] | None = None
    meta_info: MetaInfo = Field(default_factory=MetaInfo)

    def token_ids(self) -> list[int]:
        """The generated token ids (from ``output_ids``, else from the logprob triples)."""
        if self.output_ids is not None:
            return list(self.output_ids)
        if self.meta_info.output_token_logprobs is not None:
            return [int(t[1]) for t in self.meta_info.output_token_logprobs]
        raise EngineError("<response>", "reply has neither output_ids nor output_token_logprobs")

    def token_logprobs(self) -> list[float]:
        """One logprob per generated token; needs ``return_logprob=True`` in the request."""
        triples = self.meta_info.output_token_logprobs
        if triples is None:
            raise EngineError("<response>", "reply has no output_token_logprobs; send return_logprob=true")
        return [float(t[0]) for t in triples]

    @property
    def finish_type(self) -> str | None:
        return self.meta_info.finish_reason.type if self.meta_info.finish_reason else None


class UpdateWeightsFromDiskRequest(_Model):
    """``POST /update_weights_from_disk``: load new weights from a HF folder."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsFromTensorRequest(_Model):
    """``POST /update_weights_from_tensor``: weights sent in the request body.

    The embedded engine takes base64 safetensors blobs (``load_format="safetensors"``), never
    pickles: unpickling a request body would let the caller run code in the engine.
    """

    serialized_named_tensors: list[str] = Field(min_length=1)
    load_format: str | None = "safetensors"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class InitWeightsUpdateGroupRequest(_Model):
    """``POST /init_weights_update_group``: join a process group to receive broadcast weights."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class UpdateWeightsFromDistributedRequest(_Model):
    """``POST /update_weights_from_distributed``: receive the named tensors by broadcast."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class UpdateWeightsResponse(_Model):
    success: bool
    message: str = ""
    num_paused_requests: int | None = 0


class AbortRequest(_Model):
    """``POST /abort_request``: abort one request by ``rid``, or all with ``abort_all``."""

    rid: str = ""
    abort_all: bool = False


class PauseGenerationRequest(_Model):
    """``POST /pause_generation``. ``abort``: in-flight requests return with finish_reason
    abort; ``retract`` / ``in_place``: they wait and resume after ``/continue_generation``."""

    mode: Literal["abort", "retract", "in_place"] = "abort"


class ModelInfo(_Model):
    """``GET /model_info`` (``/get_model_info`` before SGLang deprecated it)."""

    model_path: str = ""
    served_model_name: str | None = None
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None


# ------------------------------------------------------------------------------------------------
# OpenAI-compatible chat completions (as served by SGLang, vLLM and the embedded engine)
# ------------------------------------------------------------------------------------------------
class ChatCompletionRequest(_Model):
    model: str = "default"
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    stream: bool = False


class CompletionRequest(_Model):
    """``POST /v1/completions`` (OpenAI's legacy text completions, as SGLang serves them)."""

    model: str = "default"
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False
    stream: bool = False


class ChatToolCallFunction(_Model):
    name: str
    arguments: str = "{}"


class ChatToolCall(_Model):
    id: str = ""
    type: str = "function"
    function: ChatToolCallFunction


class ChatMessage(_Model):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # SGLang's name
    reasoning: str | None = None  # vLLM's name (0.32)
    tool_calls: list[ChatToolCall] | None = None


class ChatTopLogprob(_Model):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(_Model):
    """One generated token's logprob entry; OpenAI and SGLang always send ``top_logprobs``
    (empty when none were asked for)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Model):
    content: list[ChatTokenLogprob] | None = None


class ChatChoice(_Model):
    index: int = 0
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatUsage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatCompletionResponse(_Model):
    id: str = ""
    object: str = "chat.completion"
    created: int = 0
    model: str = ""
    choices: list[ChatChoice]
    usage: ChatUsage | None = None


# ------------------------------------------------------------------------------------------------
# the client
# ------------------------------------------------------------------------------------------------
_SSL_CONTEXT: ssl.SSLContext | None = None
_JSON_HEADERS = {"Content-Type": "application/json"}


def _json_body(payload: BaseModel | dict[str, Any] | None) -> bytes | None:
    """The request body as JSON bytes. A model goes through pydantic's own serializer: a
    /generate body of a few hundred token ids costs 4x less CPU than model_dump + json.dumps."""
    if payload is None:
        return None
    if isinstance(payload, BaseModel):
        return payload.model_dump_json(exclude_none=True).encode()
    return json.dumps(payload).encode()


def _default_ssl_context() -> ssl.SSLContext:
    """One shared default context: building one costs ~60 ms, and routers make many clients."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = ssl.create_default_context()
    return _SSL_CONTEXT


Transport = Literal["auto", "httpx", "aiohttp"]
_Reply = TypeVar("_Reply", bound=BaseModel)


def _aiohttp_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("aiohttp") is not None


class EngineClient:
    """Async client for one engine URL (SGLang server or the embedded engine).

    Transport failures become :class:`EngineUnavailable` / :class:`EngineTimeout` and HTTP
    errors :class:`EngineError`, so callers (the rollout manager's failover, GenRM's retries)
    decide what to do with a small, typed set of failures. ``api_key`` is sent as a bearer
    token, as SGLang's ``--api-key`` and the embedded engine's control endpoints expect.

    ``transport``: ``"httpx"`` (always available) or ``"aiohttp"`` (about 4x less CPU per
    request, which matters with hundreds of episodes in flight; it comes with the ``train``
    extra). ``"auto"`` picks aiohttp when it is installed. Both map failures the same way.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        control_timeout_s: float = 30.0,
        max_connections: int = 256,
        transport: Transport = "auto",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        # pause / continue / abort / flush / model info answer at once on a healthy engine; a
        # short bound keeps one stuck control call (e.g. to an engine being removed) from
        # holding a whole weight sync for the generate timeout
        self.control_timeout_s = control_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if transport == "auto":
            transport = "aiohttp" if _aiohttp_available() else "httpx"
        if transport not in ("httpx", "aiohttp"):
            raise ValueError(f"transport must be 'auto', 'httpx' or 'aiohttp', got {transport!r}")
        self.transport: str = transport
        self._client: httpx.AsyncClient | None = None
        self._session: Any = None  # aiohttp.ClientSession, made inside the running loop
        self._closed = False
        self._old_routes: set[str] = set()  # info routes this server only has under the old name
        self._inflight = 0
        self._idle: asyncio.Event | None = None  # set while no call is in flight (made on first use)
        if transport == "httpx":
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers,
                verify=_default_ssl_context(),
                timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
                limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            )

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def inflight(self) -> int:
        """Calls sent through this client that have not returned yet."""
        return self._inflight

    async def aclose(self, *, grace_s: float = 0.0) -> None:
        """Refuse new calls at once (:class:`EngineClosed`), give the calls in flight up to
        ``grace_s`` seconds to finish, then close the connections (cutting off the rest, which
        then raise :class:`EngineClosed` too)."""
        self._closed = True
        if grace_s > 0 and self._inflight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle_event().wait(), grace_s)
        if self._client is not None:
            await self._client.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _idle_event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if not self._inflight:
                self._idle.set()
        return self._idle

    async def _request(self, method: str, path: str, payload: BaseModel | dict[str, Any] | None = None,
                       *, timeout_s: float | None = None) -> Any:
        """One call; the reply's JSON (its text when it is not JSON, None when empty)."""
        content = await self._call(method, path, payload, timeout_s=timeout_s)
        if not content:
            return None
        try:
            return json.loads(content)
        except ValueError:
            return content.decode("utf-8", errors="replace")

    async def _call(self, method: str, path: str, payload: BaseModel | dict[str, Any] | None = None,
                    *, timeout_s: float | None = None) -> bytes:
        """One call; the reply's body. An error status raises :class:`EngineError`."""
        body = _json_body(payload)
        url = self.base_url + path
        if self._closed:
            raise EngineClosed(url, "client closed (the engine was removed); call not sent")
        self._inflight += 1
        self._idle_event().clear()
        try:
            status, content = await self._send(method, path, url, body, timeout_s)
        except EngineUnavailable:
            if self._closed:  # our own close cut the connection, not the engine
                raise EngineClosed(url, "client closed (the engine was removed) during the call") from None
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle_event().set()
        if status >= 400:
            detail = content[:500].decode("utf-8", errors="replace")
            raise EngineError(url, f"error reply: {detail}", status)
        return content

    async def _send(self, method: str, path: str, url: str, body: bytes | None,
                    timeout_s: float | None) -> tuple[int, bytes]:
        try:
            if self._client is not None:
                return await self._send_httpx(method, path, body, timeout_s, url)
            return await self._send_aiohttp(method, url, body, timeout_s)
        except RuntimeError as exc:  # httpx / aiohttp refuse a closed client or session
            if self._closed:
                raise EngineClosed(url, "client closed (the engine was removed)") from None
            raise EngineUnavailable(url, f"unreachable ({type(exc).__name__}: {exc})") from None

    async def _send_httpx(self, method: str, path: str, body: bytes | None, timeout_s: float | None,
                          url: str) -> tuple[int, bytes]:
        assert self._client is not None
        kwargs: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        if body is not None:
            kwargs.update(content=body, headers=_JSON_HEADERS)
        try:
            resp = await self._client.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise EngineTimeout(url, f"timed out ({type(exc).__name__})") from None
        except (httpx.TransportError, OSError) as exc:
            raise EngineUnavailable(url, f"unreachable ({type(exc).__name__}: {exc})") from None
        return resp.status_code, resp.content

    async def _send_aiohttp(self, method: str, url: str, body: bytes | None,
                            timeout_s: float | None) -> tuple[int, bytes]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self.max_connections, ssl=_default_ssl_context()),
            )
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s, connect=self.connect_timeout_s)
        try:
            headers = _JSON_HEADERS if body is not None else None
            async with self._session.request(method, url, data=body, headers=headers, timeout=timeout) as resp:
                return resp.status, await resp.read()
        except TimeoutError as exc:  # aiohttp's timeouts subclass TimeoutError
            raise EngineTimeout(url, f"timed out ({type(exc).__name__})") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineUnavailable(url, f"unreachable ({type(exc).__name__}: {exc})") from None

    # -- generation ---------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest, *, timeout_s: float | None = None) -> GenerateResponse:
        return await self._post_parsed("/generate", request, GenerateResponse, timeout_s)

    async def chat_completions(self, request: ChatCompletionRequest, *, timeout_s: float | None = None) -> ChatCompletionResponse:
        return await self._post_parsed("/v1/chat/completions", request, ChatCompletionResponse, timeout_s)

    async def _post_parsed(
        self, path: str, request: BaseModel, reply: type[_Reply], timeout_s: float | None
    ) -> _Reply:
        """POST ``request`` and parse the reply as ``reply`` (straight from the bytes: half the CPU of
        json.loads + model_validate); one that does not parse is an EngineError."""
        content = await self._call("POST", path, request, timeout_s=timeout_s)
        try:
            return reply.model_validate_json(content)
        except ValidationError as exc:
            raise EngineError(self.base_url + path, f"unparseable reply: {exc}") from None

    # -- health and control -------------------------------------------------------------------
    async def health(self, *, timeout_s: float = 5.0) -> bool:
        """True when ``/health`` answers 200; never raises."""
        try:
            await self._request("GET", "/health", timeout_s=timeout_s)
            return True
        except EngineError:
            return False

    async def _info(self, path: str, old_path: str, timeout_s: float | None) -> Any:
        """GET ``path``; on a 404 the pre-0.5 name ``old_path`` (remembered for this client).
        SGLang 0.5.23 deprecates the ``/get_*`` names and logs a warning on every call."""
        if path in self._old_routes:
            return await self._request("GET", old_path, timeout_s=timeout_s)
        try:
            return await self._request("GET", path, timeout_s=timeout_s)
        except EngineError as exc:
            if exc.status != 404:
                raise
        out = await self._request("GET", old_path, timeout_s=timeout_s)
        self._old_routes.add(path)
        return out

    async def model_info(self) -> ModelInfo:
        """``GET /model_info`` (falls back to ``/get_model_info``)."""
        return ModelInfo.model_validate(await self._info("/model_info", "/get_model_info", self.control_timeout_s))

    async def _model_cards(self) -> list[dict[str, Any]]:
        """The cards ``GET /v1/models`` lists (empty when the route is missing or unreadable)."""
        try:
            data = await self._request("GET", "/v1/models", timeout_s=self.control_timeout_s)
        except EngineError:
            return []
        items = data.get("data") if isinstance(data, dict) else None
        return [m for m in items or [] if isinstance(m, dict)]

    async def served_models(self) -> list[str]:
        """The ids ``GET /v1/models`` lists (empty when the route is missing or unreadable)."""
        return [str(m["id"]) for m in await self._model_cards() if "id" in m]

    async def max_model_len(self) -> int | None:
        """The context length the server enforces, from ``GET /v1/models`` (``max_model_len`` of
        the first card that states one, as SGLang and the embedded engine do); None when none does."""
        for card in await self._model_cards():
            value = card.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    async def flush_cache(self) -> None:
        await self._request("POST", "/flush_cache", timeout_s=self.control_timeout_s)

    async def abort(self, rid: str | None = None) -> None:
        """Abort one request, or every request when ``rid`` is None."""
        await self._request("POST", "/abort_request", AbortRequest(rid=rid or "", abort_all=rid is None),
                            timeout_s=self.control_timeout_s)

    async def pause_generation(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        await self._request("POST", "/pause_generation", PauseGenerationRequest(mode=mode), timeout_s=self.control_timeout_s)

    async def continue_generation(self) -> None:
        await self._request("POST", "/continue_generation", {}, timeout_s=self.control_timeout_s)

    async def update_weights_from_disk(self, request: UpdateWeightsFromDiskRequest) -> UpdateWeightsResponse:
        return await self._update_weights("/update_weights_from_disk", request)

    async def update_weights_from_tensor(self, request: UpdateWeightsFromTensorRequest) -> UpdateWeightsResponse:
        return await self._update_weights("/update_weights_from_tensor", request)

    async def _update_weights(self, path: str, request: BaseModel) -> UpdateWeightsResponse:
        """POST a weight update to ``path``; a reply with ``success: false`` raises EngineError."""
        out = UpdateWeightsResponse.model_validate(await self._request("POST", path, request))
        if not out.success:
            raise EngineError(self.base_url + path, f"weight update failed: {out.message}")
        return out

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> None:
        await self._request("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info`` (falls back to ``/get_server_info``): server-specific; SGLang
        reports its server args (``tp_size``...), the embedded engine its load too."""
        info = await self._info("/server_info", "/get_server_info", None)
        return info if isinstance(info, dict) else {}

    async def init_weights_update_group(self, request: InitWeightsUpdateGroupRequest) -> UpdateWeightsResponse:
        return UpdateWeightsResponse.model_validate(
            await self._request("POST", "/init_weights_update_group", request)
        )

    async def update_weights_from_distributed(self, request: UpdateWeightsFromDistributedRequest) -> UpdateWeightsResponse:
        return await self._update_weights("/update_weights_from_distributed", request)


__all__ = [
    "AbortRequest",
    "ChatChoice",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatLogprobs",
    "ChatMessage",
    "ChatTokenLogprob",
    "ChatTopLogprob",
    "ChatToolCall",
    "ChatToolCallFunction",
    "ChatUsage",
    "CompletionRequest",
    "EngineClient",
    "EngineClosed",
    "EngineError",
    "EngineTimeout",
    "EngineUnavailable",
    "FinishReason",
    "GenerateRequest",
    "GenerateResponse",
    "InitWeightsUpdateGroupRequest",
    "MetaInfo",
    "ModelInfo",
    "PauseGenerationRequest",
    "SamplingParams",
    "UpdateWeightsFromDiskRequest",
    "UpdateWeightsFromDistributedRequest",
    "UpdateWeightsFromTensorRequest",
    "UpdateWeightsResponse",
    "WeightVersionSpan",
    "weight_version_spans",
]
