"""Host side of the python sandbox: a warm pool of pre-forked, single-use workers.

``SandboxPool`` starts one *zygote* process (``_zygote.py``) and keeps ``size`` workers ready,
each with its namespaces and interpreter already set up. A call claims one (the zygote forks
a replacement at once), writes the code straight to the worker's runner, waits on its status
pipe while enforcing the wall clock and the output caps, and drops the worker: nothing
survives from one call to the next. The host process itself never forks -- it may be
multithreaded (asyncio, torch) -- the zygote is not.

Thread-safe: any number of threads may call ``run`` concurrently; each call holds its own
worker, and the pool's lock covers only the claim.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Literal, Self

from . import _zygote
from .limits import ExecResult, SandboxLimits

Isolation = Literal["auto", "full", "rlimits"]
_ZYGOTE = Path(_zygote.__file__)


class SandboxError(RuntimeError):
    """The sandbox could not be started (not: the user's code failed -- that is an ExecResult)."""


class _Worker:
    """A claimed worker: the supervisor's socket and, once it is ready, the runner's pipes.

    The host drives each call itself -- it writes the request to the runner, enforces the
    wall clock, caps the output and kills the executor -- so a call costs two process
    wake-ups; the supervisor only backs the deadline up and cleans up after the worker."""

    def __init__(self, pid: int, sock: socket.socket, caps: dict[str, bool]) -> None:
        self.pid = pid
        self.sock = sock
        self.caps = caps
        self.executor_pid: int | None = None
        self.pidfd: int | None = None
        self.fds: dict[str, int] = {}
        self.status_buf = bytearray()
        self.exited: dict[str, Any] | None = None  # the supervisor's report of the executor's end

    def wait_ready(self, timeout_s: float) -> str | None:
        """Receive the runner's pipes; returns an error message if the worker is unusable."""
        if self.fds:
            return None
        try:
            self.sock.settimeout(timeout_s)
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 4)
        except OSError as exc:
            return f"the sandbox worker did not become ready: {exc}"
        msg = _decode(data) if data else None
        if not msg or msg.get("type") != "ready" or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            why = (msg or {}).get("error") or "the supervisor exited before it was ready"
            return f"sandbox set-up failed: {why}"
        self.fds = dict(zip(("req", "status", "out", "err"), fds))
        os.set_blocking(self.fds["req"], True)
        self.executor_pid = int(msg["executor_pid"])
        try:
            self.pidfd = os.pidfd_open(self.executor_pid)
        except (AttributeError, OSError):
            self.pidfd = None
        self.sock.setblocking(False)
        return None

    def notify(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.send(_zygote.encode_message(msg))
        except OSError:
            pass

    def kill_executor(self) -> None:
        """SIGKILL the executor (with a PID namespace: everything the code started)."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            elif self.executor_pid is not None:
                os.kill(self.executor_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        if not self.caps.get("pid") and self.executor_pid is not None:
            try:
                os.killpg(self.executor_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """Kill the supervisor too (it takes its executor along)."""
        self.kill_executor()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        for fd in list(self.fds.values()) + ([self.pidfd] if self.pidfd is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}
        self.pidfd = None
        try:
            self.sock.close()  # the supervisor sees EOF: it kills, reaps and cleans up
        except OSError:
            pass


def _shutdown(ctl: socket.socket, proc: subprocess.Popen[bytes], ready: collections.deque[_Worker]) -> None:
    for worker in list(ready):
        worker.close()
    ready.clear()
    try:
        ctl.close()  # the zygote sees EOF, kills its idle supervisors and exits
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class SandboxPool:
    """A pool of warm sandbox workers; see the module docstring and docs/tools.md.

    * ``size`` -- workers kept ready (each serves exactly one call or one session).
    * ``isolation`` -- ``"auto"`` (every namespace the kernel allows), ``"full"`` (fail to start
      unless network, mount and PID namespaces all work) or ``"rlimits"`` (no namespaces).
    * ``drop_privileges`` -- run the code as a per-call uid (``"auto"``: when we are root).
    * ``tmpfs_mb`` -- size of the private ``/tmp`` each call gets (namespace mode).
    * ``preload`` -- modules the zygote imports once (e.g. ``("numpy",)``), so ``import numpy``
      in user code costs nothing.
    * ``limits`` -- default :class:`SandboxLimits` for calls made through this pool.
    """

    def __init__(
        self,
        size: int = 2,
        *,
        isolation: Isolation = "auto",
        drop_privileges: Literal["auto", "yes", "no"] = "auto",
        tmpfs_mb: int = 64,
        preload: tuple[str, ...] = (),
        limits: SandboxLimits | None = None,
        python: str | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"SandboxPool size must be >= 1, got {size}")
        if isolation not in ("auto", "full", "rlimits"):
            raise ValueError(f"isolation must be 'auto', 'full' or 'rlimits', got {isolation!r}")
        self.size = size
        self.isolation = isolation
        self.drop_privileges = drop_privileges
        self.tmpfs_mb = int(tmpfs_mb)
        self.preload = tuple(preload)
        self.limits = limits or SandboxLimits()
        self.python = python or sys.executable
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._ready: collections.deque[_Worker] = collections.deque()
        self._ctl: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._caps: dict[str, bool] = {}
        self._finalizer: Any = None
        self._closed = False
        self._owner_pid = os.getpid()
        self.restarts = 0

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def capabilities(self) -> dict[str, bool]:
        """Which protections are in force: ``network``, ``filesystem``, ``pid`` (namespaces),
        ``uid`` (per-call uid) and ``root``. Starts the pool."""
        with self._lock:
            self._ensure_started()
            return dict(self._caps)

    def start(self) -> Self:
        with self._lock:
            self._ensure_started()
        return self

    def _forget_after_fork(self) -> None:
        """In a forked child the zygote, its sockets and the claimed workers belong to the
        parent: drop our copies without touching the parent's processes, start afresh."""
        if self._finalizer is not None:
            self._finalizer.detach()
        for worker in self._ready:
            worker.sock.close()
        self._ready.clear()
        if self._ctl is not None:
            self._ctl.close()
        self._ctl, self._proc, self._finalizer = None, None, None
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()

    def _ensure_started(self) -> None:
        if self._closed:
            raise SandboxError("this SandboxPool is closed")
        if self._owner_pid != os.getpid():
            self._forget_after_fork()
        if self._proc is not None and self._proc.poll() is None and self._ctl is not None:
            return
        if self._proc is not None:
            self._teardown()
            self.restarts += 1
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [
            self.python, "-I", str(_ZYGOTE),
            "--control-fd", str(child.fileno()),
            "--isolation", self.isolation,
            "--drop-privileges", self.drop_privileges,
            "--tmpfs-mb", str(self.tmpfs_mb),
            "--preload", ",".join(self.preload),
        ]  # fmt: skip
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        debug = os.environ.get("RELAX_GYM_SANDBOX_DEBUG") == "1"
        try:
            proc = subprocess.Popen(
                cmd,
                pass_fds=(child.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if debug else subprocess.DEVNULL,
                start_new_session=True,  # terminal signals (Ctrl-C) must not reach the sandbox
                close_fds=True,
            )
        finally:
            child.close()
        parent.settimeout(self.start_timeout_s)
        try:
            data = parent.recv(65536)
        except OSError as exc:
            proc.kill()
            parent.close()
            raise SandboxError(f"the sandbox zygote did not answer within {self.start_timeout_s} s: {exc}") from None
        hello = _decode(data) if data else None
        if not hello or hello.get("type") != "hello":
            proc.kill()
            parent.close()
            raise SandboxError(f"the sandbox zygote failed to start (exit status {proc.wait()})")
        if hello.get("error"):
            proc.wait(timeout=5)
            parent.close()
            raise SandboxError(f"sandbox unavailable: {hello['error']}")
        parent.settimeout(None)
        self._ctl, self._proc, self._caps = parent, proc, dict(hello["caps"])
        self._finalizer = weakref.finalize(self, _shutdown, parent, proc, self._ready)
        self._spawn(self.size)

    def _teardown(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._ctl, self._proc, self._finalizer = None, None, None

    def close(self) -> None:
        """Stop the zygote and every idle worker (calls in flight finish or fail)."""
        with self._lock:
            self._closed = True
            self._teardown()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workers ---------------------------------------------------------------------------------
    def _spawn(self, n: int) -> None:
        assert self._ctl is not None
        try:
            self._ctl.send(_zygote.encode_message({"type": "spawn", "n": n}))
        except OSError:
            self._ctl = None  # the zygote is gone; restarted at the next claim

    def _collect(self, timeout: float) -> None:
        """Receive workers the zygote has sent, waiting up to ``timeout`` for the first."""
        ctl = self._ctl
        if ctl is None:
            return
        wait = timeout
        while True:
            ready, _, _ = select.select([ctl], [], [], max(0.0, wait))
            if not ready:
                return
            try:
                data, fds, _, _ = socket.recv_fds(ctl, 65536, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                self._ctl = None
                return
            msg = _decode(data)
            if fds:
                sock = socket.socket(fileno=fds[0])
                if msg and msg.get("type") == "worker":
                    self._ready.append(_Worker(int(msg["pid"]), sock, self._caps))
                else:
                    sock.close()
            wait = 0.0

    def _claim(self, timeout_s: float = 30.0) -> _Worker:
        deadline = time.monotonic() + timeout_s
        if self._owner_pid != os.getpid():
            self._forget_after_fork()  # before the lock: a parent's thread may have held it
        with self._lock:
            self._ensure_started()
            self._collect(0.0)
            while not self._ready:
                if self._ctl is None or (self._proc is not None and self._proc.poll() is not None):
                    self._ensure_started()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SandboxError(f"no sandbox worker became ready within {timeout_s} s")
                self._collect(remaining)
            worker = self._ready.popleft()
            if self._ctl is not None:
                self._spawn(1)
            return worker

    # -- calls -----------------------------------------------------------------------------------
    def run(self, code: str, limits: SandboxLimits | None = None, **overrides: Any) -> ExecResult:
        """Run ``code`` in a fresh sandbox and return what happened; never raises for anything
        the code does (see :class:`ExecResult`)."""
        lim = (limits or self.limits).with_overrides(**overrides)
        request = {"code": code, "limits": lim.to_wire(), "session": False}
        last_error = "no attempt"
        for _ in range(3):
            worker = self._claim()
            try:
                problem = worker.wait_ready(_READY_TIMEOUT_S)
                if problem is not None:
                    last_error = problem
                    worker.kill()
                    continue  # a worker that could not set up; another one will
                return self._result(_call(worker, request, lim))
            finally:
                worker.close()
        return self._result(_failure(last_error))

    def session(self, limits: SandboxLimits | None = None, *, session_cpu_s: float | None = None, **overrides: Any) -> PythonSession:
        """A stateful REPL: variables persist across ``run`` calls, under the same limits."""
        return PythonSession(self, (limits or self.limits).with_overrides(**overrides), session_cpu_s=session_cpu_s)

    def _result(self, reply: dict[str, Any]) -> ExecResult:
        return ExecResult(
            stdout=str(reply.get("stdout", "")),
            stderr=str(reply.get("stderr", "")),
            exit_code=reply.get("exit_code"),
            timed_out=bool(reply.get("timed_out")),
            killed_reason=reply.get("killed_reason"),
            duration_s=float(reply.get("duration_s", 0.0)),
            stdout_truncated=int(reply.get("stdout_truncated", 0)),
            stderr_truncated=int(reply.get("stderr_truncated", 0)),
            isolation={k: bool(v) for k, v in self._caps.items()},
        )


def _decode(data: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(data[4:].decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


_SIGNAL_REASONS: dict[int, str] = {
    signal.SIGXCPU: "cpu_time_limit",
    signal.SIGXFSZ: "file_size_limit",
    signal.SIGSEGV: "crashed (SIGSEGV)",
}
_DRAIN_TICK_S = 0.02
_READY_TIMEOUT_S = 30.0


def _drain(fd: int, sink: _zygote.HeadTail) -> None:
    """Read whatever is buffered without blocking."""
    while True:
        try:
            data = os.read(fd, 1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        if not data:
            return
        sink.add(data)


def _take_messages(worker: _Worker, got: dict[str, dict[str, Any]]) -> None:
    buf = worker.status_buf
    while len(buf) >= 4:
        (size,) = struct.unpack("!I", buf[:4])
        if len(buf) < 4 + size:
            return
        try:
            msg = json.loads(bytes(buf[4 : 4 + size]).decode("utf-8"))
        except ValueError:
            msg = {}
        del buf[: 4 + size]
        got.setdefault(str(msg.get("type")), msg)


def _read_status(worker: _Worker, got: dict[str, dict[str, Any]]) -> bool:
    """Read the status pipe; False once it reached EOF."""
    while True:
        try:
            data = os.read(worker.fds["status"], 65536)
        except (BlockingIOError, InterruptedError):
            break
        if not data:
            _take_messages(worker, got)
            return False
        worker.status_buf += data
    _take_messages(worker, got)
    return True


def _read_supervisor(worker: _Worker) -> None:
    try:
        data = worker.sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    if not data:
        worker.exited = worker.exited or {"type": "gone"}
        return
    msg = _decode(data)
    if msg and msg.get("type") == "exit":
        worker.exited = msg


def _call(worker: _Worker, request: dict[str, Any], lim: SandboxLimits) -> dict[str, Any]:
    """One call on a ready worker: send the code, wait for the runner's status (or the
    deadline), keep the output within its caps, and say what happened."""
    wire = lim.to_wire()
    out, err = _zygote.HeadTail(lim.max_output_bytes), _zygote.HeadTail(lim.max_output_bytes)
    start = time.monotonic()
    deadline = start + lim.timeout_s
    try:
        _zygote._write_fd_message(worker.fds["req"], request)
    except OSError as exc:
        return _failure(f"the sandbox runner is gone ({exc})")
    worker.notify({"type": "call", "timeout_s": lim.timeout_s})
    got: dict[str, dict[str, Any]] = {}
    killed: str | None = None
    status_open = True
    # Output is not watched: each write would wake this thread. The pipes hold 1 MiB; the
    # tick drains them.
    while not ("done" in got or "exit" in got):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            killed = "timeout"
            break
        watch = ([worker.fds["status"]] if status_open else []) + [worker.sock]
        ready, _, _ = select.select(watch, [], [], min(remaining, _DRAIN_TICK_S))
        if worker.fds["status"] in ready:
            status_open = _read_status(worker, got)
        if worker.sock in ready:
            _read_supervisor(worker)
        _drain(worker.fds["out"], out)
        _drain(worker.fds["err"], err)
        if out.total + err.total > lim.output_kill_bytes:
            killed = "output_limit"
            break
        if worker.exited is not None and not ("done" in got or "exit" in got):
            _read_status(worker, got)
            break
    duration = time.monotonic() - start
    done = got.get("done")
    session_alive = bool(request.get("session")) and done is not None and killed is None
    if not session_alive:
        worker.kill_executor()  # background children die with it (asynchronously)
    elif request.get("session"):
        worker.notify({"type": "idle"})
    _drain(worker.fds["out"], out)
    _drain(worker.fds["err"], err)
    reason: str | None = killed
    cpu_s: float | None = None
    exit_code: int | None
    if killed is not None:
        exit_code = -signal.SIGKILL
    elif done is not None:
        exit_code, reason = int(done["exit_code"]), done.get("reason")
    elif "exit" in got:  # the runner died; its PID-namespace init said how
        exit_code = os.waitstatus_to_exitcode(int(got["exit"]["status"]))
        cpu_s = float(got["exit"].get("cpu_s", 0.0))
    elif worker.exited is not None and worker.exited.get("type") == "exit":  # no init: the supervisor did
        exit_code = os.waitstatus_to_exitcode(int(worker.exited["status"]))
        cpu_s = float(worker.exited.get("cpu_s", 0.0))
    else:
        return {**_failure("the sandbox supervisor exited during the call"), "stdout": out.text(), "stderr": err.text()}
    if reason is None and exit_code < 0:
        sig = -exit_code
        reason = _SIGNAL_REASONS.get(sig) or f"killed by signal {signal.Signals(sig).name}"
        if sig == signal.SIGKILL and cpu_s is not None and cpu_s >= float(wire["cpu_s"]) - 0.05:
            reason = "cpu_time_limit"  # the hard RLIMIT_CPU (SIGXCPU was ignored)
    return {
        "stdout": out.text(),
        "stderr": err.text(),
        "stdout_truncated": out.dropped,
        "stderr_truncated": err.dropped,
        "exit_code": exit_code,
        "timed_out": killed == "timeout",
        "killed_reason": reason,
        "duration_s": duration,
        "session_alive": session_alive,
    }


def _failure(message: str, *, timed_out: bool = False) -> dict[str, Any]:
    return {"exit_code": None, "timed_out": timed_out, "killed_reason": f"sandbox_error: {message}", "duration_s": 0.0}


class PythonSession:
    """A REPL in one sandbox that keeps its variables (and files in its ``/tmp``) between
    calls. Every call has the wall-clock timeout; the memory, process, file and output limits
    hold for the whole session; ``session_cpu_s`` caps the CPU time of all calls together
    (default: 10 calls' worth). A call that times out or crashes the interpreter ends the
    session: later calls return ``killed_reason="session_ended"``.
    """

    def __init__(self, pool: SandboxPool, limits: SandboxLimits, *, session_cpu_s: float | None = None) -> None:
        self.pool = pool
        self.limits = limits
        self.session_cpu_s = int(session_cpu_s if session_cpu_s is not None else 10 * (limits.timeout_s + 1))
        self._worker: _Worker | None = None
        self._lock = threading.Lock()
        self._ended: str | None = None
        self.calls = 0

    @property
    def alive(self) -> bool:
        return self._ended is None

    @property
    def ended_reason(self) -> str | None:
        """Why the session ended (``None`` while it is alive)."""
        return self._ended

    def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        with self._lock:
            if self._ended is not None:
                return self.pool._result(
                    {"exit_code": None, "killed_reason": "session_ended", "stderr": f"the session ended earlier: {self._ended}"}
                )
            lim = self.limits.with_overrides(timeout_s=timeout_s)
            if self._worker is None:
                worker = self.pool._claim()
                problem = worker.wait_ready(_READY_TIMEOUT_S)
                if problem is not None:
                    worker.kill()
                    worker.close()
                    self._ended = problem
                    return self.pool._result(_failure(problem))
                self._worker = worker
            request = {"code": code, "limits": lim.to_wire(), "session": True, "session_cpu_s": self.session_cpu_s}
            reply = _call(self._worker, request, lim)
            self.calls += 1
            if not reply.get("session_alive"):
                self._end(str(reply.get("killed_reason") or f"exit code {reply.get('exit_code')}"))
            return self.pool._result(reply)

    def _end(self, why: str) -> None:
        self._ended = why
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def close(self) -> None:
        with self._lock:
            if self._ended is None:
                self._end("closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.close()


# ------------------------------------------------------------------------------------------------
# the process-wide default pool
# ------------------------------------------------------------------------------------------------
_default: SandboxPool | None = None
_default_kwargs: dict[str, Any] = {}
_default_lock = threading.Lock()


def configure_default_pool(**kwargs: Any) -> None:
    """Set the arguments of the default pool (closing the current one, if started)."""
    global _default, _default_kwargs
    with _default_lock:
        if _default is not None:
            _default.close()
            _default = None
        _default_kwargs = dict(kwargs)


def default_pool() -> SandboxPool:
    """The pool ``run_python`` uses when none is given; started on first use."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = SandboxPool(**_default_kwargs)
        return _default


@atexit.register
def _close_default() -> None:
    if _default is not None:
        _default.close()


def run_python(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    pool: SandboxPool | None = None,
    **limits: Any,
) -> ExecResult:
    """Run ``code`` in a fresh sandboxed process and return its :class:`ExecResult`.

    Extra keyword arguments are :class:`SandboxLimits` fields (``cpu_s``, ``max_processes``,
    ``max_open_files``, ``max_file_mb``, ``max_output_bytes``, ``output_kill_bytes``).
    """
    target = pool or default_pool()
    return target.run(code, target.limits.with_overrides(timeout_s=timeout_s, memory_mb=memory_mb, **limits))
