"""GenRM: an LLM judge as a reward, over HTTP.

The judge is any server speaking OpenAI's ``/v1/chat/completions`` (SGLang, vLLM, the embedded
engine, a hosted API) or SGLang's native ``/generate``; requests go through the core's
:class:`relax_gym.protocol.EngineClient` (httpx, pooled connections). On top of it the client
adds what a reward needs at RL scale:

* a concurrency limit (``max_concurrency`` requests in flight) and per-request timeouts;
* retries with exponential backoff and jitter on timeouts, unreachable servers, HTTP 408/429
  and 5xx -- the attempt count is kept on every verdict and shows up in metrics as retries;
* an LRU cache keyed by (judge model, rendered prompt), so a repeated sample costs nothing;
* robust verdict parsing (:mod:`.judge_templates`); an unreadable verdict is a failure of kind
  ``unparseable``, never a 0;
* the sample's images go to the judge (OpenAI ``image_url`` parts, or SGLang ``image_data``);
* :meth:`GenRMClient.score_batch` scores a whole rollout batch concurrently.

For ``/generate`` the chat must be rendered to text with the judge's chat template: pass
``render_prompt`` (e.g. ``lambda msgs: tok.apply_chat_template(msgs, tokenize=False,
add_generation_prompt=True)``), or the string ``"hf:<tokenizer path>"`` to load one lazily.
The messages it gets are in the HF style (images as ``{"type": "image"}`` parts).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relax_gym.formatting import format_messages
from relax_gym.media import encode_image, image_to_base64
from relax_gym.protocol import (
    ChatCompletionRequest,
    EngineClient,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerateRequest,
    SamplingParams,
)
from relax_gym.rewards.judge_templates import DEFAULT_RUBRIC, JudgeTemplate, VerdictError, get_template
from relax_gym.rewards.registry import reward
from relax_gym.rewards.types import Failure, RewardError, RewardInput, RewardResult
from relax_gym.types import ImagePart, Message, TextPart

RenderPrompt = Callable[[list[dict[str, Any]]], str]


class JudgeConfig(BaseModel):
    """Where the judge is and how to talk to it."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="server root, e.g. http://127.0.0.1:30000")
    api: Literal["openai", "sglang"] = Field("openai", description="/v1/chat/completions or /generate")
    model: str = Field("default", description="model name sent to OpenAI-style servers; part of the cache key")
    api_key: str | None = Field(None, description="sent as a bearer token")
    max_concurrency: int = Field(16, ge=1, description="requests in flight at once (also the pool size)")
    timeout_s: float = Field(60.0, gt=0, description="per attempt")
    connect_timeout_s: float = Field(5.0, gt=0)
    max_retries: int = Field(2, ge=0, description="extra attempts after a transient failure")
    backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles each retry, with jitter")
    backoff_max_s: float = Field(8.0, ge=0)
    retry_unparseable: int = Field(0, ge=0, description="extra attempts when the verdict is unreadable")
    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0)
    max_images: int = Field(8, ge=0, description="images from the sample shown to the judge")
    cache_size: int = Field(10_000, ge=0, description="cached verdicts (0 disables the cache)")
    render_prompt: str | None = Field(
        None, description="for api=sglang: 'hf:<tokenizer path>' or 'module:function' (or pass a callable)"
    )


@dataclass(slots=True)
class Verdict:
    """One judgement: a score in 0..1, or the failure that prevented it."""

    score: float | None
    text: str | None = None
    attempts: int = 0  # HTTP requests sent (0 when served from the cache)
    retries: int = 0  # of those, the ones that repeated a failed request
    cached: bool = False
    latency_s: float = 0.0
    failure: Failure | None = None

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "attempts": self.attempts,
            "retries": self.retries,
            "cached": self.cached,
            "latency_s": round(self.latency_s, 4),
        }
        if self.text is not None:
            out["judge_text"] = self.text[-2000:]
        return out

    def to_result(self, component: str = "genrm") -> RewardResult:
        if self.failure is not None or self.score is None:
            fail = self.failure or Failure("invalid", "no score")
            return RewardResult(
                total=None, failed=True, error=f"{component}: {fail}", errors={component: fail},
                details={component: self.details()},
            )
        return RewardResult(total=self.score, components={component: self.score}, details={component: self.details()})


@dataclass(slots=True)
class JudgeStats:
    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    failures: dict[str, int] = field(default_factory=dict)


class _Attempt(Exception):
    def __init__(self, kind: Any, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.failure = Failure(kind, message)
        self.retryable = retryable


def _load_renderer(spec: str) -> RenderPrompt:
    """``hf:<path>`` -> the tokenizer's chat template; ``module:function`` -> that function."""
    if spec.startswith("hf:"):
        from transformers import AutoTokenizer  # only for this option: keeps the core path light

        tok = AutoTokenizer.from_pretrained(spec[3:])

        def render(messages: list[dict[str, Any]]) -> str:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        return render
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"render_prompt {spec!r}: expected 'hf:<path>' or 'module:function'")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise ValueError(f"render_prompt {spec!r} is not callable")
    return fn


class GenRMClient:
    """An async judge client; share one per judge server (it holds the connection pool)."""

    def __init__(self, config: JudgeConfig | dict[str, Any], *, render_prompt: RenderPrompt | None = None,
                 seed: int | None = None) -> None:
        self.config = config if isinstance(config, JudgeConfig) else JudgeConfig.model_validate(config)
        if render_prompt is None and self.config.render_prompt:
            render_prompt = _load_renderer(self.config.render_prompt)
        if self.config.api == "sglang" and render_prompt is None:
            raise ValueError(
                "api='sglang' sends a text prompt to /generate: pass render_prompt (e.g. a tokenizer's "
                "apply_chat_template) or config render_prompt='hf:<tokenizer path>'"
            )
        self.render_prompt = render_prompt
        self.stats = JudgeStats()
        self._cache: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._rng = random.Random(seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine: EngineClient | None = None
        self._sem: asyncio.Semaphore | None = None

    # -- per-event-loop state -----------------------------------------------------------------
    def _state(self) -> tuple[EngineClient, asyncio.Semaphore]:
        """httpx pools and semaphores belong to one event loop; make new ones on a new loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._engine is None or self._sem is None:
            self._loop = loop
            self._engine = EngineClient(
                self.config.base_url,
                api_key=self.config.api_key,
                timeout_s=self.config.timeout_s,
                connect_timeout_s=self.config.connect_timeout_s,
                max_connections=self.config.max_concurrency,
            )
            self._sem = asyncio.Semaphore(self.config.max_concurrency)
        return self._engine, self._sem

    async def aclose(self) -> None:
        if self._engine is not None and self._loop is asyncio.get_running_loop():
            await self._engine.aclose()
        self._engine = None
        self._loop = None

    async def __aenter__(self) -> GenRMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- building requests ----------------------------------------------------------------------
    def build_messages(
        self,
        template: JudgeTemplate,
        sample: RewardInput,
        *,
        reference: str | None = None,
        response_b: str | None = None,
        rubric: str | None = None,
    ) -> list[Message]:
        """The judge's chat: the template's system prompt, then the sample's images and the
        filled-in template as one user message."""
        if template.needs_reference and reference is None:
            raise RewardError("config", f"judge template {template.name!r} needs a reference answer (sample.label)")
        if template.pairwise and response_b is None:
            raise RewardError("config", f"judge template {template.name!r} needs a second response to compare")
        fields = {
            "prompt": "\n".join(f"{m.role}: {m.text}" if m.role != "user" else m.text
                                for m in sample.prompt if m.text) or "(no text)",
            "response": sample.response,
            "reference": reference if reference is not None else "",
            "response_a": sample.response,
            "response_b": response_b if response_b is not None else "",
            "rubric": rubric or DEFAULT_RUBRIC,
        }
        try:
            text = template.user.format(**fields)
        except (KeyError, IndexError, ValueError) as exc:
            raise RewardError("config", f"judge template {template.name!r} cannot be filled: {exc}") from None
        images = sample.images[: self.config.max_images]
        user: list[Any] = [ImagePart(img) for img in images] + [TextPart(text)]
        return [Message.system(template.system), Message("user", user)]

    def _request_and_key(self, messages: list[Message]) -> tuple[Any, str]:
        cfg = self.config
        image_hashes = [hashlib.sha256(encode_image(p.image)).hexdigest()
                        for m in messages for p in m.content if isinstance(p, ImagePart)]
        if cfg.api == "openai":
            request: Any = ChatCompletionRequest(
                model=cfg.model, messages=format_messages(messages, "openai"),
                max_tokens=cfg.max_tokens, temperature=cfg.temperature,
            )
            prompt_repr = json.dumps(format_messages(messages, "text"), sort_keys=True)
        else:
            assert self.render_prompt is not None
            prompt = self.render_prompt(format_messages(messages, "hf"))
            images = [image_to_base64(p.image) for m in messages for p in m.content if isinstance(p, ImagePart)]
            request = GenerateRequest(
                text=prompt, image_data=images or None,
                sampling_params=SamplingParams(max_new_tokens=cfg.max_tokens, temperature=cfg.temperature),
            )
            prompt_repr = prompt
        key_src = json.dumps([cfg.api, cfg.model, cfg.max_tokens, cfg.temperature, prompt_repr, image_hashes])
        return request, hashlib.sha256(key_src.encode("utf-8")).hexdigest()

    # -- one attempt --------------------------------------------------------------------------
    async def _chat(self, engine: EngineClient, request: ChatCompletionRequest) -> Any:
        """Chat; with no model configured ("default") and a 404, the single model the server
        lists in ``/v1/models`` (vLLM and hosted servers do not know "default")."""
        try:
            return await engine.chat_completions(request)
        except EngineError as exc:
            if exc.status != 404 or request.model != "default":
                raise
            models = await engine.served_models()
            if len(models) != 1:
                raise
        return await engine.chat_completions(request.model_copy(update={"model": models[0]}))

    async def _attempt(self, engine: EngineClient, request: Any) -> str:
        try:
            if isinstance(request, ChatCompletionRequest):
                reply = await self._chat(engine, request)
                if not reply.choices:
                    raise _Attempt("invalid", "judge reply has no choices", retryable=False)
                text = reply.choices[0].message.content
            else:
                text = (await engine.generate(request)).text
        except EngineTimeout as exc:
            raise _Attempt("timeout", f"judge did not answer within {self.config.timeout_s} s ({exc})", True) from None
        except EngineUnavailable as exc:
            raise _Attempt("unavailable", str(exc), True) from None
        except EngineError as exc:
            if exc.status is None:
                raise _Attempt("invalid", str(exc), retryable=False) from None
            retryable = exc.status in (408, 429) or exc.status >= 500
            raise _Attempt("http", str(exc), retryable) from None
        if not text:
            raise _Attempt("unparseable", "judge returned an empty reply", retryable=False)
        return text

    def _backoff(self, retry: int) -> float:
        base = min(self.config.backoff_max_s, self.config.backoff_s * (2 ** (retry - 1)))
        return base * (0.5 + self._rng.random())

    # -- public API -----------------------------------------------------------------------------
    async def judge_messages(self, messages: list[Message], parse: Callable[[str], float]) -> Verdict:
        """Send one judge chat, with retries and caching, and parse its verdict. Never raises."""
        start = time.perf_counter()
        try:
            request, key = self._request_and_key(messages)
        except Exception as exc:  # noqa: BLE001 -- e.g. a render_prompt that fails
            return self._failed(Verdict(None, failure=Failure("config", f"cannot build judge request: {exc}")))
        if key in self._cache:
            self._cache.move_to_end(key)
            score, text = self._cache[key]
            self.stats.cache_hits += 1
            return Verdict(score, text, attempts=0, cached=True, latency_s=time.perf_counter() - start)
        engine, sem = self._state()
        attempts = 0
        transient_left = self.config.max_retries
        unparseable_left = self.config.retry_unparseable
        text: str | None = None
        while True:
            attempts += 1
            self.stats.requests += 1
            failure: Failure | None = None
            retry = False
            try:
                async with sem:
                    text = await self._attempt(engine, request)
            except _Attempt as exc:
                failure, retry = exc.failure, exc.retryable and transient_left > 0
                transient_left -= int(retry)
            except Exception as exc:  # noqa: BLE001 -- a bug or an odd reply: recorded, not raised
                failure = Failure("exception", f"{type(exc).__name__}: {exc}")
            if failure is None:
                assert text is not None
                try:
                    score = float(parse(text))
                    if not 0.0 <= score <= 1.0:
                        raise VerdictError(f"parsed score {score} is outside 0..1")
                    break
                except Exception as exc:  # noqa: BLE001 -- any parser error means "unreadable"
                    failure, retry = Failure("unparseable", str(exc)), unparseable_left > 0
                    unparseable_left -= int(retry)
            if not retry:
                verdict = Verdict(None, text, attempts=attempts, retries=attempts - 1,
                                  latency_s=time.perf_counter() - start, failure=failure)
                return self._failed(verdict)
            self.stats.retries += 1
            await asyncio.sleep(self._backoff(attempts))
        if self.config.cache_size > 0:
            self._cache[key] = (score, text)
            while len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
        return Verdict(score, text, attempts=attempts, retries=attempts - 1, latency_s=time.perf_counter() - start)

    def _failed(self, verdict: Verdict) -> Verdict:
        assert verdict.failure is not None
        self.stats.failures[verdict.failure.kind] = self.stats.failures.get(verdict.failure.kind, 0) + 1
        return verdict

    async def judge(
        self,
        sample: RewardInput,
        template: str | JudgeTemplate = "reference",
        *,
        reference: str | None = None,
        response_b: str | None = None,
        rubric: str | None = None,
    ) -> Verdict:
        """Judge one sample. ``reference`` defaults to ``str(sample.label)``."""
        tmpl = get_template(template)
        if reference is None and sample.label is not None:
            reference = sample.label if isinstance(sample.label, str) else str(sample.label)
        try:
            messages = self.build_messages(tmpl, sample, reference=reference, response_b=response_b, rubric=rubric)
        except RewardError as exc:
            return self._failed(Verdict(None, failure=Failure(exc.kind, exc.message)))
        return await self.judge_messages(messages, tmpl.parse)

    async def score(self, sample: RewardInput, template: str | JudgeTemplate = "reference", **kwargs: Any) -> RewardResult:
        return (await self.judge(sample, template, **kwargs)).to_result()

    async def score_batch(
        self, samples: Sequence[RewardInput], template: str | JudgeTemplate = "reference", **kwargs: Any
    ) -> list[RewardResult]:
        """Judge a whole batch concurrently (bounded by ``max_concurrency``); results in order."""
        verdicts = await asyncio.gather(*(self.judge(s, template, **kwargs) for s in samples))
        return [v.to_result() for v in verdicts]

    async def pairwise(self, sample: RewardInput, other: str, *, rubric: str | None = None,
                       both_orders: bool = True) -> Verdict:
        """How much better ``sample.response`` is than ``other`` (1 better, 0.5 tie, 0 worse).
        With ``both_orders`` the judge sees (A, B) and (B, A) and the scores are averaged, which
        cancels a judge's position bias."""
        first = self.judge(sample, "pairwise", response_b=other, rubric=rubric)
        if not both_orders:
            return await first
        swapped = RewardInput(prompt=sample.prompt, response=other, messages=sample.messages, label=sample.label,
                              metadata=sample.metadata)
        a, b = await asyncio.gather(first, self.judge(swapped, "pairwise", response_b=sample.response, rubric=rubric))
        attempts, retries, latency = a.attempts + b.attempts, a.retries + b.retries, max(a.latency_s, b.latency_s)
        for v in (a, b):
            if v.failure is not None:
                return Verdict(None, v.text, attempts=attempts, retries=retries, latency_s=latency, failure=v.failure)
        assert a.score is not None and b.score is not None
        text = f"{a.text}\n---\n{b.text}"
        return Verdict((a.score + (1.0 - b.score)) / 2, text, attempts=attempts, retries=retries,
                       cached=a.cached and b.cached, latency_s=latency)


# ------------------------------------------------------------------------------------------------
# registered rewards
# ------------------------------------------------------------------------------------------------
_CLIENTS: dict[str, GenRMClient] = {}


def judge_client(config: JudgeConfig | dict[str, Any]) -> GenRMClient:
    """A shared client per judge config, so every reward call reuses one pool and one cache."""
    cfg = config if isinstance(config, JudgeConfig) else JudgeConfig.model_validate(config)
    key = cfg.model_dump_json()
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = GenRMClient(cfg)
    return client


def _client_from(judge: dict[str, Any] | GenRMClient) -> GenRMClient:
    if isinstance(judge, GenRMClient):
        return judge
    try:
        return judge_client(judge)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise RewardError("config", f"bad judge config: {exc}") from None


@reward("genrm")
async def genrm(
    sample: RewardInput,
    *,
    judge: dict[str, Any] | GenRMClient,
    template: str = "reference",
    rubric: str | None = None,
) -> RewardResult:
    """An LLM judge's score (0..1) for the sample: ``template`` is ``reference`` (correct vs
    ``sample.label``), ``rubric`` (0-10 rescaled) or ``pairwise`` (vs
    ``sample.metadata["reference_response"]``, both orders). ``judge`` is a
    :class:`JudgeConfig` dict (``base_url``, ``api``, ``model``...) or a client."""
    client = _client_from(judge)
    if template == "pairwise":
        other = sample.metadata.get("reference_response")
        if not isinstance(other, str):
            raise RewardError("config", "genrm pairwise needs sample.metadata['reference_response'] (a string)")
        verdict = await client.pairwise(sample, other, rubric=rubric)
    else:
        verdict = await client.judge(sample, template, rubric=rubric)
    return verdict.to_result()


@reward("genrm_group_pairwise", group=True)
async def genrm_group_pairwise(
    samples: list[RewardInput],
    *,
    judge: dict[str, Any] | GenRMClient,
    rubric: str | None = None,
    max_group: int = 8,
) -> list[RewardResult]:
    """Each response's win rate against the other responses of its group (round robin, both
    orders; ties count half). Groups larger than ``max_group`` are a config failure, since the
    cost grows with the square of the group size."""
    client = _client_from(judge)
    n = len(samples)
    if n > max_group:
        raise RewardError("config", f"group of {n} exceeds max_group={max_group} for round-robin judging")
    if n == 1:
        return [RewardResult.ok(0.5, details={"genrm_group_pairwise": {"games": 0}})]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    verdicts = await asyncio.gather(*(client.pairwise(samples[i], samples[j].response, rubric=rubric) for i, j in pairs))
    wins = [0.0] * n
    attempts = [0] * n
    retries = [0] * n
    failures: dict[int, Failure] = {}
    for (i, j), v in zip(pairs, verdicts):
        for k in (i, j):
            attempts[k] += v.attempts
            retries[k] += v.retries
        if v.failure is not None or v.score is None:
            failures.setdefault(i, v.failure or Failure("invalid", "no score"))
            failures.setdefault(j, v.failure or Failure("invalid", "no score"))
            continue
        wins[i] += v.score
        wins[j] += 1.0 - v.score
    out: list[RewardResult] = []
    for k in range(n):
        details = {"games": n - 1, "attempts": attempts[k], "retries": retries[k]}
        if k in failures:
            fail = failures[k]
            out.append(RewardResult(total=None, failed=True, error=str(fail), errors={"reward": fail},
                                    details={"reward": details}))
        else:
            out.append(RewardResult.ok(wins[k] / (n - 1), details={"reward": details}))
    return out


__all__ = ["GenRMClient", "JudgeConfig", "JudgeStats", "Verdict", "genrm", "genrm_group_pairwise", "judge_client"]
