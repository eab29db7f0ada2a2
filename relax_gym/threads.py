"""Blocking calls off the event loop, for less loop CPU per call than ``asyncio.to_thread``.

``Env.areset`` / ``Env.astep`` run the env in a worker thread so a blocking env never stalls the
other episodes. With hundreds of episodes in flight that hop is paid on every turn, and
``asyncio.to_thread`` pays for much it does not need here: a ``concurrent.futures.Future`` (a
``threading.Condition``), the executor's idle-semaphore bookkeeping, two futures chained both
ways and one self-pipe write per call -- about 50 us of event-loop CPU per call. :func:`run_in_thread`
keeps what an env call needs: a queue to the workers, one asyncio future per call, and results
handed back in batches (one loop wake-up for all results that finished together). The call runs
in a copy of the caller's context, as with ``to_thread``.

The workers are daemon threads shared by every event loop of the process, at most
``min(32, cpu_count + 4)`` (asyncio's default executor's bound); they start when calls wait for
one. A call still running when its caller is cancelled finishes and its result is dropped, as
with ``to_thread``; one still running when the interpreter exits is abandoned. A forked child
starts with an empty pool of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Inbox:
    """Results for one event loop: filled by workers, emptied on the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.results: deque[tuple[asyncio.Future[Any], bool, Any]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def put(self, future: asyncio.Future[Any], ok: bool, value: Any) -> None:
        """Worker side: queue the result; wake the loop unless a wake-up is already pending."""
        self.results.append((future, ok, value))
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody awaits these any more
            pass

    def _deliver(self) -> None:
        with self._lock:
            self._scheduled = False
        while self.results:
            future, ok, value = self.results.popleft()
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


class _Workers:
    """The shared pool: a job queue and up to ``max_workers`` daemon threads."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self._jobs: queue.SimpleQueue[tuple[_Inbox, asyncio.Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._inboxes: dict[asyncio.AbstractEventLoop, _Inbox] = {}

    def submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        inbox = self._inboxes.get(loop)
        if inbox is None:
            with self._lock:  # loops in other threads may be adding theirs
                self._inboxes = {lp: box for lp, box in self._inboxes.items() if not lp.is_closed()}
                inbox = self._inboxes.setdefault(loop, _Inbox(loop))
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((inbox, future, call))
        with self._lock:  # each call claims an idle worker, else starts one (up to the bound)
            if self._idle:
                self._idle -= 1
                return future
            if self._threads >= self.max_workers:
                return future  # the next worker to finish takes it
            self._threads += 1
            name = f"relax-gym-worker-{self._threads}"
        threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            inbox, future, call = self._jobs.get()
            try:
                value, ok = call(), True
            except BaseException as exc:  # noqa: BLE001 -- handed to the awaiting caller, as to_thread does
                value, ok = (RuntimeError(f"StopIteration raised in a worker thread: {exc}")
                             if isinstance(exc, StopIteration) else exc), False
            inbox.put(future, ok, value)
            del inbox, future, call, value
            with self._lock:
                self._idle += 1


_WORKERS = _Workers(min(32, (os.cpu_count() or 1) + 4))


def _fresh_pool_in_child() -> None:
    """A forked child has none of the parent's worker threads: start from an empty pool (the
    inherited one would count threads that do not exist and never start any)."""
    global _WORKERS
    _WORKERS = _Workers(_WORKERS.max_workers)


os.register_at_fork(after_in_child=_fresh_pool_in_child)


async def run_in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``await fn(*args, **kwargs)`` run in a worker thread (see the module docstring)."""
    context = contextvars.copy_context()
    return await _WORKERS.submit(lambda: context.run(fn, *args, **kwargs))


__all__ = ["run_in_thread"]
