"""Host side of the python sandbox: a warm pool of pre-forked, single-use workers.

``SandboxPool`` starts one *zygote* process (``_zygote.py``) and keeps ``size`` workers ready,
each with its namespaces and interpreter already set up. A call claims one (the zygote forks
a replacement at once), writes the code to the worker's request pipe, waits on the executor's
status pipe while enforcing the wall clock and the output caps, and drops the worker: nothing
survives from one call to the next. The host process itself never forks -- it may be
multithreaded (asyncio, torch) -- the zygote is not.

Nothing the sandboxed code writes reaches the host's status pipe (the code holds no descriptor
of it), and every message the host does read is size-bounded and schema-checked
(``_messages.py``): a malformed one fails that call with a ``sandbox_error``, never the host.

Thread-safe: any number of threads may call ``run`` concurrently; each call holds its own
worker, and the pool's lock covers only the claim.
"""

from __future__ import annotations

import atexit
import collections
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Literal, Self

from . import _messages, _zygote
from .limits import ExecResult, SandboxLimits

Isolation = Literal["auto", "full", "rlimits"]
_ZYGOTE = Path(_zygote.__file__)


def _send_signal(pidfd: int | None, pid: int | None, sig: signal.Signals) -> None:
    """Signal a process through its pidfd (never a recycled pid) or, without one, its pid;
    a process already gone is not an error."""
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        elif pid is not None:
            os.kill(pid, sig)
    except OSError:  # ProcessLookupError, PermissionError and a closed pidfd alike
        pass


class SandboxError(RuntimeError):
    """The sandbox could not be started (not: the user's code failed -- that is an ExecResult)."""


class _Worker:
    """A claimed worker: the supervisor's socket and, once it is ready, the call's pipes.

    The host drives each call itself -- it writes the request, reads the executor's status
    reports, enforces the wall clock, caps the output and kills the executor; the supervisor
    only backs the deadline up and cleans up after the worker."""

    def __init__(self, pid: int, sock: socket.socket, caps: dict[str, bool]) -> None:
        self.pid = pid
        self.sock = sock
        self.caps = caps
        self.executor_pid: int | None = None
        self.pidfd: int | None = None
        self.runner_pid: int | None = None
        self.runner_pidfd: int | None = None  # from the supervisor, which checked whose it is
        self.fds: dict[str, int] = {}
        self.status_buf = bytearray()
        self.seq = 0  # calls sent to this worker; the executor's reports carry the number
        self.exited: dict[str, Any] | None = None  # the supervisor's report of the executor's end

    def wait_ready(self, timeout_s: float) -> str | None:
        """Receive the call's pipes (and the runner's pidfd); returns an error message if the
        worker is unusable."""
        if self.fds:
            return None
        try:
            self.sock.settimeout(timeout_s)
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 5)
        except OSError as exc:
            return f"the sandbox worker did not become ready: {exc}"
        msg = _messages.parse_supervisor(data) if data else None
        if not isinstance(msg, _messages.Ready) or len(fds) not in (4, 5):
            for fd in fds:
                os.close(fd)
            if isinstance(msg, _messages.Failed):
                why = msg.error
            elif data:
                why = "the supervisor's ready message was malformed"
            else:
                why = "the supervisor exited before it was ready"
            return f"sandbox set-up failed: {why}"
        self.fds = dict(zip(("req", "status", "out", "err"), fds[:4]))
        self.runner_pidfd = fds[4] if len(fds) == 5 else None
        self.runner_pid = msg.runner_pid
        os.set_blocking(self.fds["req"], False)  # requests are written against the call's deadline
        self.executor_pid = msg.executor_pid
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

    def continue_runner(self) -> None:
        """SIGCONT the runner, stopped at the end of a session's previous call (if it is gone,
        the executor reports how it ended)."""
        _send_signal(self.runner_pidfd, self.runner_pid, signal.SIGCONT)

    def kill_executor(self) -> None:
        """SIGKILL the executor (with a PID namespace: everything the code started)."""
        _send_signal(self.pidfd, self.executor_pid, signal.SIGKILL)
        if not self.caps.get("pid") and self.executor_pid is not None:
            _zygote.kill_group(self.executor_pid)

    def kill(self) -> None:
        """Kill the supervisor too (it takes its executor along)."""
        self.kill_executor()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        pidfds = [fd for fd in (self.pidfd, self.runner_pidfd) if fd is not None]
        for fd in list(self.fds.values()) + pidfds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}
        self.pidfd = self.runner_pidfd = None
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
        hello = _messages.parse_zygote(data) if data else None
        if not isinstance(hello, _messages.Hello):
            proc.kill()
            parent.close()
            raise SandboxError(f"the sandbox zygote failed to start (exit status {proc.wait()})")
        if hello.error:
            proc.wait(timeout=5)
            parent.close()
            raise SandboxError(f"sandbox unavailable: {hello.error}")
        parent.settimeout(None)
        self._ctl, self._proc, self._caps = parent, proc, dict(hello.caps)
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
            msg = _messages.parse_zygote(data)
            if fds:
                sock = socket.socket(fileno=fds[0])
                if isinstance(msg, _messages.WorkerBorn):
                    self._ready.append(_Worker(msg.pid, sock, self._caps))
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


_SIGNAL_REASONS: dict[int, str] = {
    signal.SIGXCPU: "cpu_time_limit",
    signal.SIGXFSZ: "file_size_limit",
    signal.SIGSEGV: "crashed (SIGSEGV)",
}
_DRAIN_TICK_S = 0.02
_READY_TIMEOUT_S = 30.0


def signal_name(sig: int) -> str:
    """SIGTERM, SIGRTMIN+3, ... -- any number the kernel may report, never an exception."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        if signal.SIGRTMIN < sig < signal.SIGRTMAX:
            return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
        return f"signal {sig}"


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


class _Outcome:
    """What the executor has said about the call in flight (the first of each kind counts)."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.done: _messages.Done | None = None
        self.exit: _messages.Exit | None = None
        self.fault: str | None = None

    @property
    def settled(self) -> bool:
        return self.done is not None or self.exit is not None or self.fault is not None

    def take(self, msg: _messages.Done | _messages.Exit | _messages.Fault | None) -> None:
        if msg is None:
            self.fault = self.fault or "the sandbox sent a malformed status message"
        elif isinstance(msg, _messages.Fault):
            self.fault = self.fault or msg.error
        elif isinstance(msg, _messages.Exit):
            self.exit = self.exit or msg
        elif msg.seq != self.seq:
            self.fault = self.fault or f"the sandbox reported call {msg.seq} during call {self.seq}"
        else:
            self.done = self.done or msg


def _take_messages(worker: _Worker, outcome: _Outcome) -> None:
    """Parse the complete frames buffered from the status pipe. A frame announcing more than
    ``STATUS_MESSAGE_MAX`` is a fault at once, so the buffer never grows past one chunk."""
    buf = worker.status_buf
    while (size := _messages.frame_size(buf)) is not None:
        if size > _messages.STATUS_MESSAGE_MAX:
            outcome.take(None)
            buf.clear()
            return
        if len(buf) < 4 + size:
            return
        outcome.take(_messages.parse_status(bytes(buf[4 : 4 + size])))
        del buf[: 4 + size]


def _read_status(worker: _Worker, outcome: _Outcome) -> bool:
    """Read the status pipe (bounded); False once it reached EOF."""
    while not outcome.fault:
        try:
            data = os.read(worker.fds["status"], 65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        worker.status_buf += data
        _take_messages(worker, outcome)
        if not data:
            return False
    return True


def _read_supervisor(worker: _Worker) -> None:
    try:
        data = worker.sock.recv(_messages.SOCKET_MESSAGE_MAX + 4)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    if not data:
        worker.exited = worker.exited or {"type": "gone"}
        return
    msg = _messages.parse_supervisor(data)
    if isinstance(msg, _messages.SupervisorExit):
        worker.exited = msg.model_dump()


def _send_request(fd: int, data: bytes, deadline: float) -> str | None:
    """Write the whole request before the deadline; None, "timeout" or what went wrong."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except (BlockingIOError, InterruptedError):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            select.select([], [fd], [], remaining)
            continue
        except OSError as exc:
            return f"the sandbox runner is gone ({exc})"
        view = view[n:]
    return None


def _exit_outcome(status: int, cpu_s: float, cpu_limit: float) -> tuple[int, str | None] | None:
    """(exit code, reason) from the runner's wait status; None if it is not an exit status."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    if not os.WIFSIGNALED(status):
        return None
    sig = os.WTERMSIG(status)
    reason = _SIGNAL_REASONS.get(sig) or f"killed by signal {signal_name(sig)}"
    if sig == signal.SIGKILL and cpu_s >= cpu_limit - 0.05:
        reason = "cpu_time_limit"  # the hard RLIMIT_CPU (SIGXCPU was ignored)
    return -sig, reason


def _done_reason(reason: str | None) -> str | None:
    if reason == "limits_failed":
        return "sandbox_error: the sandbox could not apply the call's limits"
    return reason


def _call(worker: _Worker, request: dict[str, Any], lim: SandboxLimits) -> dict[str, Any]:
    """One call on a ready worker: send the code, wait for the executor's report (or the
    deadline), keep the output within its caps, and say what happened."""
    worker.seq += 1
    outcome = _Outcome(worker.seq)
    data = _zygote.encode_message({**request, "seq": worker.seq})
    if len(data) - 4 > _zygote.MAX_REQUEST_BYTES:
        return _failure(f"the request is {len(data) - 4} bytes, over the sandbox's limit of {_zygote.MAX_REQUEST_BYTES}")
    _read_status(worker, outcome)  # a session whose interpreter ended (or misbehaved) between calls
    if outcome.settled:
        worker.kill_executor()
        why = outcome.fault or "its interpreter exited"
        return _failure(f"the session ended between calls: {why}")
    wire = lim.to_wire()
    out, err = _zygote.HeadTail(lim.max_output_bytes), _zygote.HeadTail(lim.max_output_bytes)
    start = time.monotonic()
    deadline = start + lim.timeout_s
    sent = _send_request(worker.fds["req"], data, deadline)
    if sent is not None and sent != "timeout":
        return _failure(sent)
    if worker.seq > 1:
        worker.continue_runner()  # a session's runner stopped at the end of its previous call
    worker.notify({"type": "call", "timeout_s": lim.timeout_s})
    if sent == "timeout":
        killed: str | None = "timeout"
    else:
        killed = _await_report(worker, outcome, out, err, deadline, lim.output_kill_bytes)
    duration = time.monotonic() - start
    session_alive = bool(request.get("session")) and outcome.done is not None and killed is None and outcome.fault is None
    if not session_alive:
        worker.kill_executor()  # background children die with it (asynchronously)
    else:
        worker.notify({"type": "idle"})
    _drain(worker.fds["out"], out)
    _drain(worker.fds["err"], err)
    output = {"stdout": out.text(), "stderr": err.text(), "stdout_truncated": out.dropped, "stderr_truncated": err.dropped}
    ended = _ending(killed, outcome, worker, float(wire["cpu_s"]))
    if isinstance(ended, str):
        return {**_failure(ended), **output, "duration_s": duration}
    exit_code, reason = ended
    return {
        **output,
        "exit_code": exit_code,
        "timed_out": killed == "timeout",
        "killed_reason": reason,
        "duration_s": duration,
        "session_alive": session_alive,
    }


def _await_report(
    worker: _Worker,
    outcome: _Outcome,
    out: _zygote.HeadTail,
    err: _zygote.HeadTail,
    deadline: float,
    kill_bytes: int,
) -> str | None:
    """Wait for the executor's report while draining the output: None once it reported (or
    exited), else why the call must be killed (``"timeout"``, ``"output_limit"``)."""
    status_open = True
    # Output is not watched: each write would wake this thread. The pipes hold 1 MiB; the
    # tick drains them.
    while not outcome.settled:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        watch = ([worker.fds["status"]] if status_open else []) + [worker.sock]
        ready, _, _ = select.select(watch, [], [], min(remaining, _DRAIN_TICK_S))
        if worker.fds["status"] in ready:
            status_open = _read_status(worker, outcome)
        if worker.sock in ready:
            _read_supervisor(worker)
        _drain(worker.fds["out"], out)
        _drain(worker.fds["err"], err)
        if out.total + err.total > kill_bytes:
            return "output_limit"
        if worker.exited is not None and not outcome.settled:
            _read_status(worker, outcome)  # the executor's last report, written before it exited
            return None
    return None


def _ending(killed: str | None, outcome: _Outcome, worker: _Worker, cpu_limit: float) -> tuple[int, str | None] | str:
    """(exit code, reason) of the call, or the sandbox error that ended it."""
    if killed is not None:
        return -signal.SIGKILL, killed
    if outcome.fault is not None:
        return outcome.fault
    if outcome.done is not None:
        return outcome.done.exit_code, _done_reason(outcome.done.reason)
    if outcome.exit is not None:  # the runner ended; the executor reaped it
        ended = _exit_outcome(outcome.exit.status, outcome.exit.cpu_s, cpu_limit)
        return ended if ended is not None else "the sandbox reported an impossible exit status"
    if worker.exited is not None and worker.exited.get("type") == "exit":  # the executor itself died
        ended = _exit_outcome(int(worker.exited["status"]), float(worker.exited["cpu_s"]), cpu_limit)
        return ended if ended is not None else "the sandbox reported an impossible exit status"
    return "the sandbox supervisor exited during the call"


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
    memory_mb: int = 512,
    pool: SandboxPool | None = None,
    **limits: Any,
) -> ExecResult:
    """Run ``code`` in a fresh sandboxed process and return its :class:`ExecResult`.

    Extra keyword arguments are :class:`SandboxLimits` fields (``cpu_s``, ``max_processes``,
    ``max_total_memory_mb``, ``max_open_files``, ``max_file_mb``, ``max_output_bytes``,
    ``output_kill_bytes``). The defaults allow 4 processes (threads count) of 512 MB: 2 GB in all.
    """
    target = pool or default_pool()
    return target.run(code, target.limits.with_overrides(timeout_s=timeout_s, memory_mb=memory_mb, **limits))
