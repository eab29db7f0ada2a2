"""A small pool of sympy worker processes with a hard time limit per request.

sympy can run for minutes (or forever) on a pathological answer such as ``10^{10^{10^{10}}}``,
and a Python thread cannot be stopped. So every sympy call runs in a separate process
(``_sympy_worker_main.py``); a request that exceeds its timeout kills that worker, the caller
gets :class:`SympyTimeout` right away, and the next request starts a fresh worker. Workers also
run under an address-space limit, so a blow-up in memory ends as an error, not as swapping.

The caller's time is bounded by ``timeout_s`` (compute) plus ``acquire_timeout_s`` (waiting for
a free worker) plus, once per fresh worker, ``startup_timeout_s``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_SCRIPT = Path(__file__).with_name("_sympy_worker_main.py")


class SympyError(RuntimeError):
    """The sympy worker failed (crashed, out of memory, could not start)."""


class SympyConfigError(SympyError):
    """The workers cannot do the job as installed (e.g. the ANTLR runtime is missing)."""


class SympyTimeout(SympyError, TimeoutError):
    """A sympy request ran past its timeout; the worker was killed."""


class _Worker:
    def __init__(self, memory_mb: int, startup_timeout_s: float) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(_SCRIPT), str(memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            close_fds=True,
        )
        self._buf = b""
        try:
            ready = self._read_line(time.monotonic() + startup_timeout_s)
        except SympyTimeout:
            self.kill()
            raise SympyError(f"sympy worker did not start within {startup_timeout_s} s") from None
        except SympyError:
            self.kill()
            raise
        if not ready.get("ready"):
            self.kill()
            raise SympyConfigError(ready.get("error") or "sympy worker could not start")
        self.latex_error: str | None = ready.get("latex_error")

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SympyError(f"sympy worker died (exit code {self.proc.poll()})") from None
        return self._read_line(time.monotonic() + timeout_s)

    def _read_line(self, deadline: float) -> dict[str, Any]:
        """Read one reply line, never blocking past ``deadline``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    raise SympyTimeout("sympy request timed out")
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = self.proc.wait(timeout=5)
                    raise SympyError(f"sympy worker died (exit code {code}): {self._stderr_tail() or 'no message'}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise SympyError(f"sympy worker sent a malformed reply: {line[:200]!r}") from None

    def _stderr_tail(self, n: int = 400) -> str:
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - n))
            return self._stderr.read().decode("utf-8", "replace").strip().replace("\n", " | ")
        except (OSError, ValueError):
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class SympyPool:
    """Up to ``size`` workers, started on demand and shared by all threads of the process."""

    def __init__(self, size: int = 1, *, memory_mb: int = 2048, startup_timeout_s: float = 60.0,
                 acquire_timeout_s: float = 120.0) -> None:
        if size < 1:
            raise ValueError("a sympy pool needs at least one worker")
        self.size = size
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self._slots: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(size):
            self._slots.put(None)  # None: a slot whose worker is started on first use
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self.timeouts = 0
        self.restarts = 0
        self._closed = False

    def call(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request; raises :class:`SympyTimeout` or :class:`SympyError`."""
        if self._closed:
            raise SympyError("the sympy pool is closed")
        try:
            worker = self._slots.get(timeout=self.acquire_timeout_s)
        except queue.Empty:
            raise SympyTimeout(f"no sympy worker free within {self.acquire_timeout_s} s") from None
        try:
            if worker is None or not worker.alive:
                if worker is not None:
                    self._forget(worker)
                    self.restarts += 1
                worker = _Worker(self.memory_mb, self.startup_timeout_s)
                with self._lock:
                    self._all.add(worker)
            try:
                reply = worker.request(payload, timeout_s)
            except SympyTimeout:
                self.timeouts += 1
                self._forget(worker)
                worker = None
                raise SympyTimeout(f"sympy check exceeded {timeout_s} s; worker killed") from None
            except SympyError:
                self._forget(worker)
                worker = None
                raise
            if not reply.get("ok", False):
                error_cls = SympyConfigError if reply.get("config") else SympyError
                raise error_cls(reply.get("error") or "sympy request failed")
            return reply
        finally:
            self._slots.put(worker)

    def latex_error(self, timeout_s: float = 60.0) -> str | None:
        """None when LaTeX parsing works in the workers, else why it does not."""
        worker = self._slots.get(timeout=self.acquire_timeout_s)
        try:
            if worker is None or not worker.alive:
                worker = _Worker(self.memory_mb, min(self.startup_timeout_s, timeout_s))
                with self._lock:
                    self._all.add(worker)
            return worker.latex_error
        finally:
            self._slots.put(worker)

    def _forget(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for w in workers:
            w.kill()


_DEFAULT: SympyPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> SympyPool:
    """The process-wide pool (``min(2, cpus)`` workers), closed at interpreter exit."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None or _DEFAULT._closed:
            _DEFAULT = SympyPool(size=max(1, min(2, os.cpu_count() or 1)))
            atexit.register(_DEFAULT.close)
        return _DEFAULT


__all__ = ["SympyConfigError", "SympyError", "SympyPool", "SympyTimeout", "default_pool"]
