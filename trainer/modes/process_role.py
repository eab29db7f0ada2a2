"""A role hosted in a child process of this one: the embedded runtime's learner in its own
interpreter, when ``async_rl.learner_process`` asks for it.

Why: in one Python process the trainer's step shares the interpreter lock with the rollout
producer (HTTP, chat-template deltas, env steps, reward calls), which matters when many engines
feed one driver and there are cores to spare. (On a 2-core machine a third runnable process costs
more than the lock, so the default keeps one process: see docs/async.md.) A :class:`ProcessRole` gives the learner its own process without a cluster: one ``spawn``-ed
child (no fork of a process that holds threads and an event loop), driven over a pipe.

The protocol is small: the parent sends ``(call_id, method, args, kwargs)``; the child runs
each call as an asyncio task (calls may overlap, as on a Ray actor) and answers
``(call_id, ok, result_or_error)``; ``None`` asks it to exit. Both sides are trusted (this
process started the other), so arguments travel as pickles. If the child dies, every call in
flight and every later call fails at once with its exit code, instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import multiprocessing as mp
import threading
import traceback
from typing import Any

from relax_gym.trainer.modes.roles import Role, call_method

log = logging.getLogger("relax_gym.trainer.modes")


class RoleProcessDied(RuntimeError):
    """The child process hosting a role exited (or could not be reached)."""


class RemoteCallError(RuntimeError):
    """A call failed in the child with an exception that could not be sent back as itself."""


class ProcessRole(Role):
    """A role object built and run in a spawned child process; ``await role.method(...)``.

    ``factory`` (``"package.module:callable"``) is called in the child with ``kwargs`` and returns
    the object whose methods the calls run; ``imports`` are imported there first."""

    def __init__(self, factory: str, kwargs: dict[str, Any], *, imports: list[str] | None = None,
                 name: str = "") -> None:
        self.label = name or factory.rsplit(":", 1)[-1]
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead: str | None = None
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=serve_role, args=(child_conn, factory, kwargs, list(imports or [])),
                                 name=f"relax-gym-{self.label}", daemon=True)
        self._proc.start()
        child_conn.close()
        self._reader = threading.Thread(target=self._read, name=f"{self.label}-replies", daemon=True)

    @property
    def process_id(self) -> int | None:
        return self._proc.pid

    def _read(self) -> None:
        """Hand each reply to the future waiting for it; on EOF fail them all."""
        while True:
            try:
                call_id, ok, value = self._conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # noqa: BLE001 - an unreadable reply: its caller gets the error
                log.warning("%s: unreadable reply: %s", self.label, exc)
                continue
            self._resolve(call_id, ok, value)
        self._proc.join(timeout=5)
        self._dead = f"the {self.label} process exited (exit code {self._proc.exitcode})"
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fail_all)

    def _resolve(self, call_id: int, ok: bool, value: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def settle() -> None:
            fut = self._pending.pop(call_id, None)
            if fut is None or fut.done():
                return
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value if isinstance(value, BaseException) else RemoteCallError(str(value)))

        loop.call_soon_threadsafe(settle)

    def _fail_all(self) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(RoleProcessDied(self._dead or f"the {self.label} process is gone"))

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._reader.start()
        if self._dead is not None:
            raise RoleProcessDied(self._dead)
        call_id = next(self._ids)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[call_id] = fut
        try:
            await _post(self._conn, self._send_lock, (call_id, name, args, kwargs))
        except (OSError, ValueError) as exc:
            self._pending.pop(call_id, None)
            raise RoleProcessDied(self._dead or f"the {self.label} process cannot be reached: {exc}") from None
        except BaseException:  # an argument that cannot be pickled: the caller's error
            self._pending.pop(call_id, None)
            raise
        return await fut

    async def stop_process(self, timeout_s: float = 30.0) -> None:
        """Ask the child to exit, then make sure it has (terminate, then kill). (Not ``close``:
        attribute names here would hide the role object's own methods of that name.)"""
        if self._proc.is_alive():
            try:
                await _post(self._conn, self._send_lock, None)
            except (OSError, ValueError):
                pass
            await asyncio.to_thread(self._proc.join, timeout_s)
        if self._proc.is_alive():
            self._proc.terminate()
            await asyncio.to_thread(self._proc.join, 5)
        if self._proc.is_alive():
            self._proc.kill()
            await asyncio.to_thread(self._proc.join, 5)
        self._conn.close()

    def __repr__(self) -> str:
        return f"ProcessRole({self.label}, pid={self._proc.pid})"


# A message this small fits the pipe's buffer: written from the event loop it never blocks, and
# it skips two thread hops per call (they cost milliseconds each on a loaded machine). A larger
# one (a batch with images, a state dict) is written from a worker thread.
_INLINE_BYTES = 32 * 1024


async def _post(conn: Any, lock: threading.Lock, message: Any) -> None:
    """Send ``message`` on ``conn``; raises what pickling or the pipe raise."""
    from multiprocessing.reduction import ForkingPickler

    data = bytes(ForkingPickler.dumps(message))
    if len(data) <= _INLINE_BYTES and lock.acquire(blocking=False):
        try:
            conn.send_bytes(data)
        finally:
            lock.release()
        return

    def write() -> None:
        with lock:
            conn.send_bytes(data)

    await asyncio.to_thread(write)


# ------------------------------------------------------------------------------------------------
# the child's side
# ------------------------------------------------------------------------------------------------
def serve_role(conn: Any, factory: str, kwargs: dict[str, Any], imports: list[str]) -> None:
    """The child's main: build the role object, then run calls until the parent says stop or goes."""
    import signal

    # Ctrl-C (and a supervisor's SIGTERM) reach the whole process group: the parent stops the
    # run, which closes this role (its engines too), and then this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING)
    try:
        for name in imports:
            importlib.import_module(name)
        module, _, attr = factory.partition(":")
        obj: Any = getattr(importlib.import_module(module), attr)(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - every call reports why the role never started
        obj = _FailedRole(exc)
    asyncio.run(_serve(conn, obj))


class _FailedRole:
    """Stands in for a role object that could not be built: every call raises why."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name: str) -> Any:
        exc = self.exc

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise exc

        return fail


_PARENT_GONE = object()  # the pipe closed without a goodbye: the parent died
_CLOSE_ON_ORPHAN_S = 120.0


def _travels(exc: BaseException) -> bool:
    """Whether ``exc`` survives a pickle round trip (an exception class whose ``__init__`` takes
    other arguments than its message does not, and would leave the caller waiting)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure means: send a plain error instead
        return False
    return True


async def _serve(conn: Any, obj: Any) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    send_lock = threading.Lock()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                message = _PARENT_GONE
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message is None or message is _PARENT_GONE:
                return

    async def reply(message: tuple[int, bool, Any]) -> None:
        try:
            await _post(conn, send_lock, message)
        except (OSError, ValueError):
            pass  # the parent is gone
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or error: say what it was
            await _post(conn, send_lock, (message[0], False, RemoteCallError(
                f"{type(message[2]).__name__}: {message[2]!s:.2000} (could not be sent back: {exc})")))

    async def run_call(call_id: int, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            result = await call_method(obj, name, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            if not isinstance(exc, Exception) or not _travels(exc):
                exc = RemoteCallError(f"{type(exc).__name__}: {exc}")
            exc.__traceback__ = None
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            log.debug("call %s failed: %s", name, detail)
            await reply((call_id, False, exc))
            return
        await reply((call_id, True, result))

    threading.Thread(target=read, name="role-calls", daemon=True).start()
    tasks: set[asyncio.Task[None]] = set()
    while True:
        message = await inbox.get()
        if message is None or message is _PARENT_GONE:
            break
        task = asyncio.create_task(run_call(*message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if message is _PARENT_GONE and callable(getattr(obj, "close", None)):
        # the parent died without closing this role: close it here, so that what it started
        # (a learner's engines) does not outlive the run
        try:
            await asyncio.wait_for(call_method(obj, "close"), _CLOSE_ON_ORPHAN_S)
        except BaseException as exc:  # noqa: BLE001 - best effort on the way out
            log.warning("closing the role after its parent went away failed: %s", exc)


__all__ = ["ProcessRole", "RemoteCallError", "RoleProcessDied", "serve_role"]
