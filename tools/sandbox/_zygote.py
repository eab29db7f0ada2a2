"""The process side of the python sandbox: zygote, supervisor, executor and runner
(standard library, plus ``pyseccomp`` for the syscall filter where libseccomp is installed).

The host (``pool.py``) starts this file once, as ``python -I _zygote.py --control-fd N``, with a
minimal environment. The processes:

* **zygote** -- one per pool. It probes which isolation the kernel allows, builds the seccomp
  filter, optionally imports slow modules once (``--preload numpy``), freezes its heap for the
  garbage collector and forks supervisors on request. Each new supervisor's socket goes to the
  host over the control socket (``SCM_RIGHTS``); the zygote stays off the call path.
* **supervisor** -- one per call (or stateful session), in a session of its own. It prepares
  an executor *before* any request, then hands four pipes (request, status, stdout, stderr)
  to the host and steps aside: the host drives the call. The supervisor keeps a backstop
  deadline (it kills the executor if the host overruns the call's timeout by
  ``BACKSTOP_MARGIN_S``), reports how the executor ended, and kills, reaps and cleans up when
  the host lets go of the worker.
* **executor** (E) -- set up off the call path: a new network namespace (no interface is up,
  so there is no network at all), a new mount namespace in which every mount is read-only and
  ``/tmp`` is a fresh size-limited tmpfs owned by the call's uid (the working directory, gone
  with the namespace), a private ``/proc``, and the interpreter's own directories bound back
  if they sit under a directory other users cannot enter (e.g. a pyenv under ``/root``). With
  a PID namespace E is its init, and its death kills every process the code started. E is the
  only process of the call that holds the host's status pipe, and it never runs user code: it
  reports each call's result after checking it, and the runner's death.
* **runner** (R) -- E's child. It loads the seccomp filter, reads the host's request, applies
  rlimits, drops to the call's uid, clears the environment and ``exec``s the code in a fresh
  ``__main__``. Before the code runs it has closed every descriptor of the host's channel: a
  one-shot call holds only stdin, stdout and stderr; a session also the read end of the
  request pipe, on which its next request arrives (root's, mode 0600: the code can read its
  own requests, never write there). R ends a call by writing a small result record into a
  page it shares with E and stopping itself (SIGSTOP): the kernel tells E of the stop, and E
  checks the record (size, schema, sequence number) before it tells the host, which then
  continues a session's R (SIGCONT through a pidfd) with the next request.

Where the kernel refuses namespaces (or ``isolation="rlimits"`` is asked for), the executor runs
in a fresh temporary directory on the host's disk, leading its own process group, with the same
rlimits, seccomp filter and uid drop (when we are root); killing targets the process group and,
as the call's uid, every process that escaped it. docs/tools.md says what that mode does not
enforce.

Messages are length-prefixed JSON on pipes; over the SEQPACKET sockets each datagram is one
such message, optionally carrying file descriptors. Every reader bounds what it buffers and
checks what it parses.
"""

from __future__ import annotations

import ctypes
import errno
import io
import json
import math
import mmap
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
from typing import Any, NoReturn

# ------------------------------------------------------------------------------------------------
# framing (also imported by the host side)
# ------------------------------------------------------------------------------------------------
_HEADER = struct.Struct("!I")
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def encode_message(obj: Any) -> bytes:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
    return _HEADER.pack(len(data)) + data


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


def _read_fd_message(fd: int, limit: int = MAX_MESSAGE_BYTES) -> Any | None:
    """One message from a trusted writer (the host, or E relaying it); None at EOF or when the
    announced size is over ``limit``."""
    head = _read_fd_exact(fd, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > limit:
        return None
    body = _read_fd_exact(fd, size)
    return None if body is None else json.loads(body.decode("utf-8"))


# ------------------------------------------------------------------------------------------------
# kernel interfaces that the os module lacks on Python 3.11
# ------------------------------------------------------------------------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                   CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME)
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
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
    enc = lambda s: None if s is None else s.encode()
    rc = _c().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(rc, f"mount {target}")


MNT_DETACH = 2


def umount(target: str) -> None:
    _check(_c().umount2(target.encode(), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    _c().prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0)


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (an executor without a PID namespace leads one); a group
    already gone, or no longer ours to signal, is not an error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
    """Which protections this kernel and user allow, after the requested isolation level.
    (The seccomp filter is not a namespace: every mode gets it where libseccomp works.)"""
    root = os.geteuid() == 0
    caps = {"network": False, "filesystem": False, "pid": False, "uid": root, "root": root,
            "seccomp": _probe_seccomp()}
    if isolation == "rlimits":
        return caps
    caps["network"] = _probe_in_child(lambda: unshare(CLONE_NEWNET | CLONE_NEWIPC))
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
# seccomp: what the code may not ask of the kernel
# ------------------------------------------------------------------------------------------------
# Denied with EPERM, by family:
# * namespaces -- a user namespace gives an unprivileged process every capability inside it
#   (mounts, raw sockets, its own network stack: the kernel's widest attack surface), and no
#   other namespace has a use in the sandbox either. clone and unshare are refused when they
#   carry any CLONE_NEW* flag, setns always. clone3 keeps its flags in memory a filter cannot
#   read, so it fails with ENOSYS and the C library falls back to clone.
# * memory that RLIMIT_AS does not count -- SysV shared memory, message queues and semaphore
#   sets (they outlive every process that maps them) and memfd_create (an unmapped memfd).
# * kernel interfaces no sandboxed program needs and exploits favour: keyrings (not
#   namespaced), bpf, userfaultfd, perf_event_open, io_uring.
# A system call through another ABI (i386 ``int 0x80``, x32) kills the process: the filter
# is written for the native one. The filter is loaded with no_new_privs, so set-uid programs
# (newuidmap, su) cannot regain privileges either.
DENIED_SYSCALLS = (
    "setns", "shmget", "msgget", "semget", "memfd_create", "memfd_secret",
    "keyctl", "add_key", "request_key", "bpf", "userfaultfd", "perf_event_open",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip
_SECCOMP: Any = None  # the zygote's filter, loaded by every runner before it takes a request


def build_seccomp_filter() -> Any:
    """The runner's syscall filter (a ``pyseccomp.SyscallFilter``, not yet loaded)."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for call in ("unshare", "clone"):  # the flags are argument 0 of both (x86_64, arm64)
        for flag in NAMESPACE_FLAGS:
            flt.add_rule(sc.ERRNO(errno.EPERM), call, sc.Arg(0, sc.MASKED_EQ, flag, flag))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):
            pass  # unknown to this architecture or libseccomp: nothing to deny
    return flt


def _probe_seccomp() -> bool:
    """Whether the filter loads and really refuses a user namespace (checked in a child)."""
    if _SECCOMP is None:
        return False

    def check() -> None:
        _SECCOMP.load()
        try:
            unshare(CLONE_NEWUSER)
        except OSError as exc:
            if exc.errno == errno.EPERM:
                return
        raise OSError("unshare(CLONE_NEWUSER) was not refused under the filter")

    return _probe_in_child(check)


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
# executor and runner: run the user's code
# ------------------------------------------------------------------------------------------------
# Descriptor numbers inside the executor (E) and the runner (R). Only R runs user code, and it
# closes every descriptor that carries anything back to the host before it does.
_FD_REQ = 3        # host -> R: the requests (a one-shot R closes it after the first; E never has it)
_FD_STATUS = 4     # E -> host: done / exit / fault (R writes "setup" on it, then closes it)

MAX_REQUEST_BYTES = 16 * 1024 * 1024  # the largest request (code and limits) the host sends
# R ends each call by writing a result record (one JSON object) into a page it shares with E
# and stopping itself with SIGSTOP; E learns of the stop from the kernel (wait4), reads the
# page and tells the host. The code can write that page too, so a record may only say what
# the code could cause anyway: an exit code 0-255 and one of these reasons (raise MemoryError
# gives "memory_limit", ...).
RESULT_PAGE_BYTES = 256
RESULT_REASONS = ("memory_limit", "process_limit", "file_size_limit", "open_files_limit", "limits_failed")


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


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _setup_executor(caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> str:
    """Namespaces and the working directory; runs before any request (off the call path)."""
    if caps["network"]:
        unshare(CLONE_NEWNET | CLONE_NEWIPC)  # no network; no SysV IPC or POSIX queues shared
    if caps["filesystem"]:
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        if uid is not None:
            expose_python(blocked_python_paths())
        # Path-based Unix sockets ignore network namespaces; /run is where hosts keep them
        # (D-Bus, container runtimes), so the sandbox gets an empty one.
        for run_dir in ("/run", "/var/run"):
            if os.path.isdir(run_dir) and not os.path.islink(run_dir):
                mount("tmpfs", run_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
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
    cpu = math.ceil(lim["cpu_s"])
    hard_cpu = session_cpu_s if session_cpu_s is not None else cpu + 1
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard_cpu), hard_cpu))
    mem = int(lim["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    fsize = int(lim["max_file_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(lim["max_open_files"]),) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))  # POSIX message queues live outside RLIMIT_AS
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
    want = math.ceil(spent + timeout_s) + 1
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
    """The executor (E); never returns.

    E sets up the call's isolation, forks the *runner* (R) that executes the code, and from
    then on is the only process of the call that holds the host's status pipe. R has no
    descriptor towards E or the host while the code runs: it ends a call by stopping itself
    after writing a small result into a shared page, which E checks (size, schema, sequence)
    before it tells the host. With a PID namespace E is the namespace's init: it reaps every
    orphan, and its exit kills whatever the code left. Without one, E leads the process group
    the host kills and is the subreaper of the code's orphans."""
    status_fd = fds["status"]
    try:
        set_parent_death_signal()
        _reset_signals()
        workdir = _setup_executor(caps, uid, tmpfs_mb)
        devnull = os.open(os.devnull, os.O_RDONLY)
        _place_fds({0: devnull, 1: fds["out"], 2: fds["err"], _FD_REQ: fds["req"], _FD_STATUS: fds["status"]})
        status_fd = _FD_STATUS
        os.setsid()  # a fresh scheduler autogroup (and, without a PID namespace, the group the host kills)
        if not caps["pid"]:
            _c().prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0)
        page = mmap.mmap(-1, RESULT_PAGE_BYTES, flags=mmap.MAP_SHARED)  # anonymous: no descriptor
        runner = os.fork()
        if runner == 0:
            _runner_main(workdir, uid, caps, page)
        _close(0, 1, 2, _FD_REQ)  # stdout and stderr reach EOF once R and its children are gone
    except BaseException as exc:
        try:
            _write_fd_message(status_fd, {"type": "setup_failed", "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(70)
    _Relay(runner, caps, page).serve()


def _runner_main(workdir: str, uid: int | None, caps: dict[str, Any], page: mmap.mmap) -> NoReturn:
    """R: prepare off the call path, announce readiness, then serve the call (or session)."""
    try:
        set_parent_death_signal()
        if caps["pid"]:
            # A session of its own gives the code a fresh scheduler autogroup; on a busy machine
            # that is what lets the runner wake up promptly. (Without a PID namespace E made the
            # session, whose process group the host kills.)
            os.setsid()
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
        _warm_up()
        if _SECCOMP is not None and caps.get("seccomp"):
            _SECCOMP.load()  # inherited by everything the code starts; sets no_new_privs
        _write_fd_message(_FD_STATUS, {"type": "setup", "workdir": workdir})
    except BaseException as exc:
        try:
            _write_fd_message(_FD_STATUS, {"type": "setup_failed", "error": f"{type(exc).__name__}: {exc}"})
        finally:
            os._exit(70)
    os.close(_FD_STATUS)
    _runner_loop(workdir, uid, page)


def _warm_up() -> None:
    """Walk the request path once on dummy data: the pages it touches are copied from the
    zygote now, not during the call (each copy-on-write fault costs microseconds)."""
    import builtins

    json.loads(encode_message({"code": "pass", "limits": {"timeout_s": 1}})[_HEADER.size :].decode("utf-8"))
    saved = sys.stdout
    sys.stdout = io.StringIO()
    try:
        exec(compile("print(sum(range(3)))\n", "<warm-up>", "exec"), {"__builtins__": builtins})
    finally:
        sys.stdout = saved
    encode_result(1, 0, None)


def encode_result(seq: int, exit_code: int, reason: str | None) -> bytes:
    """A result record as R writes it into the shared page."""
    return json.dumps({"seq": seq, "exit_code": exit_code, "reason": reason}).encode("ascii")


def _end_call(page: mmap.mmap, seq: int, exit_code: int, reason: str | None) -> None:
    """Publish the call's result and stop until the host continues R (a session's next
    request) or the call is torn down. SIGSTOP can be neither caught nor blocked."""
    record = encode_result(seq, exit_code, reason)
    page[:] = record + bytes(RESULT_PAGE_BYTES - len(record))
    os.kill(os.getpid(), signal.SIGSTOP)


def _runner_loop(workdir: str, uid: int | None, page: mmap.mmap) -> NoReturn:
    """Serve the request, or -- in a session -- one request per continue from the host.

    A one-shot call closes the request pipe before the code runs, so the code holds nothing
    but stdin, stdout and stderr. A session keeps only the read end of that pipe, on which its
    next request arrives: the pipe was made by root with mode 0600, so the code can neither
    write to it nor re-open it for writing through /proc; it can only read its own session's
    requests."""
    import builtins
    import types

    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    req = _read_fd_message(_FD_REQ, MAX_REQUEST_BYTES)
    if not isinstance(req, dict):
        os._exit(0)
    session = bool(req.get("session"))
    seq = req.get("seq", 1)
    if not session:
        os.close(_FD_REQ)
    try:
        os.environ.clear()
        os.environ.update(_exec_env(workdir))
        os.chdir(workdir)
        _apply_limits(req, uid, req.get("session_cpu_s") if session else None)
        sys.modules["__main__"] = main_module
        sys.argv = ["<sandbox>"]
    except BaseException as exc:
        print(f"sandbox: the limits could not be applied: {exc}", file=sys.stderr, flush=True)
        _end_call(page, seq, 70, "limits_failed")
        os._exit(70)
    while True:
        try:
            if session:
                _set_call_cpu(float(req["limits"]["timeout_s"]))
        except BaseException:
            _end_call(page, seq, 70, "limits_failed")
            os._exit(70)
        code, reason = _run_user_code(req["code"], main_module.__dict__)
        _flush_std()
        _end_call(page, seq, code, reason)
        if not session:
            os._exit(code)  # only if something continued R: E reported the call already
        req = _read_fd_message(_FD_REQ, MAX_REQUEST_BYTES)
        if not isinstance(req, dict):
            os._exit(0)
        seq = req.get("seq")


class _Relay:
    """E's loop: wait for R to stop or end, check what it says, and tell the host -- in
    messages E writes itself. It also reaps every orphan (E is their init or subreaper).

    A stop of R is the end of a call; the shared page must then hold exactly one well-formed
    record for that call (sequence numbers go 1, 2, 3...). Anything else -- no record, a
    malformed one, a wrong sequence number -- is a *fault*: E reports it, kills the call and
    exits. E reads nothing but the kernel's wait statuses and that page."""

    def __init__(self, runner: int, caps: dict[str, Any], page: mmap.mmap) -> None:
        self.runner = runner
        self.runner_alive = True
        self.caps = caps
        self.page = page
        self.expect = 1

    def serve(self) -> NoReturn:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WUNTRACED)
            except ChildProcessError:
                os._exit(0)
            except InterruptedError:
                continue
            if pid != self.runner:
                continue  # an orphan reaped (or a stopped one: the end of the call kills it)
            if os.WIFSTOPPED(status):
                self._take_result(os.WSTOPSIG(status))
            else:
                self.runner_alive = False  # reaped: its pid may be reused, never signal it again
                cpu = usage.ru_utime + usage.ru_stime
                self._finish({"type": "exit", "status": status, "cpu_s": cpu})

    def _take_result(self, stop_signal: int) -> None:
        raw = bytes(self.page[:])
        self.page[:] = bytes(RESULT_PAGE_BYTES)  # a record counts once
        record = parse_result(raw.rstrip(b"\0")) if stop_signal == signal.SIGSTOP else None
        if record is None:
            self._fault(f"the sandboxed program stopped (signal {stop_signal}) without a well-formed result")
        seq, exit_code, reason = record
        if seq != self.expect:
            self._fault(f"the sandboxed program reported a result for call {seq}, not {self.expect}")
        self.expect += 1
        _write_fd_message(_FD_STATUS, {"type": "done", "seq": seq, "exit_code": exit_code, "reason": reason})

    def _fault(self, why: str) -> NoReturn:
        self._finish({"type": "fault", "error": why}, kill=True)

    def _finish(self, message: dict[str, Any], kill: bool = False) -> NoReturn:
        """Report and end the call: with a PID namespace E's exit kills everything in it;
        without one E kills its process group, itself included."""
        try:
            _write_fd_message(_FD_STATUS, message)
        except OSError:
            pass
        if self.runner_alive:
            try:
                os.kill(self.runner, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if kill and not self.caps["pid"]:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # E included, after its report
        os._exit(0)


def parse_result(raw: bytes) -> tuple[int, int, str | None] | None:
    """A result record's (seq, exit code, reason), or None when it is not exactly one."""
    if len(raw) > RESULT_PAGE_BYTES:
        return None
    try:
        record = json.loads(raw.decode("ascii"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or set(record) != {"seq", "exit_code", "reason"}:
        return None
    seq, exit_code, reason = record["seq"], record["exit_code"], record["reason"]
    if type(seq) is not int or type(exit_code) is not int or not 0 <= exit_code <= 255:
        return None
    if reason is not None and reason not in RESULT_REASONS:
        return None
    return seq, exit_code, reason


# ------------------------------------------------------------------------------------------------
# supervisor: one per call or session, off the call path
# ------------------------------------------------------------------------------------------------
BACKSTOP_MARGIN_S = 2.0
SHUTDOWN_GRACE_S = 3.0
REAP_GRACE_S = 10.0
_PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = 1031


def _grow_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer, so printing rarely blocks (the default is 64 KiB)."""
    import fcntl

    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass


class _Executor:
    """The supervisor's handle on its executor process."""

    def __init__(self, pid: int, caps: dict[str, Any], uid: int | None) -> None:
        self.pid = pid
        self.caps = caps
        self.uid = uid
        self.status: int | None = None
        self.cpu_s = 0.0
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def poll(self, block: bool = False) -> int | None:
        if self.status is None:
            pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
            if pid == self.pid:
                self.status = status
                self.cpu_s = usage.ru_utime + usage.ru_stime
        return self.status

    def signal_kill(self) -> None:
        """SIGKILL the executor and its process group without waiting (cheap)."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # as PID-namespace init: the whole namespace
            except ProcessLookupError:
                pass
        if not self.caps["pid"]:
            kill_group(self.pid)

    def kill(self) -> None:
        """Kill the executor and everything it started, then reap it."""
        self.signal_kill()
        if not self.caps["pid"]:
            self._kill_uid_leftovers()
        try:
            self.poll(block=True)
        except ChildProcessError:
            pass

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


SETUP_MESSAGE_MAX = 64 * 1024


def _await_setup(status_fd: int, timeout_s: float) -> dict[str, Any]:
    """The executor's set-up report (read with a size bound, checked for shape)."""
    deadline = time.monotonic() + timeout_s
    buf = bytearray()
    while True:
        if len(buf) >= _HEADER.size:
            (size,) = _HEADER.unpack(buf[: _HEADER.size])
            if size > SETUP_MESSAGE_MAX:
                return {"type": "setup_failed", "error": "the executor's set-up report is oversized"}
            if len(buf) >= _HEADER.size + size:
                try:
                    msg = json.loads(bytes(buf[_HEADER.size : _HEADER.size + size]).decode("utf-8"))
                except (ValueError, RecursionError):
                    msg = None
                if not isinstance(msg, dict) or not isinstance(msg.get("workdir", msg.get("error")), str):
                    return {"type": "setup_failed", "error": "the executor's set-up report is malformed"}
                return msg
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"type": "setup_failed", "error": "executor set-up timed out"}
        ready, _, _ = select.select([status_fd], [], [], remaining)
        if ready:
            try:
                data = os.read(status_fd, _HEADER.size + SETUP_MESSAGE_MAX - len(buf))
            except BlockingIOError:
                continue
            if not data:
                return {"type": "setup_failed", "error": "executor exited during set-up"}
            buf += data


def supervisor_main(host: socket.socket, caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> None:
    """One supervisor: prepare an executor, hand its pipes to the host, then guard it.

    The host then drives the call through the pipes (its request to the runner, the executor's
    reports back); the supervisor stays off the call path and only (1) kills the executor if
    the host's deadline passes by more than ``BACKSTOP_MARGIN_S`` (should the host be
    stalled), (2) tells the host how the executor ended, and (3) cleans up when the host lets
    go."""
    set_parent_death_signal()
    os.setsid()  # a fresh scheduler autogroup: see executor_main
    if caps["pid"]:
        unshare(CLONE_NEWPID)
    else:
        # Orphans of the executor (the runner, when the host kills the executor first) come
        # here, to be reaped before the supervisor exits, not by the machine's init.
        _c().prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0)
    req_r, req_w = os.pipe()
    status_r, status_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for fd in (req_w, out_r, err_r):
        _grow_pipe(fd)
    pid = os.fork()
    if pid == 0:
        host.close()
        for fd in (req_w, status_r, out_r, err_r):
            os.close(fd)
        executor_main({"req": req_r, "status": status_w, "out": out_w, "err": err_w}, caps, uid, tmpfs_mb)
    for fd in (req_r, status_w, out_w, err_w):
        os.close(fd)
    for fd in (status_r, out_r, err_r):
        os.set_blocking(fd, False)
    ex = _Executor(pid, caps, uid)
    setup = _await_setup(status_r, 30.0)
    runner = _find_runner(pid) if setup.get("type") == "setup" else None
    if setup.get("type") == "setup" and runner is None:
        setup = {"type": "setup_failed", "error": "the runner process could not be found"}
    try:
        try:
            if runner is not None:
                ready = {"type": "ready", "executor_pid": pid, "runner_pid": runner[0], "workdir": setup["workdir"]}
                pidfd = [runner[1]] if runner[1] is not None else []
                socket.send_fds(host, [encode_message(ready)], [req_w, status_r, out_r, err_r, *pidfd])
            else:
                host.send(encode_message({"type": "failed", "error": str(setup.get("error"))}))
        finally:
            for fd in (req_w, status_r, out_r, err_r) + ((runner[1],) if runner and runner[1] is not None else ()):
                os.close(fd)
        if setup.get("type") == "setup":
            _guard(host, ex)
    except OSError:
        pass  # the host went away
    finally:
        ex.kill()
        # Everything left was SIGKILLed: wait for it (a loaded machine can take seconds to
        # tear down a big interpreter). What still outlives this goes to the zygote, the
        # subreaper above us, never to the machine's init (which may not reap at all).
        _reap_children(time.monotonic() + REAP_GRACE_S)
        if setup.get("type") == "setup" and not caps["filesystem"]:
            shutil.rmtree(setup["workdir"], ignore_errors=True)
    os._exit(0)


def _executor_children(executor: int) -> list[int]:
    try:
        with open(f"/proc/{executor}/task/{executor}/children", encoding="ascii") as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def _find_runner(executor: int) -> tuple[int, int | None] | None:
    """The runner's pid (as the host sees it) and a pidfd for it: the host continues a
    session's runner with SIGCONT. Once set up, the executor has exactly one child."""
    children = _executor_children(executor)
    if len(children) != 1:
        return None
    try:
        pidfd: int | None = os.pidfd_open(children[0])
    except (AttributeError, OSError):
        pidfd = None
    if _executor_children(executor) != children:  # still the executor's child: the pidfd is the runner's
        if pidfd is not None:
            os.close(pidfd)
        return None
    return children[0], pidfd


def _reap_children(deadline: float) -> None:
    """Reap every child (orphans included) until none is left or the deadline passes."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.005)


def _guard(host: socket.socket, ex: _Executor) -> None:
    """Wait for the host to let go or the executor to end; enforce the backstop deadline."""
    deadline: float | None = None
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if ex.pidfd is None:
            wait = 0.05 if wait is None else min(wait, 0.05)
        ready, _, _ = select.select([host] + ([ex.pidfd] if ex.pidfd is not None else []), [], [], wait)
        if deadline is not None and time.monotonic() >= deadline:
            ex.signal_kill()  # the host should have killed it by now
            deadline = None
        if host in ready:
            data = host.recv(65536)
            if not data:
                return  # the host is done with this worker
            try:
                msg = json.loads(data[_HEADER.size :].decode("utf-8"))
            except ValueError:
                msg = {}
            if msg.get("type") == "call":
                deadline = time.monotonic() + float(msg["timeout_s"]) + BACKSTOP_MARGIN_S
            elif msg.get("type") == "idle":
                deadline = None
        if ex.poll() is not None:
            try:
                host.send(encode_message({"type": "exit", "status": ex.status, "cpu_s": ex.cpu_s}))
            except OSError:
                pass
            return


def _spawn_supervisor(ctl: socket.socket, caps: dict[str, Any], uid: int | None, tmpfs_mb: int) -> int:
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
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


def _zygote_arguments(argv: list[str]) -> Any:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--control-fd", type=int, required=True)
    ap.add_argument("--isolation", choices=["auto", "full", "rlimits"], default="auto")
    ap.add_argument("--drop-privileges", choices=["auto", "yes", "no"], default="auto")
    ap.add_argument("--uid-base", type=int, default=1_500_000_000)
    ap.add_argument("--uid-count", type=int, default=65536)
    ap.add_argument("--tmpfs-mb", type=int, default=64)
    ap.add_argument("--preload", default="")
    return ap.parse_args(argv)


def _zygote_capabilities(isolation: str, drop_privileges: str) -> tuple[dict[str, Any], str | None]:
    """Build the seccomp filter, probe what the kernel allows and decide on the uid drop:
    (caps, the reason the sandbox cannot start or None)."""
    global _SECCOMP
    try:
        _SECCOMP = build_seccomp_filter()
    except Exception as exc:  # no pyseccomp or libseccomp: reported as seccomp=False
        print(f"sandbox: no seccomp filter: {exc}", file=sys.stderr)
    caps = probe_capabilities(isolation)
    problem = None
    if isolation == "full" and not all(caps[k] for k in ("network", "filesystem", "pid", "seccomp")):
        problem = f"full isolation was required but this kernel/user allows only {caps}"
    blocked = blocked_python_paths()
    # Without a mount namespace the interpreter cannot be made readable for another uid; "auto"
    # then keeps the uid (isolation suffers, but the code can import the standard library).
    readable = caps["filesystem"] or not blocked
    drop = {"auto": caps["root"] and readable, "yes": True, "no": False}[drop_privileges]
    if drop and not caps["root"]:
        problem = "dropping privileges to a per-call uid needs root"
    caps["uid"] = bool(drop)
    caps["python_readable"] = readable
    return caps, problem


def _preload(names: str) -> None:
    """Import the comma-separated modules once, then freeze the heap: everything imported so
    far is shared copy-on-write with every worker, and the garbage collector must not walk (and
    so copy) those pages in each of them."""
    for name in filter(None, names.split(",")):
        try:
            __import__(name)
        except Exception as exc:  # a missing optional module must not stop the sandbox
            print(f"sandbox: preload {name!r} failed: {exc}", file=sys.stderr)
    import gc

    gc.collect()
    gc.freeze()


def _reap_exited(children: set[int]) -> None:
    """Reap whatever has exited without waiting for the rest: the supervisors, and (as the
    subreaper) any process whose supervisor died before it could reap it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)


def _serve_spawn_requests(ctl: socket.socket, caps: dict[str, Any], args: Any) -> set[int]:
    """Fork supervisors as the host asks until it closes the control socket; the live ones."""
    counter = 0
    children: set[int] = set()
    while True:
        _reap_exited(children)
        ready, _, _ = select.select([ctl], [], [], 1.0)
        if not ready:
            continue
        try:
            data = ctl.recv(4096)
        except OSError:
            data = b""
        if not data:
            return children  # the host closed the pool or died
        try:
            msg = json.loads(data[_HEADER.size :].decode("utf-8"))
        except ValueError:
            continue
        if msg.get("type") != "spawn":
            continue
        for _ in range(max(0, min(64, int(msg.get("n", 1))))):
            uid = args.uid_base + counter % args.uid_count if caps["uid"] else None
            counter += 1
            try:
                children.add(_spawn_supervisor(ctl, caps, uid, args.tmpfs_mb))
            except OSError:
                break


def _stop_supervisors(children: set[int]) -> None:
    """The host let go of every worker socket: idle supervisors see EOF and clean up (kill,
    reap, remove their work directory). Give them a moment before the hard kill."""
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.02)
        else:
            children.discard(pid)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap_children(time.monotonic() + SHUTDOWN_GRACE_S)  # them, and orphans they left us


def zygote_main(argv: list[str]) -> int:
    args = _zygote_arguments(argv)
    ctl = socket.socket(fileno=args.control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Not dumpable (inherited by every fork): a process of the same uid -- the code, where no
    # per-call uid is dropped to -- cannot ptrace these processes or open their descriptors
    # through /proc.
    _c().prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), 0, 0, 0)
    # Orphans of a supervisor that died (killed by the host, or out of time reaping) come here
    # and are reaped each tick: in a container the machine's init may never reap them.
    _c().prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0)
    caps, problem = _zygote_capabilities(args.isolation, args.drop_privileges)
    _preload(args.preload)
    ctl.sendall(encode_message({"type": "hello", "pid": os.getpid(), "caps": caps, "error": problem}))
    if problem:
        return 2
    _stop_supervisors(_serve_spawn_requests(ctl, caps, args))
    return 0


if __name__ == "__main__":
    sys.exit(zygote_main(sys.argv[1:]))
