"""Several engines behind one door: least-loaded routing with session affinity, health checks,
failover, pause/continue and abort across engines, weight sync, and elastic add/drain/remove.

An episode is a *session*: its first request goes to the least-loaded ready engine and every
later turn goes to the same engine while that engine is healthy (its KV prefix cache stays
warm). When an engine fails, it is marked unhealthy, its sessions are unbound, and their next
request goes elsewhere -- the rollout manager retries the interrupted turn from the episode's
last completed state, so nothing is lost. A periodic health check revives engines that answer
again, after bringing them to the current weights.

Weight updates: :meth:`EngineRouter.pause` stops new requests and (mode ``abort``) makes the
engines return in-flight requests with ``finish_reason=abort`` and the tokens generated so far;
the manager keeps those tokens and resumes them after :meth:`EngineRouter.resume`. New and
revived engines get the current weights before they take traffic -- through the ``weight_sync``
hook (the trainer's publisher, :mod:`relax_gym.trainer.weights`), else from the folder
:meth:`EngineRouter.update_weights_from_disk` recorded -- and are checked through
``/get_model_info``. A publisher drives a sync through a small API: :meth:`~EngineRouter.live_engines`,
:meth:`~EngineRouter.paused_for_update`, :meth:`~EngineRouter.set_current_weights`,
:meth:`~EngineRouter.confirm_weights`, :meth:`~EngineRouter.probe_engines` and
:meth:`~EngineRouter.mark_unhealthy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from relax_gym.errors import RelaxGymError
from relax_gym.trainer.engines.in_process import engine_client
from relax_gym.protocol import (
    EngineClient,
    EngineClosed,
    EngineError,
    GenerateRequest,
    GenerateResponse,
    UpdateWeightsFromDiskRequest,
)

log = logging.getLogger(__name__)

EngineState = Literal["syncing", "ready", "draining", "unhealthy", "removed"]
#: ``hook(handle, version)`` brings one engine to the current weights (e.g. the trainer pushing them)
WeightSyncHook = Callable[["EngineHandle", str], Awaitable[object]]
#: ``listener(event, url)`` with event ``"added"`` or ``"removed"`` (keeps another router in step)
ChangeListener = Callable[[str, str], Awaitable[object]]


class NoEngineAvailable(RelaxGymError):
    """No healthy engine could take a request within the wait limit."""


class WeightSyncError(RelaxGymError):
    """An engine could not be brought to the current weights."""


def parse_weight_version(value: str | int | None) -> int:
    """Weight versions on the wire are strings (SGLang's ``weight_version``); per-token versions
    in a trajectory are ints. A numeric string (or one ending in digits, e.g. ``step_12``) maps
    to that number; ``None``, ``""`` and SGLang's initial ``"default"`` map to 0."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    match = re.search(r"(\d+)$", value.strip())
    return int(match.group(1)) if match else 0


@dataclass(slots=True, eq=False)
class EngineHandle:
    """One engine as the router sees it."""

    id: str
    url: str
    clients: list[EngineClient]  # connection-pool shards; clients[0] also carries control calls
    state: EngineState = "syncing"
    inflight: int = 0
    sessions: set[str] = field(default_factory=set)
    weight_version: str | None = None
    failures: int = 0
    missed_health: int = 0  # consecutive periodic health checks without an answer
    served: int = 0
    # ``served`` at the previous periodic check: an engine that finished requests since then is
    # alive even when its /health answer came late (a CPU engine deep in a large batch)
    served_at_check: int = 0
    last_error: str | None = None
    added_at: float = field(default_factory=time.monotonic)
    draining_done: asyncio.Event = field(default_factory=asyncio.Event)
    make_client: Callable[[], EngineClient] | None = None  # builds another pool shard
    max_shards: int = 1
    shard_size: int = 16
    shard_load: list[int] = field(default_factory=lambda: [0])
    probe: asyncio.Task[bool] | None = None

    @property
    def client(self) -> EngineClient:
        return self.clients[0]

    def pick_shard(self) -> int:
        """The least-loaded connection-pool shard, adding one (up to ``max_shards``) when all are
        full. httpx's pool scans every connection it holds for each request, so a single pool
        of hundreds of connections costs milliseconds of CPU per request; small shards keep
        that scan short, and shards are only created when the load needs them."""
        best = min(range(len(self.clients)), key=self.shard_load.__getitem__)
        if self.shard_load[best] >= self.shard_size and len(self.clients) < self.max_shards and self.make_client:
            self.clients.append(self.make_client())
            self.shard_load.append(0)
            return len(self.clients) - 1
        return best

    @property
    def busy(self) -> bool:
        """Requests acquired for it, or calls (generate or control) still in flight on its clients."""
        return self.inflight > 0 or any(c.inflight for c in self.clients)

    async def aclose(self, *, grace_s: float = 0.0) -> None:
        for client in self.clients:
            await client.aclose(grace_s=grace_s)

    @property
    def takes_new_sessions(self) -> bool:
        return self.state == "ready"

    @property
    def serves_bound_sessions(self) -> bool:
        return self.state in ("ready", "draining")

    def status(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "state": self.state,
            "inflight_requests": self.inflight,
            "sessions": len(self.sessions),
            "weight_version": self.weight_version,
            "served_requests": self.served,
            "failures": self.failures,
            "last_error": self.last_error,
        }


class EngineRouter:
    """Routes generate requests over a changing set of engines; see the module docstring."""

    def __init__(
        self,
        urls: Sequence[str] = (),
        *,
        api_key: str | None = None,
        request_timeout_s: float = 300.0,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 2.0,
        unhealthy_after: int = 3,
        no_engine_timeout_s: float = 60.0,
        max_connections: int = 256,
        connections_per_shard: int = 16,
        client_factory: Callable[[str, int], EngineClient] | None = None,
        weight_sync: WeightSyncHook | None = None,
        on_change: ChangeListener | None = None,
        close_grace_s: float = 10.0,
    ) -> None:
        self._initial_urls = list(urls)
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        # A CPU engine busy with a long batch may answer one /health late; only this many
        # silent checks in a row mark it unhealthy (a failed request's probe still acts at once).
        self.unhealthy_after = max(1, unhealthy_after)
        self.no_engine_timeout_s = no_engine_timeout_s
        # a removed engine's requests and control calls in flight get this long before its
        # client closes (calls still running then fail with EngineClosed)
        self.close_grace_s = max(0.0, close_grace_s)
        self._shards = max(1, -(-max_connections // max(1, connections_per_shard)))
        per_shard = -(-max_connections // self._shards)
        self._client_factory = client_factory or (
            lambda url, n: engine_client(url, api_key=api_key, timeout_s=request_timeout_s, max_connections=n)
        )
        self._per_shard = per_shard
        # brings a new or revived engine to the current weights; default: update_weights_from_disk
        self.weight_sync = weight_sync
        self.on_change = on_change
        self._engines: dict[str, EngineHandle] = {}
        self._bindings: dict[str, EngineHandle] = {}  # session -> engine
        self._ids = itertools.count()
        self._changed = asyncio.Condition()
        self._running = asyncio.Event()
        self._running.set()
        self._health_task: asyncio.Task[None] | None = None
        self._drain_tasks: set[asyncio.Task[None]] = set()
        self._removals: dict[str, asyncio.Task[None]] = {}
        self._sync_lock = asyncio.Lock()
        self.weights_path: str | None = None
        self.weight_version: str | None = None
        self.events: dict[str, int] = {"failovers": 0, "revived": 0, "marked_unhealthy": 0, "added": 0,
                                       "removed": 0, "weight_syncs": 0}

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> Self:
        """Check the initial engines (those down start unhealthy) and start the health loop."""
        for url in self._initial_urls:
            handle = self._new_handle(url)
            if await handle.client.health(timeout_s=self.health_timeout_s):
                with contextlib.suppress(EngineError):
                    handle.weight_version = (await handle.client.model_info()).weight_version
                handle.state = "ready"
            else:
                handle.state = "unhealthy"
                handle.last_error = "not healthy at start"
        if self.weight_version is None:
            versions = {h.weight_version for h in self._engines.values() if h.state == "ready"}
            if len(versions) == 1:
                self.weight_version = versions.pop()
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop(), name="engine-health")
        await self._notify()
        return self

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        removals = list(self._drain_tasks)
        for task in removals:
            task.cancel()  # each closes its engine's client on the way out
        await asyncio.gather(*removals, return_exceptions=True)
        for handle in list(self._engines.values()):
            await handle.aclose()
        self._engines.clear()
        self._bindings.clear()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _new_handle(self, url: str, engine_id: str | None = None) -> EngineHandle:
        engine_id = engine_id or f"e{next(self._ids)}"
        if engine_id in self._engines:
            raise ValueError(f"engine id {engine_id!r} is taken")
        handle = EngineHandle(id=engine_id, url=url.rstrip("/"), clients=[self._client_factory(url, self._per_shard)],
                              make_client=lambda: self._client_factory(url, self._per_shard), max_shards=self._shards,
                              shard_size=self._per_shard)
        self._engines[engine_id] = handle
        return handle

    # -- views --------------------------------------------------------------------------------------
    @property
    def engines(self) -> list[EngineHandle]:
        return list(self._engines.values())

    def get(self, engine_id: str) -> EngineHandle | None:
        return self._engines.get(engine_id)

    def list_engines(self) -> list[dict[str, Any]]:
        return [h.status() for h in self._engines.values()]

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def live(self) -> list[EngineHandle]:
        """Engines that serve (ready, or draining their bound sessions): the ones to pause, sync
        and resume."""
        return [h for h in self._engines.values() if h.serves_bound_sessions]

    async def live_engines(self, *, wait_s: float = 0.0) -> list[EngineHandle]:
        """Engines that can take new weights (ready or draining). With ``wait_s`` > 0 and none
        live, wait up to that long for the health loop to revive one, instead of failing a
        weight sync because the only engine missed a few health checks under load."""
        deadline = time.monotonic() + wait_s
        while True:
            live = self.live()
            left = deadline - time.monotonic()
            if live or left <= 0:
                return live
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=min(left, self.health_interval_s))

    # -- routing ------------------------------------------------------------------------------------
    async def acquire(self, session: str, *, timeout_s: float | None = None) -> EngineHandle:
        """The engine for the session's next request; waits while paused or while no engine can
        take it, up to ``no_engine_timeout_s``. Pair every call with :meth:`release`."""
        deadline = time.monotonic() + (self.no_engine_timeout_s if timeout_s is None else timeout_s)
        while True:
            if self._running.is_set():
                handle = self._pick(session)
                if handle is not None:
                    handle.inflight += 1
                    return handle
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoEngineAvailable(
                    "no engine could take the request" + (" (rollouts are paused)" if self.paused else "")
                    + f"; engines: {[(h.id, h.state) for h in self._engines.values()]}"
                )
            async with self._changed:  # woken by resume / add / revive; the timeout bounds a missed wake-up
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.5))

    def _pick(self, session: str) -> EngineHandle | None:
        bound = self._bindings.get(session)
        if bound is not None:
            if bound.serves_bound_sessions and bound.id in self._engines:
                return bound
            self._unbind(session)
        candidates = [h for h in self._engines.values() if h.takes_new_sessions]
        if not candidates:
            return None
        best = min(candidates, key=lambda h: (h.inflight, len(h.sessions), h.served))
        self._bindings[session] = best
        best.sessions.add(session)
        return best

    def _unbind(self, session: str) -> None:
        handle = self._bindings.pop(session, None)
        if handle is not None:
            handle.sessions.discard(session)
            if handle.state == "draining" and not handle.sessions:
                handle.draining_done.set()

    def release(self, handle: EngineHandle, *, ok: bool = True) -> None:
        handle.inflight = max(0, handle.inflight - 1)
        if ok:
            handle.served += 1

    def end_session(self, session: str) -> None:
        """The episode finished: free its binding (a draining engine may now be removed)."""
        self._unbind(session)

    async def report_failure(self, session: str, handle: EngineHandle, error: str, *, unreachable: bool) -> None:
        """A request of ``session`` failed on ``handle``: unbind the session so its retry may go
        elsewhere. When the engine looked unreachable, probe ``/health`` (one probe at a time
        per engine): a dead engine is marked unhealthy for everyone, while a single dropped
        keep-alive connection on a live engine is not."""
        self.events["failovers"] += 1
        handle.failures += 1
        handle.last_error = error
        self._unbind(session)
        if not unreachable or handle.state not in ("ready", "draining", "syncing"):
            return
        if handle.probe is None or handle.probe.done():
            handle.probe = asyncio.create_task(handle.client.health(timeout_s=self.health_timeout_s))
        alive = await asyncio.shield(handle.probe)
        if not alive and handle.state in ("ready", "draining", "syncing"):
            self.mark_unhealthy(handle, error)

    def mark_unhealthy(self, handle: EngineHandle, error: str) -> None:
        """Take an engine out of service (its sessions move elsewhere); the health loop revives it,
        current weights first, once it answers again."""
        if handle.state == "removed":  # a call that raced the removal: nothing to mark
            return
        log.warning("engine %s (%s) is unhealthy: %s", handle.id, handle.url, error)
        was_draining = handle.state == "draining"
        handle.state = "unhealthy"
        handle.last_error = error
        self.events["marked_unhealthy"] += 1
        for session in list(handle.sessions):
            self._unbind(session)
        if was_draining:  # nothing can finish there any more: complete the removal
            handle.draining_done.set()

    async def generate(self, handle: EngineHandle, request: GenerateRequest,
                       *, timeout_s: float | None = None) -> GenerateResponse:
        shard = handle.pick_shard()
        handle.shard_load[shard] += 1
        try:
            return await handle.clients[shard].generate(request, timeout_s=timeout_s)
        finally:
            handle.shard_load[shard] -= 1

    # -- health -------------------------------------------------------------------------------------
    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_health()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("health check failed")

    async def check_health(self) -> None:
        """Ping every engine once: mark the silent ones unhealthy, revive those that answer."""
        handles = [h for h in self._engines.values() if h.state in ("ready", "draining", "unhealthy")]
        results = await asyncio.gather(*(h.client.health(timeout_s=self.health_timeout_s) for h in handles))
        changed = False
        for handle, answered in zip(handles, results, strict=True):
            served_since = handle.served > handle.served_at_check
            handle.served_at_check = handle.served
            ok = answered or (served_since and handle.state != "unhealthy")
            handle.missed_health = 0 if ok else handle.missed_health + 1
            if not ok and handle.state in ("ready", "draining") and handle.missed_health >= self.unhealthy_after:
                self.mark_unhealthy(handle, f"{handle.missed_health} health checks in a row failed")
                changed = True
            elif ok and handle.state == "unhealthy" and handle.id in self._engines:
                try:
                    await self._bring_to_current_weights(handle)
                except (EngineError, WeightSyncError) as exc:
                    handle.last_error = f"revival failed: {exc}"
                    continue
                if handle.state != "unhealthy" or handle.id not in self._engines:
                    continue  # removed while it was being synced
                handle.state = "ready"
                handle.failures = 0
                self.events["revived"] += 1
                changed = True
        if changed:
            await self._notify()

    # -- weights ------------------------------------------------------------------------------------
    def set_weight_sync(self, hook: WeightSyncHook | None) -> None:
        """Use ``hook(handle, version)`` to bring new and revived engines to the current weights."""
        self.weight_sync = hook

    async def _bring_to_current_weights(self, handle: EngineHandle) -> None:
        """Bring ``handle`` to the current weights and verify ``/get_model_info`` reports the current
        version. The sync is the ``weight_sync`` hook when one was given (e.g. the trainer pushing
        tensors), else ``/update_weights_from_disk`` with the recorded checkpoint. A version
        published while the push ran is pushed again (up to three pushes)."""
        info = await handle.client.model_info()
        for _ in range(3):
            wanted = self.weight_version
            if wanted is None or info.weight_version == wanted:
                break
            if self.weight_sync is not None:
                await self.weight_sync(handle, wanted)
            elif self.weights_path is not None:
                await handle.client.update_weights_from_disk(
                    UpdateWeightsFromDiskRequest(model_path=self.weights_path, weight_version=wanted))
            info = await handle.client.model_info()
            self.events["weight_syncs"] += 1
            if self.weight_version == wanted:
                break  # nothing newer landed meanwhile: the check below is final
        if self.weight_version is not None and info.weight_version != self.weight_version:
            raise WeightSyncError(
                f"engine {handle.id} reports weight version {info.weight_version!r}, expected {self.weight_version!r}"
                + ("" if self.weights_path or self.weight_sync else " (no checkpoint or hook to sync it from)")
            )
        handle.weight_version = info.weight_version

    def set_current_weights(self, weight_version: str | int, model_path: str | None = None, *,
                            served: bool = False) -> None:
        """Record the weights every engine should serve: engines added or revived later are brought
        to them (``model_path``, when given, is an HF folder they can be loaded from). ``served``:
        the caller has made every live engine serve them (shown in :meth:`list_engines`)."""
        self.weight_version = str(weight_version)
        if model_path is not None:
            self.weights_path = model_path
        if served:
            for handle in self.live():
                handle.weight_version = self.weight_version

    async def confirm_weights(self, handles: Sequence[EngineHandle],
                              weight_version: str | int) -> dict[EngineHandle, str]:
        """Check each engine's ``/get_model_info`` after an update. Those reporting ``weight_version``
        are recorded as serving it; the others come back with why, for the caller to retry or
        :meth:`mark_unhealthy` (an engine must never serve old or half-loaded weights)."""
        version = str(weight_version)

        async def check(handle: EngineHandle) -> str | None:
            try:
                reported = (await handle.client.model_info()).weight_version
            except EngineError as exc:
                return f"weight check failed: {exc}"
            if reported != version:
                return f"reports weight version {reported!r} after the update, expected {version!r}"
            handle.weight_version = version
            self.events["weight_syncs"] += 1
            return None

        problems = await asyncio.gather(*(check(h) for h in handles))
        return {h: why for h, why in zip(handles, problems, strict=True) if why is not None}

    async def probe_engines(self, handles: Sequence[EngineHandle], error: str) -> list[EngineHandle]:
        """After a failed call that cannot be pinned on one engine: ping each once and mark the
        silent ones unhealthy now (without waiting for the health loop). Returns those alive."""
        alive = await asyncio.gather(*(h.client.health(timeout_s=self.health_timeout_s) for h in handles))
        for handle, ok in zip(handles, alive, strict=True):
            if not ok and handle.state in ("ready", "draining", "syncing"):
                self.mark_unhealthy(handle, error)
        return [h for h, ok in zip(handles, alive, strict=True) if ok]

    async def update_weights_from_disk(self, model_path: str, weight_version: str | int) -> None:
        """Load a checkpoint into every live engine and record it for engines added later.

        Call it between :meth:`pause` and :meth:`resume`. An engine that fails the update is
        marked unhealthy (the health loop retries it with the recorded checkpoint).
        """
        version = str(weight_version)
        request = UpdateWeightsFromDiskRequest(model_path=model_path, weight_version=version)
        async with self._sync_lock:
            self.set_current_weights(version, model_path)
            targets = self.live()
            results = await asyncio.gather(*(h.client.update_weights_from_disk(request) for h in targets),
                                           return_exceptions=True)
            loaded = []
            for handle, res in zip(targets, results, strict=True):
                if isinstance(res, EngineError):
                    self.mark_unhealthy(handle, f"weight update failed: {res}")
                elif isinstance(res, BaseException):
                    raise res
                else:
                    loaded.append(handle)
            for handle, why in (await self.confirm_weights(loaded, version)).items():
                self.mark_unhealthy(handle, why)
        await self._notify()

    # -- pause / abort ------------------------------------------------------------------------------
    async def pause(self, mode: Literal["abort", "retract", "in_place"] = "abort") -> None:
        """Stop handing out engines and pause every engine. With ``abort``, in-flight requests
        return now with ``finish_reason=abort`` and their partial tokens."""
        self._running.clear()
        targets = self.live()
        results = await asyncio.gather(*(h.client.pause_generation(mode) for h in targets), return_exceptions=True)
        for handle, res in zip(targets, results, strict=True):
            if isinstance(res, EngineError):
                self.mark_unhealthy(handle, f"pause failed: {res}")

    async def resume(self) -> None:
        """Continue generation on every engine and let requests flow again."""
        targets = self.live()
        results = await asyncio.gather(*(h.client.continue_generation() for h in targets), return_exceptions=True)
        for handle, res in zip(targets, results, strict=True):
            if isinstance(res, EngineError):
                self.mark_unhealthy(handle, f"continue failed: {res}")
        self._running.set()
        await self._notify()

    @contextlib.asynccontextmanager
    async def paused_for_update(self) -> AsyncIterator[None]:
        """``async with router.paused_for_update(): await router.update_weights_from_disk(...)``"""
        await self.pause("abort")
        try:
            yield
        finally:
            await self.resume()

    async def abort_all(self) -> None:
        """Abort every in-flight request on every engine (they return with ``finish_reason=abort``)."""
        targets = self.live()
        await asyncio.gather(*(h.client.abort(None) for h in targets), return_exceptions=True)

    # -- elastic scaling ----------------------------------------------------------------------------
    async def add_engine(self, url: str, *, engine_id: str | None = None) -> EngineHandle:
        """Add an engine: check it, bring it to the current weights, then let it take traffic.
        Raises :class:`EngineError` / :class:`WeightSyncError` (and forgets the engine) on failure."""
        url = url.rstrip("/")
        if any(h.url == url and h.state != "removed" for h in self._engines.values()):
            raise ValueError(f"engine {url} is already registered")
        handle = self._new_handle(url, engine_id)
        try:
            if not await handle.client.health(timeout_s=self.health_timeout_s):
                raise EngineError(url, "not healthy")
            async with self._sync_lock:
                await self._bring_to_current_weights(handle)
        except (EngineError, WeightSyncError):
            if self._engines.get(handle.id) is handle:
                self._engines.pop(handle.id)
            await handle.aclose()
            raise
        if handle.state != "syncing":  # remove_engine was called meanwhile: it owns the handle now
            raise EngineClosed(url, f"engine {handle.id} was removed while it was being added")
        handle.state = "ready"
        self.events["added"] += 1
        await self._notify()
        if self.on_change is not None:
            await self.on_change("added", handle.url)
        return handle

    async def remove_engine(self, engine_id: str, *, drain: bool = True, wait: bool = True,
                            timeout_s: float | None = None) -> None:
        """Remove an engine without cutting anything off mid-call.

        1. It takes no new sessions; with ``drain`` its bound sessions finish there first (up to
           ``timeout_s``; None waits for them).
        2. It is marked ``removed``: no request, control call or health check is routed to it
           any more.
        3. Requests and control calls already in flight get up to ``close_grace_s`` to finish.
        4. Its client closes. A call that still races the removal fails with
           :class:`EngineClosed` (an :class:`EngineUnavailable`), never a closed-client crash.

        Removing an engine that is already being removed joins that removal. With
        ``wait=False`` the removal runs in the background and this returns at once. The
        ``on_change`` listener hears of a removal this call started (after it, with ``wait``).
        """
        handle = self._engines.get(engine_id)
        task = self._removals.get(engine_id)
        started = task is None
        if task is None:
            if handle is None:
                raise KeyError(engine_id)
            if handle.state in ("ready", "syncing"):
                handle.state = "draining"
            if not handle.sessions or handle.state == "unhealthy" or not drain:
                handle.draining_done.set()
            task = asyncio.create_task(self._remove(handle, timeout_s), name=f"remove-{engine_id}")
            self._removals[engine_id] = task
            self._drain_tasks.add(task)
            task.add_done_callback(self._drain_tasks.discard)
            task.add_done_callback(lambda _t: self._removals.pop(engine_id, None))
        if wait:
            await asyncio.shield(task)
        if started and handle is not None and self.on_change is not None:
            await self.on_change("removed", handle.url)

    async def _remove(self, handle: EngineHandle, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(handle.draining_done.wait(), timeout_s)
        except TimeoutError:
            log.warning("engine %s did not drain in %.0f s; removing it anyway", handle.id, timeout_s or 0)
        handle.state = "removed"
        for session in list(handle.sessions):
            self._unbind(session)
        if self._engines.get(handle.id) is handle:
            self._engines.pop(handle.id)
        self.events["removed"] += 1
        await self._notify()
        try:
            deadline = time.monotonic() + self.close_grace_s
            while handle.busy and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if handle.busy:
                log.warning("engine %s still had calls in flight %.0f s after its removal; closing it anyway",
                            handle.id, self.close_grace_s)
        finally:
            await handle.aclose()


__all__ = [
    "ChangeListener",
    "EngineHandle",
    "EngineRouter",
    "EngineState",
    "NoEngineAvailable",
    "WeightSyncError",
    "WeightSyncHook",
    "parse_weight_version",
]
