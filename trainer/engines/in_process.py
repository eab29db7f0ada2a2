"""The embedded engine inside the trainer's process, reached without a socket.

In colocate mode on CPU the engine and the trainer take turns: while the engine generates, the
trainer only waits for its replies. As a child process behind HTTP, each rollout paid a round
trip per request (a /generate of 32 rows was 32 requests through TCP, uvicorn and a second
event loop), and the engine's process competed for a core with the trainer's (the box running
both often had two cores in all). Here the engine's scheduler thread runs in the trainer's
process and :class:`InProcessClient` hands each call straight to the engine's ASGI app: the
same routes, the same request models and checks, the same SGLang-shaped replies, so the router,
the rollout manager and the weight publisher cannot tell it from the HTTP engine.

:class:`InProcessEngine` is what the fleet starts for ``engine.placement: in_process`` (and for
``auto`` in colocate mode with embedded engines; see docs/engine.md). Its ``url``
(``http://in-process-engine-<n>``) names it to the router; :func:`client_for` turns such a URL
back into a client for the live engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx

from pydantic import ValidationError

from relax_gym.protocol import (
    EngineClient,
    EngineClosed,
    EngineError,
    EngineTimeout,
    EngineUnavailable,
    GenerateRequest,
    GenerateResponse,
    _json_body,
)

log = logging.getLogger("relax_gym.engine")

URL_PREFIX = "http://in-process-engine-"

_ids = itertools.count()
_live: dict[str, InProcessEngine] = {}
_live_lock = threading.Lock()


class InProcessEngine:
    """One embedded engine (model, scheduler thread, routes) living in this process."""

    def __init__(self, model: str | Path, *, api_key: str | None = None, seed: int = 0, max_batch_size: int = 64,
                 weight_version: str = "0") -> None:
        from relax_gym.trainer.engines.embedded import EmbeddedOptions

        self.opts = EmbeddedOptions(model=str(model), api_key=api_key, seed=seed, max_batch_size=max_batch_size,
                                    weight_version=weight_version)
        self.url = f"{URL_PREFIX}{next(_ids)}"
        self.engine: Any = None
        self.service: Any = None
        self.app: Any = None

    def start(self) -> None:
        from relax_gym.trainer.engines.embedded import build_engine

        if not (Path(self.opts.model) / "config.json").is_file():
            raise FileNotFoundError(f"{self.opts.model} is not a Hugging Face model folder (no config.json)")
        from relax_gym.trainer.engines.server import build_app

        self.engine, self.service = build_engine(self.opts)  # threads: the trainer's own setting
        self.app = build_app(self.service)
        self.engine.start()
        with _live_lock:
            _live[self.url] = self

    @property
    def running(self) -> bool:
        return self.engine is not None and self.engine.alive

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the scheduler thread (requests still in flight end as aborted) and forget the engine."""
        with _live_lock:
            _live.pop(self.url, None)
        if self.engine is not None:
            self.engine.stop(timeout_s)

    def client(self, *, timeout_s: float = 300.0) -> InProcessClient:
        return InProcessClient(self, api_key=self.opts.api_key, timeout_s=timeout_s)

    def __enter__(self) -> InProcessEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def is_in_process_url(url: str) -> bool:
    return url.startswith(URL_PREFIX)


def client_for(url: str, *, api_key: str | None = None, timeout_s: float = 300.0) -> InProcessClient:
    """A client for the live in-process engine at ``url``; :class:`EngineUnavailable` when it is gone."""
    with _live_lock:
        engine = _live.get(url.rstrip("/"))
    if engine is None:
        raise EngineUnavailable(url, "no in-process engine by this name is running")
    return InProcessClient(engine, api_key=api_key, timeout_s=timeout_s)


def engine_client(url: str, *, api_key: str | None = None, timeout_s: float = 300.0,
                  max_connections: int = 256) -> EngineClient:
    """The client for ``url``: the socket-free one for an engine in this process, else HTTP.
    Everything in the trainer that reaches an engine by URL makes its client here."""
    if is_in_process_url(url):
        return client_for(url, api_key=api_key, timeout_s=timeout_s)
    return EngineClient(url, api_key=api_key, timeout_s=timeout_s, max_connections=max_connections)


class InProcessClient(EngineClient):
    """:class:`EngineClient` whose calls go to an :class:`InProcessEngine`'s routes in this event
    loop (httpx's ASGI transport) instead of through a socket. ``generate`` -- every rollout
    turn -- skips the ASGI layers too: the same body goes through the route's own parsing, checks
    and submission (``EngineService.generate_body``), without the route's disconnect polling,
    which cost more CPU than the rest of the call. Failures map as the HTTP client's do: a
    stopped engine is :class:`EngineUnavailable`, an error reply :class:`EngineError` with the
    route's status, a call past its timeout :class:`EngineTimeout`."""

    def __init__(self, engine: InProcessEngine, *, api_key: str | None = None, timeout_s: float = 300.0) -> None:
        super().__init__(engine.url, api_key=api_key, timeout_s=timeout_s, transport="httpx")
        self.in_process = engine
        assert self._client is not None
        plain = self._client  # the socket client the base class made: never used, closed now
        self._client = httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                         transport=httpx.ASGITransport(app=engine.app))
        self._discard = plain

    async def aclose(self, *, grace_s: float = 0.0) -> None:
        await super().aclose(grace_s=grace_s)
        await self._discard.aclose()

    async def generate(self, request: GenerateRequest, *, timeout_s: float | None = None) -> GenerateResponse:
        service = self.in_process.service
        if service.config.protect_generation:  # the route checks the key: go through it
            return await super().generate(request, timeout_s=timeout_s)
        url = self.base_url + "/generate"
        self._check_open(url)
        body = _json_body(request)
        assert body is not None
        self._inflight += 1
        self._idle_event().clear()
        try:
            result = await asyncio.wait_for(service.generate_body(body), timeout_s or self.timeout_s)
        except TimeoutError:
            raise EngineTimeout(url, "timed out") from None
        except Exception as exc:  # noqa: BLE001 -- mapped as the route maps it
            status, kind, message = _route_error(exc)
            if status < 500 and status != 401:
                service.engine.stats.bad_requests += 1
            elif status >= 500:
                log.error("in-process /generate failed: %s: %s", type(exc).__name__, exc)
            detail = json.dumps({"object": "error", "error": {"message": message, "type": kind, "code": status}})
            raise EngineError(url, f"error reply: {detail[:500]}", status) from None
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle_event().set()
        try:
            return GenerateResponse.model_validate(result)
        except ValidationError as exc:
            raise EngineError(url, f"unparseable reply: {exc}") from None

    def _check_open(self, url: str) -> None:
        if self._closed:
            raise EngineClosed(url, "client closed (the engine was removed); call not sent")
        if not self.in_process.running:
            raise EngineUnavailable(url, "the in-process engine is stopped")

    async def _send(self, method: str, path: str, url: str, body: bytes | None,
                    timeout_s: float | None) -> tuple[int, bytes]:
        self._check_open(url)
        assert self._client is not None
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs.update(content=body, headers={"Content-Type": "application/json"})
        try:
            resp = await asyncio.wait_for(self._client.request(method, path, **kwargs), timeout_s or self.timeout_s)
        except TimeoutError:
            raise EngineTimeout(url, "timed out") from None
        return resp.status_code, resp.content


def _route_error(exc: Exception) -> tuple[int, str, str]:
    """(status, type, message) of the reply the ``/generate`` route gives for ``exc``."""
    from relax_gym.trainer.engines.prepare import BadRequest, HTTPError

    if isinstance(exc, HTTPError):
        return exc.status, exc.kind, exc.message
    if isinstance(exc, BadRequest):
        return 400, "BadRequestError", str(exc)
    return 500, "InternalServerError", f"{type(exc).__name__}: {exc}"


__all__ = ["URL_PREFIX", "InProcessClient", "InProcessEngine", "client_for", "engine_client", "is_in_process_url"]
