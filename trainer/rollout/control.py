"""Elastic control REST API: add and remove engines while rollouts run.

Every endpoint needs ``Authorization: Bearer <token>`` (401 otherwise); the server binds
127.0.0.1 unless told otherwise, and runs on the rollout manager's event loop, so it acts on the
live :class:`EngineRouter`:

* ``GET /engines`` -- every engine with its state, load, sessions and weight version;
* ``POST /engines`` ``{"url": ..., "id": optional}`` -- add an engine; it is brought to the
  current weights (the router's ``weight_sync`` hook -- the trainer's publisher -- or
  ``/update_weights_from_disk`` with the recorded checkpoint; verified through
  ``/get_model_info``) before it takes traffic. 201 with its status;
  409 if the URL is registered; 502 if it is unreachable or the weight sync fails;
* ``POST /engines`` ``{"launch": true, "id": optional}`` -- *start* a new engine of the run's
  ``engine.kind`` (an embedded engine on CPU, an SGLang server on the next GPUs), wait for its
  health, then add it as above. 201 with its status (``"launched": true``); 409 when the run
  launches no engines (``engine.kind: external``); 502 if it does not start;
* ``DELETE /engines/{id}`` -- drain (no new episodes; those bound to it finish there), then
  remove; an engine the API launched is then stopped. 202 at once (``?wait=true``: 200 when
  removed); 404 for an unknown id;
* ``GET /metrics`` -- the router's event counters and, when a manager is attached, its metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import secrets
from typing import Any, Protocol, Self

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from relax_gym.protocol import EngineError

from relax_gym.trainer.rollout.manager import RolloutManager
from relax_gym.trainer.rollout.router import EngineRouter, WeightSyncError

log = logging.getLogger(__name__)


class AddEngineBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = None
    launch: bool = False
    id: str | None = None


class EngineLauncher(Protocol):
    """Starts and stops engines for the control API (the producer's scale-out fleet)."""

    async def launch(self) -> str: ...  # the new engine's URL, once healthy

    async def stop(self, url: str) -> bool: ...  # False when it did not launch that engine


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build_app(router: EngineRouter, token: str, manager: RolloutManager | None = None,
              launcher: EngineLauncher | None = None) -> Starlette:
    """The Starlette app; see the module docstring for the endpoints."""
    if not token:
        raise ValueError("the control API needs a non-empty token")
    expected = f"Bearer {token}".encode()

    def authorized(request: Request) -> bool:
        return hmac.compare_digest(request.headers.get("authorization", "").encode(), expected)

    async def list_engines(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "missing or wrong bearer token")
        return JSONResponse({"engines": router.list_engines(), "weight_version": router.weight_version,
                             "paused": router.paused})

    async def add_engine(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "missing or wrong bearer token")
        try:
            body = AddEngineBody.model_validate(await request.json())
        except (ValidationError, ValueError) as exc:
            return _error(422, f"body must be {{\"url\": ...}} or {{\"launch\": true}}, \"id\" optional: {exc}")
        if (body.url is None) == (not body.launch):
            return _error(422, "give exactly one of \"url\" (a running engine) or \"launch\": true (start one)")
        if body.launch:
            return await launch_engine(body.id)
        assert body.url is not None
        if not body.url.startswith(("http://", "https://")):
            return _error(422, f"url must start with http:// or https://, got {body.url!r}")
        try:
            handle = await router.add_engine(body.url, engine_id=body.id)
        except ValueError as exc:
            return _error(409, str(exc))
        except (EngineError, WeightSyncError) as exc:
            return _error(502, f"engine not added: {exc}")
        return JSONResponse(handle.status(), status_code=201)

    async def launch_engine(engine_id: str | None) -> JSONResponse:
        if launcher is None:
            return _error(409, "this run cannot launch engines here; POST the url of a running one")
        if engine_id is not None and router.get(engine_id) is not None:
            return _error(409, f"engine id {engine_id!r} is taken")
        try:
            url = await launcher.launch()
        except ValueError as exc:  # engine.kind: external
            return _error(409, str(exc))
        except Exception as exc:  # noqa: BLE001 - a start failure is the caller's answer, not a crash
            log.warning("launching an engine failed: %s", exc)
            return _error(502, f"engine not launched: {type(exc).__name__}: {exc}")
        try:
            handle = await router.add_engine(url, engine_id=engine_id)
        except (ValueError, EngineError, WeightSyncError) as exc:
            await launcher.stop(url)  # never leave a process nobody routes to
            return _error(502, f"engine launched at {url} but not added (stopped again): {exc}")
        return JSONResponse({**handle.status(), "launched": True}, status_code=201)

    async def remove_engine(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "missing or wrong bearer token")
        engine_id = request.path_params["engine_id"]
        handle = router.get(engine_id)
        if handle is None:
            return _error(404, f"no engine {engine_id!r}")
        wait = request.query_params.get("wait", "false").lower() in ("1", "true", "yes")
        await router.remove_engine(engine_id, drain=True, wait=wait)
        if launcher is not None:  # an engine the API launched is stopped once removed (in the background unless waited for)
            task = asyncio.create_task(_stop_when_removed(handle.url, engine_id))
            stopping.add(task)
            task.add_done_callback(stopping.discard)
            if wait:
                await asyncio.shield(task)
        if wait:
            return JSONResponse({"id": engine_id, "state": "removed"}, status_code=200)
        return JSONResponse({"id": engine_id, "state": handle.state}, status_code=202)

    stopping: set[asyncio.Task[None]] = set()

    async def _stop_when_removed(url: str, engine_id: str) -> None:
        assert launcher is not None
        with contextlib.suppress(KeyError):  # the removal already finished: nothing to join
            await router.remove_engine(engine_id, drain=True, wait=True)
        try:
            await launcher.stop(url)
        except Exception as exc:  # noqa: BLE001 - a background task: log, never raise into the loop
            log.warning("stopping launched engine %s failed: %s", url, exc)

    async def metrics(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "missing or wrong bearer token")
        out: dict[str, Any] = {"router": dict(router.events)}
        if manager is not None:
            out["rollout"] = manager.metrics.snapshot()
        return JSONResponse(out)

    return Starlette(routes=[
        Route("/engines", list_engines, methods=["GET"]),
        Route("/engines", add_engine, methods=["POST"]),
        Route("/engines/{engine_id:str}", remove_engine, methods=["DELETE"]),
        Route("/metrics", metrics, methods=["GET"]),
    ])


class ControlServer:
    """Serves :func:`build_app` with uvicorn on the current event loop.

    ``token=None`` generates one (read it from ``server.token``). A non-loopback ``host`` must be
    allowed explicitly with ``allow_remote=True``.
    """

    def __init__(self, router: EngineRouter, *, token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 manager: RolloutManager | None = None, allow_remote: bool = False,
                 launcher: EngineLauncher | None = None) -> None:
        if not allow_remote and not _is_loopback(host):
            raise ValueError(f"refusing to bind the control API to {host}; pass allow_remote=True to do so")
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        self.port = port
        self.app = build_app(router, self.token, manager, launcher)
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> Self:
        import uvicorn

        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off",
                                access_log=False)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None
        self._task = asyncio.create_task(self._server.serve(), name="rollout-control")
        for _ in range(500):  # bounded wait for the socket
            if self._server.started:
                break
            if self._task.done():
                self._task.result()
                raise RuntimeError("the control server stopped while starting")
            await asyncio.sleep(0.01)
        else:
            raise RuntimeError("the control server did not start within 5 s")
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, timeout=5)
            self._task = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


__all__ = ["AddEngineBody", "ControlServer", "EngineLauncher", "build_app"]
