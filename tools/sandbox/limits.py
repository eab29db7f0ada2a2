"""The limits a sandboxed execution runs under, and what it reports back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits. Every field is enforced by the kernel or by the supervisor process,
    never by the sandboxed code itself.

    * ``timeout_s`` -- wall clock; at the deadline the supervisor SIGKILLs the executor and
      everything it started.
    * ``cpu_s`` -- RLIMIT_CPU of the executor (default: ``timeout_s`` rounded up, plus 1 s).
    * ``memory_mb`` -- RLIMIT_AS, the address space of each process (virtual, not RSS).
    * ``max_processes`` -- RLIMIT_NPROC for the call's own uid (a fork bomb stops here). The
      kernel counts threads too. Lowered, when needed, to ``process_limit`` (below).
    * ``max_total_memory_mb`` -- the address space of all the call's processes together. No
      rlimit sums over processes, so the sum is bounded by construction: the call gets at most
      ``process_limit = min(max_processes, max_total_memory_mb // memory_mb)`` processes of
      ``memory_mb`` each. (The private ``/tmp``, ``tmpfs_mb`` of the pool, comes on top.)
    * ``max_open_files`` -- RLIMIT_NOFILE.
    * ``max_file_mb`` -- RLIMIT_FSIZE, the largest file the code may write.
    * ``max_output_bytes`` -- how much of stdout and of stderr is kept (head and tail).
    * ``output_kill_bytes`` -- total output after which the call is killed (``output_limit``).
    """

    timeout_s: float = 10.0
    memory_mb: int = 512
    cpu_s: float | None = None
    max_processes: int = 32
    max_total_memory_mb: int = 2048
    max_open_files: int = 64
    max_file_mb: int = 16
    max_output_bytes: int = 64 * 1024
    output_kill_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_total_memory_mb", "max_open_files",
                     "max_file_mb", "max_output_bytes", "output_kill_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.cpu_s is not None and self.cpu_s <= 0:
            raise ValueError(f"SandboxLimits.cpu_s must be > 0, got {self.cpu_s!r}")
        if self.max_open_files < 16:
            raise ValueError("SandboxLimits.max_open_files must be >= 16 (python needs a few)")
        if self.memory_mb > self.max_total_memory_mb:
            raise ValueError(
                f"SandboxLimits.memory_mb ({self.memory_mb}) exceeds max_total_memory_mb "
                f"({self.max_total_memory_mb}): one process cannot have more than the whole call"
            )

    @property
    def process_limit(self) -> int:
        """The RLIMIT_NPROC a call gets: ``max_processes``, lowered so that ``memory_mb`` per
        process times the processes stays within ``max_total_memory_mb``."""
        return min(self.max_processes, self.max_total_memory_mb // self.memory_mb)

    def with_overrides(self, **overrides: Any) -> SandboxLimits:
        """A copy with the given fields replaced (``None`` values are ignored)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def to_wire(self) -> dict[str, Any]:
        wire = asdict(self)
        wire["cpu_s"] = self.cpu_s if self.cpu_s is not None else int(self.timeout_s + 0.999) + 1
        wire["max_processes"] = self.process_limit
        return wire


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed execution did.

    ``exit_code`` is the process status (negative: killed by that signal; ``None``: the
    sandbox itself failed). ``killed_reason`` says why the code stopped early, when it did:
    ``timeout``, ``cpu_time_limit``, ``memory_limit``, ``process_limit``, ``file_size_limit``,
    ``open_files_limit``, ``output_limit``, ``killed by signal SIGx``, ``session_ended`` or
    ``sandbox_error: ...``. ``stdout``/``stderr`` keep the head and the tail when longer than
    the cap; ``*_truncated`` count the bytes dropped from the middle.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    killed_reason: str | None
    duration_s: float
    stdout_truncated: int = 0
    stderr_truncated: int = 0
    isolation: dict[str, bool] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None

    def summary(self) -> str:
        """Plain text for a model: the output, then a status line when something went wrong."""
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(("stderr:\n" if self.stdout else "") + self.stderr.rstrip("\n"))
        status = []
        if self.timed_out:
            status.append(f"timed out after {self.duration_s:.1f} s")
        elif self.killed_reason:
            status.append(f"stopped: {self.killed_reason}")
            if self.exit_code not in (0, None, -9) and self.exit_code > 0:
                status.append(f"exit code {self.exit_code}")
        elif self.exit_code not in (0, None):
            status.append(f"exit code {self.exit_code}")
        if status:
            parts.append(f"[{'; '.join(status)}]")
        return "\n".join(parts) if parts else "(no output)"
