"""The process side of the python sandbox: zygote, supervisor and executor (standard library only).

The host (``pool.py``) starts this file once, as ``python -I _zygote.py --control-fd N``, in a
new session with a minimal environment. Three kinds of process live here:

* **zygote** -- one per pool. It probes which isolation the kernel allows, optionally imports
  slow modules once (``--preload numpy``), and forks supervisors on request. Each new
  supervisor's socket is passed to the host over the control socket (``SCM_RIGHTS``), so the
  host talks to supervisors directly and the zygote stays off the call path.
* **supervisor** -- one per call (or per stateful session). It prepares an executor ahead of
  time, then waits for the host's request, enforces the wall clock, caps the output and reports
  one result. It never runs user code and keeps its privileges.
* **executor** -- forked by the supervisor *before* any request, so the expensive set-up is off
  the call path: a new network namespace (no interfaces up, so no network at all), a new mount
  namespace in which every mount is read-only and ``/tmp`` is a fresh size-limited tmpfs (the
  call's working directory, gone when the namespace dies), and, as the init of a new PID
  namespace, the guarantee that killing it kills every process the code started. On the request
  it applies rlimits, drops to a per-call uid, clears the environment and ``exec``s the code.

Where the kernel refuses namespaces (or ``isolation="rlimits"`` is asked for), the executor runs
in a fresh temporary directory on the host's disk, in its own process group, with the same
rlimits and uid drop (when we are root); the supervisor kills the group and, as the call's uid,
every process that escaped the group. What that mode does not enforce is written in
docs/tools.md.

Messages are length-prefixed JSON: host <-> supervisor over a stream socket, supervisor <->
executor over pipes; zygote -> host over a SEQPACKET socket carrying one fd per message.
"""

from __future__ import annotations

import ctypes
import errno
import io
import json
import math
import os
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import time
import traceback
from typing import Any

# ------------------------------------------------------------------------------------------------
# framing (also imported by the host side)
# ------------------------------------------------------------------------------------------------
_HEADER = struct.Struct("!I")
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def encode_message(obj: Any) -> bytes:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    return _HEADER.pack(len(data)) + data


def send_message(sock: socket.socket, obj: Any) -> None:
    sock.sendall(encode_message(obj))


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket) -> Any | None:
    """One message, or None when the peer closed the socket."""
    head = _recv_exact(sock, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes is too large")
    body = _recv_exact(sock, size)
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def _write_fd_message(fd: int, obj: Any) -> None:
    data = encode_message(obj)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_fd_exact(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_fd_message(fd: int) -> Any | None:
    head = _read_fd_exact(fd, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    body = _read_fd_exact(fd, size)
    return None if body is None else json.loads(body.decode("utf-8"))


# ------------------------------------------------------------------------------------------------
# kernel interfaces that the os module lacks on Python 3.11
# ------------------------------------------------------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_c().unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    rc = _c().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(rc, f"mount {target}")


MNT_DETACH = 2


def umount(target: str) -> None:
    _check(_c().umount2(target.encode(), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    _c().prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0)


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 4:
                # mountinfo escapes space, tab, newline and backslash as \ooo
                points.append(fields[4].encode().decode("unicode_escape"))
    return points


# ------------------------------------------------------------------------------------------------
# capability probe
# ------------------------------------------------------------------------------------------------
def _probe_in_child(fn: Any) -> bool:
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _probe_filesystem() -> None:
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")
    for point in _mount_points():
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def probe_capabilities(isolation: str) -> dict[str, Any]:
    """Which protections this kernel and user allow, after the requested isolation level."""
    root = os.geteuid() == 0
    caps = {"network": False, "filesystem": False, "pid": False, "uid": root, "root": root}
    if isolation == "rlimits":
        return caps
    caps["network"] = _probe_in_child(lambda: unshare(CLONE_NEWNET))
    caps["filesystem"] = _probe_in_child(_probe_filesystem)

    def pid_probe() -> None:
        unshare(CLONE_NEWPID)
        child = os.fork()
        if child == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        _, status = os.waitpid(child, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise OSError("not pid 1 in the new PID namespace")

    # the PID namespace is only useful with a private /proc, i.e. with the mount namespace
    caps["pid"] = caps["filesystem"] and _probe_in_child(pid_probe)
    return caps


# ------------------------------------------------------------------------------------------------
# keeping the interpreter readable after the uid drop
# ------------------------------------------------------------------------------------------------
def python_paths() -> list[str]:
    """Directories the interpreter reads from: prefixes and every existing sys.path entry,
    reduced to the outermost ones."""
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.realpath(sys.executable))}
    candidates |= {p for p in sys.path if p and os.path.isdir(p)}
    real = sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)})
    out: list[str] = []
    for p in real:
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return out


def blocking_ancestor(path: str) -> str | None:
    """The first directory on the way to ``path`` that other users cannot traverse."""
    current = "/"
    for part in [x for x in path.split("/") if x]:
        current = os.path.join(current, part)
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return None
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return current
    return None


def blocked_python_paths() -> dict[str, list[str]]:
    """{blocking directory: interpreter paths below it} -- e.g. a pyenv under a 0700 /root."""
    blocked: dict[str, list[str]] = {}
    for p in python_paths():
        a = blocking_ancestor(p)
        if a is not None:
            blocked.setdefault(a, []).append(p)
    return blocked


def expose_python(blocked: dict[str, list[str]]) -> None:
    """In a private mount namespace: cover each blocking directory with an empty read-only
    tmpfs (hiding, e.g., root's home) and bind the interpreter's own directories back into it."""
    if not blocked:
        return
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0700")  # staging
    staged = []
    for i, path in enumerate(p for paths in blocked.values() for p in paths):
        stage = f"/tmp/{i}"
        os.mkdir(stage)
        mount(path, stage, None, MS_BIND | MS_REC)
        staged.append((path, stage))
    for directory in blocked:
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path, stage in staged:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(stage, path, None, MS_BIND | MS_REC)
    umount("/tmp")


# ------------------------------------------------------------------------------------------------
# output capture
# ------------------------------------------------------------------------------------------------
class HeadTail:
    """Keeps the first and last ``limit/2`` bytes of a stream and counts what it dropped, so a
    traceback at the end of a long output survives truncation."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.dropped:
            return head + self.tail.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        return f"{head}\n[... {self.dropped} bytes truncated ...]\n{tail}"


# ------------------------------------------------------------------------------------------------
# executor: runs the user's code
# ------------------------------------------------------------------------------------------------
MINIMAL_ENV_KEYS = ("LANG", "LC_ALL")
_FD_REQ, _FD_STATUS = 3, 4


def _exec_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _place_fds(mapping: dict[int, int]) -> None:
    """dup2 each source fd onto its target without clobbering another source, then close the
    rest: user code must not find the zygote's or supervisor's sockets."""
    staged = {target: fcntl_dupfd(src, 100) for target, src in mapping.items()}
    for target, src in staged.items():
        os.dup2(src, target, inheritable=target <= 2)
    keep_max = max(mapping)
    os.closerange(keep_max + 1, _max_fd())


def fcntl_dupfd(fd: int, lowest: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)


def _max_fd() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if 0 < soft < 1 << 20 else 65536


def _setup_executor(caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> str:
    """Namespaces and the working directory; runs before any request (off the call path)."""
    os.setsid()
    if caps["network"]:
        unshare(CLONE_NEWNET)
    if caps["filesystem"]:
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        if uid is not None:
            expose_python(blocked_python_paths())
        for point in _mount_points():
            try:
                mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            except OSError:
                pass  # e.g. a mount that vanished meanwhile; every mount we can see is tried
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=0700{owner}")
        if caps["pid"]:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        return "/tmp"
    workdir = tempfile.mkdtemp(prefix="relax-sandbox-")
    if uid is not None:
        os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o700)
    return workdir


def _apply_limits(req: dict[str, Any], uid: int | None, session_cpu_s: int | None) -> None:
    lim = req["limits"]
    cpu = int(math.ceil(lim["cpu_s"]))
    hard_cpu = session_cpu_s if session_cpu_s is not None else cpu + 1
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard_cpu), hard_cpu))
    mem = int(lim["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(lim["max_file_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(lim["max_open_files"]),) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nproc = int(lim["max_processes"])
    if uid is None:
        # Without a uid of its own the call shares RLIMIT_NPROC with every process of this user.
        nproc += _count_own_processes()
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        set_parent_death_signal()  # changing credentials clears it


def _count_own_processes() -> int:
    me = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == me:
                    count += 1
            except OSError:
                pass
    return count


def _set_call_cpu(timeout_s: float) -> None:
    """In a session RLIMIT_CPU is cumulative: give each call its own slice of the hard limit."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    want = int(math.ceil(spent + timeout_s)) + 1
    # soft < hard, so running out of the session's budget is SIGXCPU (reported as such)
    soft = want if hard == resource.RLIM_INFINITY else max(1, min(want, hard - 1))
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _reason_for(exc: BaseException) -> str | None:
    if isinstance(exc, MemoryError):
        return "memory_limit"
    if isinstance(exc, RecursionError):
        return None
    if isinstance(exc, OSError):
        if exc.errno == errno.EAGAIN and isinstance(exc, BlockingIOError):
            return "process_limit"
        if exc.errno == errno.EFBIG:
            return "file_size_limit"
        if exc.errno == errno.EMFILE:
            return "open_files_limit"
    return None


def _run_user_code(code: str, namespace: dict[str, Any]) -> tuple[int, str | None]:
    try:
        compiled = compile(code, "<sandbox>", "exec")
    except (SyntaxError, ValueError) as exc:
        traceback.print_exception(type(exc), exc, None)
        return 1, None
    try:
        exec(compiled, namespace)
        return 0, None
    except SystemExit as exc:
        if exc.code is None:
            return 0, None
        if isinstance(exc.code, int):
            return exc.code & 0xFF if exc.code >= 0 else 1, None
        print(exc.code, file=sys.stderr)
        return 1, None
    except BaseException as exc:  # the user's error is the result, not a sandbox failure
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # drop this frame
        traceback.print_exception(type(exc), exc, tb)
        return 1, _reason_for(exc)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _reset_signals() -> None:
    """Dispositions may arrive ignored from whoever started the host; the limits rely on
    SIGXCPU killing. (SIGXFSZ stays ignored, as Python sets it, so writes fail with EFBIG.)"""
    for sig in (signal.SIGXCPU, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def executor_main(fds: dict[str, int], caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> None:
    """The executor; never returns.

    With a PID namespace it is the namespace's init: it forks the *runner* that executes the
    code and only reaps processes, so the code runs with ordinary signal semantics (the kernel
    shields an init from signals it has no handler for -- SIGXCPU included) and its orphans do
    not pile up as zombies. Without one, the executor is the runner itself."""
    try:
        set_parent_death_signal()
        _reset_signals()
        workdir = _setup_executor(caps, uid, tmpfs_mb)
        devnull = os.open(os.devnull, os.O_RDONLY)
        _place_fds({0: devnull, 1: fds["out"], 2: fds["err"], _FD_REQ: fds["req"], _FD_STATUS: fds["status"]})
        if caps["pid"]:
            runner = os.fork()
            if runner != 0:
                _init_loop(runner)
            set_parent_death_signal()
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        _write_fd_message(_FD_STATUS, {"type": "setup", "workdir": workdir})
    except BaseException as exc:
        try:
            _write_fd_message(fds["status"], {"type": "setup_failed", "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(70)
    _runner_loop(workdir, uid)


def _init_loop(runner: int) -> None:
    """PID 1 of the call's namespace: reap every process; when the runner ends, report how and
    exit -- which makes the kernel kill whatever is left in the namespace."""
    for fd in (0, 1, 2, _FD_REQ):
        os.close(fd)  # the pipes reach EOF as soon as the runner and its children are gone
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        if pid == runner:
            try:
                cpu = usage.ru_utime + usage.ru_stime
                _write_fd_message(_FD_STATUS, {"type": "exit", "status": status, "cpu_s": cpu})
            finally:
                os._exit(0)


def _runner_loop(workdir: str, uid: int | None) -> None:
    """Serve requests until a one-shot call is done (then exit with the code's status) or the
    request pipe closes."""
    import builtins
    import types

    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    first = True
    while True:
        req = _read_fd_message(_FD_REQ)
        if req is None:
            os._exit(0)
        session = bool(req.get("session"))
        try:
            if first:
                os.environ.clear()
                os.environ.update(_exec_env(workdir))
                os.chdir(workdir)
                _apply_limits(req, uid, req.get("session_cpu_s") if session else None)
                sys.modules["__main__"] = main_module
                sys.argv = ["<sandbox>"]
                first = False
            if session:
                _set_call_cpu(float(req["limits"]["timeout_s"]))
        except BaseException as exc:
            _write_fd_message(_FD_STATUS, {"type": "done", "exit_code": 70, "reason": f"sandbox_error: {exc}"})
            os._exit(70)
        code, reason = _run_user_code(req["code"], main_module.__dict__)
        _flush_std()
        _write_fd_message(_FD_STATUS, {"type": "done", "exit_code": code, "reason": reason})
        if not session:
            os._exit(code)


# ------------------------------------------------------------------------------------------------
# supervisor: one per call or session
# ------------------------------------------------------------------------------------------------
_SIGNAL_REASONS = {
    signal.SIGXCPU: "cpu_time_limit",
    signal.SIGXFSZ: "file_size_limit",
    signal.SIGSEGV: "crashed (SIGSEGV)",
}


class _Executor:
    """The supervisor's handle on its executor process."""

    def __init__(self, pid: int, caps: dict[str, Any], uid: int | None, fds: dict[str, int]) -> None:
        self.pid = pid
        self.caps = caps
        self.uid = uid
        self.fds = fds
        self.status: int | None = None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None
        self.status_buf = bytearray()

    def poll(self) -> int | None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = status
        return self.status

    def signal_kill(self) -> None:
        """SIGKILL the executor and its process group without waiting (cheap)."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # as PID-namespace init: the whole namespace
            except ProcessLookupError:
                pass
        if not self.caps["pid"]:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """Kill the executor and everything it started, then reap it."""
        self.signal_kill()
        if not self.caps["pid"]:
            self._kill_uid_leftovers()
        if self.status is None:
            _, self.status = os.waitpid(self.pid, 0)

    def _kill_uid_leftovers(self) -> None:
        """Children that left the process group still run as the call's uid: a helper that
        takes that uid sends SIGKILL to every process it may signal (kill(-1, ...))."""
        if self.uid is None:
            return
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgroups([])
                    os.setgid(self.uid)
                    os.setuid(self.uid)
                    os.kill(-1, signal.SIGKILL)
                    os._exit(0)
                except ProcessLookupError:
                    os._exit(3)  # nothing left
                except BaseException:
                    os._exit(1)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) == 3:
                return


def _pop_status(ex: _Executor) -> dict[str, Any] | None:
    buf = ex.status_buf
    if len(buf) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(buf[: _HEADER.size])
    if len(buf) < _HEADER.size + size:
        return None
    body = bytes(buf[_HEADER.size : _HEADER.size + size])
    del buf[: _HEADER.size + size]
    return json.loads(body.decode("utf-8"))


def _drain_status(ex: _Executor) -> None:
    while True:
        try:
            data = os.read(ex.fds["status"], 65536)
        except BlockingIOError:
            return
        if not data:
            return
        ex.status_buf += data


def _drain(fd: int, sink: HeadTail) -> int:
    """Read whatever is buffered without blocking; returns the byte count."""
    n = 0
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return n
        if not data:
            return n
        sink.add(data)
        n += len(data)


def _take_messages(ex: _Executor, got: dict[str, dict[str, Any]]) -> None:
    """Move complete status messages from the buffer into ``got`` by type (first one wins)."""
    while True:
        msg = _pop_status(ex)
        if msg is None:
            return
        got.setdefault(str(msg.get("type")), msg)


def _supervise_call(ex: _Executor, req: dict[str, Any]) -> dict[str, Any]:
    lim = req["limits"]
    out, err = HeadTail(int(lim["max_output_bytes"])), HeadTail(int(lim["max_output_bytes"]))
    kill_bytes = int(lim["output_kill_bytes"])
    start = time.monotonic()
    deadline = start + float(lim["timeout_s"])
    _write_fd_message(
        ex.fds["req"],
        {"code": req["code"], "limits": lim, "session": bool(req.get("session")), "session_cpu_s": req.get("session_cpu_s")},
    )
    streams = {ex.fds["out"]: out, ex.fds["err"]: err}
    watch = [ex.fds["out"], ex.fds["err"], ex.fds["status"]] + ([ex.pidfd] if ex.pidfd is not None else [])
    got: dict[str, dict[str, Any]] = {}
    killed: str | None = None  # why we killed it, if we did
    while not ("done" in got or "exit" in got):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            killed = "timeout"
            break
        ready, _, _ = select.select(watch, [], [], min(remaining, 0.05 if ex.pidfd is None else remaining))
        for fd in ready:
            if fd in streams:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if data:
                    streams[fd].add(data)
                else:
                    watch.remove(fd)
            elif fd == ex.fds["status"]:
                data = os.read(fd, 65536)
                if not data:
                    watch.remove(fd)
                ex.status_buf += data
                _take_messages(ex, got)
        if out.total + err.total > kill_bytes:
            killed = "output_limit"
            break
        if not ("done" in got or "exit" in got) and ex.poll() is not None:
            _drain_status(ex)
            _take_messages(ex, got)
            break
    duration = time.monotonic() - start
    done = got.get("done")
    session_alive = bool(req.get("session")) and done is not None and killed is None
    if not session_alive:
        # Signal now, reap after replying: tearing the namespaces down takes milliseconds
        # (RCU grace periods) that the caller need not wait for.
        ex.signal_kill()
    for fd, sink in streams.items():
        _drain(fd, sink)
    reason: str | None = killed
    cpu_s: float | None = None
    if killed is not None:
        exit_code: int | None = -signal.SIGKILL
    elif done is not None:
        exit_code, reason = int(done["exit_code"]), done.get("reason")
    elif "exit" in got:  # the runner died; its init told us how
        exit_code = os.waitstatus_to_exitcode(int(got["exit"]["status"]))
        cpu_s = float(got["exit"].get("cpu_s", 0.0))
    else:
        status = ex.poll()
        exit_code = None if status is None else os.waitstatus_to_exitcode(status)
    if reason is None and exit_code is not None and exit_code < 0:
        sig = -exit_code
        reason = _SIGNAL_REASONS.get(sig) or f"killed by signal {signal.Signals(sig).name}"
        if sig == signal.SIGKILL and cpu_s is not None and cpu_s >= float(lim["cpu_s"]) - 0.05:
            reason = "cpu_time_limit"  # the hard RLIMIT_CPU (SIGXCPU was ignored)
    return {
        "type": "result",
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


def supervisor_main(host: socket.socket, caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> None:
    """One supervisor: prepare an executor now, then serve one call (or one session)."""
    set_parent_death_signal()
    if caps["pid"]:
        unshare(CLONE_NEWPID)
    req_r, req_w = os.pipe()
    status_r, status_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        host.close()
        for fd in (req_w, status_r, out_r, err_r):
            os.close(fd)
        executor_main({"req": req_r, "status": status_w, "out": out_w, "err": err_w}, caps, uid, tmpfs_mb)
    for fd in (req_r, status_w, out_w, err_w):
        os.close(fd)
    fds = {"req": req_w, "status": status_r, "out": out_r, "err": err_r}
    for fd in (status_r, out_r, err_r):
        os.set_blocking(fd, False)
    ex = _Executor(pid, caps, uid, fds)
    setup = _await_setup(ex, 30.0)
    try:
        _serve(host, ex, setup)
    finally:
        try:
            ex.kill()
        except ChildProcessError:
            pass
        if setup.get("type") == "setup" and not caps["filesystem"]:
            shutil.rmtree(setup["workdir"], ignore_errors=True)
    os._exit(0)


def _await_setup(ex: _Executor, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        msg = _pop_status(ex)
        if msg is not None:
            return msg
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"type": "setup_failed", "error": "executor set-up timed out"}
        ready, _, _ = select.select([ex.fds["status"]], [], [], remaining)
        if ready:
            data = os.read(ex.fds["status"], 65536)
            if not data:
                return {"type": "setup_failed", "error": "executor exited during set-up"}
            ex.status_buf += data


def _serve(host: socket.socket, ex: _Executor, setup: dict[str, Any]) -> None:
    req = recv_message(host)
    if req is None or req.get("type") != "run":
        return
    if setup.get("type") != "setup":
        send_message(host, _error_result(f"sandbox set-up failed: {setup.get('error')}"))
        return
    while True:
        result = _supervise_call(ex, req)
        send_message(host, result)
        if not result["session_alive"]:
            return
        req = recv_message(host)
        if req is None or req.get("type") != "run":
            return


def _error_result(message: str) -> dict[str, Any]:
    return {
        "type": "result",
        "stdout": "",
        "stderr": "",
        "stdout_truncated": 0,
        "stderr_truncated": 0,
        "exit_code": None,
        "timed_out": False,
        "killed_reason": f"sandbox_error: {message}",
        "duration_s": 0.0,
        "session_alive": False,
    }


# ------------------------------------------------------------------------------------------------
# zygote
# ------------------------------------------------------------------------------------------------
def _spawn_supervisor(ctl: socket.socket, caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> int:
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ctl.close()
            parent_end.close()
            supervisor_main(child_end, caps, uid, tmpfs_mb)
        except BaseException:
            traceback.print_exc()
        os._exit(0)
    child_end.close()
    try:
        socket.send_fds(ctl, [encode_message({"type": "worker", "pid": pid, "uid": uid})], [parent_end.fileno()])
    finally:
        parent_end.close()
    return pid


def zygote_main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--control-fd", type=int, required=True)
    ap.add_argument("--isolation", choices=["auto", "full", "rlimits"], default="auto")
    ap.add_argument("--drop-privileges", choices=["auto", "yes", "no"], default="auto")
    ap.add_argument("--uid-base", type=int, default=1_500_000_000)
    ap.add_argument("--uid-count", type=int, default=65536)
    ap.add_argument("--tmpfs-mb", type=int, default=64)
    ap.add_argument("--preload", default="")
    args = ap.parse_args(argv)
    ctl = socket.socket(fileno=args.control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    caps = probe_capabilities(args.isolation)
    problem = None
    if args.isolation == "full" and not (caps["network"] and caps["filesystem"] and caps["pid"]):
        problem = f"full isolation was required but this kernel/user allows only {caps}"
    blocked = blocked_python_paths()
    # Without a mount namespace the interpreter cannot be made readable for another uid; "auto"
    # then keeps the uid (isolation suffers, but the code can import the standard library).
    readable = caps["filesystem"] or not blocked
    drop = {"auto": caps["root"] and readable, "yes": True, "no": False}[args.drop_privileges]
    if drop and not caps["root"]:
        problem = "dropping privileges to a per-call uid needs root"
    caps["uid"] = bool(drop)
    caps["python_readable"] = readable
    for name in filter(None, args.preload.split(",")):
        try:
            __import__(name)
        except Exception as exc:  # a missing optional module must not stop the sandbox
            print(f"sandbox: preload {name!r} failed: {exc}", file=sys.stderr)
    hello = {"type": "hello", "pid": os.getpid(), "caps": caps, "error": problem}
    ctl.sendall(encode_message(hello))
    if problem:
        return 2
    counter = 0
    children: set[int] = set()
    while True:
        while children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
        ready, _, _ = select.select([ctl], [], [], 1.0)
        if not ready:
            continue
        try:
            data = ctl.recv(4096)
        except OSError:
            data = b""
        if not data:
            break  # the host closed the pool or died
        try:
            msg = json.loads(data[_HEADER.size :].decode("utf-8"))
        except ValueError:
            continue
        if msg.get("type") == "spawn":
            for _ in range(max(0, min(64, int(msg.get("n", 1))))):
                uid = args.uid_base + counter % args.uid_count if drop else None
                counter += 1
                try:
                    children.add(_spawn_supervisor(ctl, caps, uid, args.tmpfs_mb))
                except OSError:
                    break
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(zygote_main(sys.argv[1:]))
