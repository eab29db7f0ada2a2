"""Calling one reward function safely: sync or async, per sample or per group, with a timeout.

Every way a call can go wrong -- an exception, a timeout, a NaN, a wrong return type, a group
function returning the wrong number of results -- comes back as a :class:`Failure`, so the
caller never has to catch anything.

Sync functions run on a pool of reused daemon threads: a function that hangs past its timeout
is abandoned (recorded as a timeout) and cannot keep the interpreter from exiting. Threads are
capped, so a reward that always hangs cannot exhaust the process.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relax_gym.rewards.registry import RewardFn, Score
from relax_gym.rewards.types import Failure, RewardError, RewardInput, RewardResult, finite_float

log = logging.getLogger(__name__)

MAX_LIVE_THREADS = 64


@dataclass(slots=True)
class Outcome:
    """One component's value for one sample, or why there is none."""

    total: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None

    @classmethod
    def failed(cls, kind: Any, message: str, details: dict[str, Any] | None = None) -> Outcome:
        return cls(failure=Failure(kind, message), details=dict(details or {}))


def coerce_outcome(value: Any, what: str) -> Outcome:
    """Turn whatever a reward function returned into an :class:`Outcome`."""
    try:
        if isinstance(value, RewardResult):
            details: dict[str, Any] = {}
            for d in value.details.values():
                details.update(d)
            if value.failed or value.total is None:
                fail = next(iter(value.errors.values()), Failure("invalid", value.error or "failed without a reason"))
                return Outcome(failure=fail, details=details)
            return Outcome(
                total=finite_float(value.total, f"{what} total"),
                parts={k: finite_float(v, f"{what}[{k!r}]") for k, v in value.components.items()},
                details=details,
            )
        if isinstance(value, Score):
            return Outcome(
                total=finite_float(value.value, what),
                parts={k: finite_float(v, f"{what}[{k!r}]") for k, v in value.parts.items()},
                details=dict(value.details),
            )
        if isinstance(value, dict):
            if not value:
                raise RewardError("invalid", f"{what} returned an empty dict")
            parts = {str(k): finite_float(v, f"{what}[{k!r}]") for k, v in value.items() if k != "total"}
            total = finite_float(value["total"], f"{what}['total']") if "total" in value else sum(parts.values())
            return Outcome(total=total, parts=parts)
        if value is None:
            raise RewardError("invalid", f"{what} returned None (return a number, a dict, a Score or raise)")
        return Outcome(total=finite_float(value, what))
    except RewardError as exc:
        return Outcome(failure=Failure(exc.kind, exc.message), details=exc.details)


def _failure_from_exception(exc: BaseException, what: str) -> Outcome:
    if isinstance(exc, RewardError):
        return Outcome(failure=Failure(exc.kind, exc.message), details=exc.details)
    log.debug("reward %s raised", what, exc_info=exc)
    return Outcome.failed("exception", f"{what} raised {type(exc).__name__}: {exc}")


class _DaemonWorkers:
    """Daemon threads that run sync reward calls, reused across calls.

    A new thread starts only when none is idle, up to ``limit`` threads; an idle thread exits
    after ``idle_exit_s``. A call whose caller timed out keeps its thread until it returns
    (Python cannot stop a thread); ``stuck`` counts those, and once every thread is stuck new
    calls are refused at once instead of queueing behind them.
    """

    def __init__(self, limit: int, idle_exit_s: float = 30.0) -> None:
        self.limit = limit
        self.idle_exit_s = idle_exit_s
        self.live = 0
        self.idle = 0
        self.pending = 0  # submitted jobs no worker has taken yet
        self.stuck = 0
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self.stuck >= self.limit:
                raise RewardError(
                    "unavailable",
                    f"all {self.limit} reward threads are stuck in calls that ran past their timeouts",
                )
            # Start a thread while the waiting jobs outnumber the idle threads: comparing with
            # idle alone let one idle thread take a whole burst, one job after the other.
            self.pending += 1
            if self.pending > self.idle and self.live < self.limit:
                self.live += 1
                threading.Thread(target=self._work, name="relax-reward", daemon=True).start()
        self._queue.put(job)

    def _work(self) -> None:
        while True:
            with self._lock:
                self.idle += 1
            try:
                job = self._queue.get(timeout=self.idle_exit_s)
            except queue.Empty:
                with self._lock:
                    self.idle -= 1
                    if self.pending > self.idle:  # a job submitted just now counted on this thread
                        continue
                    self.live -= 1
                return
            with self._lock:
                self.idle -= 1
                self.pending -= 1
            job()


WORKERS = _DaemonWorkers(MAX_LIVE_THREADS)


def _run_on_worker(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``fn`` on a reward thread; the returned future settles on the running loop. A call
    whose caller gave up before it started is skipped; one that is running is counted stuck
    until it returns."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    state = {"started": False, "finished": False, "abandoned": False}
    workers = WORKERS  # the pool this call is counted on, even if the global is swapped meanwhile
    lock = workers._lock

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def job() -> None:
        with lock:
            if state["abandoned"]:
                return
            state["started"] = True
        try:
            ok, value = True, fn()
        except BaseException as exc:  # noqa: BLE001 -- reported to the caller
            ok, value = False, exc
        with lock:
            state["finished"] = True
            if state["abandoned"]:
                workers.stuck -= 1
                return
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is closed: the caller gave up long ago
            pass

    def on_done(f: asyncio.Future[Any]) -> None:
        if f.cancelled():  # the caller timed out or was cancelled
            with lock:
                if not state["finished"]:
                    state["abandoned"] = True
                    workers.stuck += int(state["started"])

    fut.add_done_callback(on_done)
    workers.submit(job)
    return fut


async def call_reward(
    rf: RewardFn,
    arg: RewardInput | Sequence[RewardInput],
    kwargs: dict[str, Any],
    timeout_s: float | None,
) -> Any:
    """Call ``rf`` once and return its raw value; raises on error or ``TimeoutError``."""
    if rf.is_async:
        return await asyncio.wait_for(rf.fn(arg, **kwargs), timeout_s)
    return await asyncio.wait_for(_run_on_worker(lambda: rf.fn(arg, **kwargs)), timeout_s)


async def run_sample(rf: RewardFn, sample: RewardInput, kwargs: dict[str, Any], timeout_s: float | None,
                     what: str) -> Outcome:
    """Score one sample with a single-sample reward."""
    try:
        value = await call_reward(rf, sample, kwargs, timeout_s)
    except TimeoutError:  # asyncio.TimeoutError is TimeoutError since 3.11
        return Outcome.failed("timeout", f"{what} did not finish within {timeout_s} s")
    except Exception as exc:  # noqa: BLE001 -- any error becomes a recorded failure
        return _failure_from_exception(exc, what)
    return coerce_outcome(value, what)


async def run_group(rf: RewardFn, samples: Sequence[RewardInput], kwargs: dict[str, Any],
                    timeout_s: float | None, what: str) -> list[Outcome]:
    """Score a group with a group-level reward: one outcome per sample, in order."""
    n = len(samples)
    try:
        values = await call_reward(rf, list(samples), kwargs, timeout_s)
    except TimeoutError:  # asyncio.TimeoutError is TimeoutError since 3.11
        return [Outcome.failed("timeout", f"{what} did not finish within {timeout_s} s") for _ in range(n)]
    except Exception as exc:  # noqa: BLE001
        out = _failure_from_exception(exc, what)
        return [Outcome(failure=out.failure, details=dict(out.details)) for _ in range(n)]
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Sequence) or len(values) != n:
        got = f"{len(values)} results" if isinstance(values, Sequence) and not isinstance(values, (str, bytes)) else type(values).__name__
        return [Outcome.failed("invalid", f"{what} is a group reward: it must return {n} results, got {got}")
                for _ in range(n)]
    return [coerce_outcome(v, what) for v in values]


__all__ = ["MAX_LIVE_THREADS", "Outcome", "call_reward", "coerce_outcome", "run_group", "run_sample"]
