"""Sandboxed execution of untrusted Python: ``run_python``, a warm pool, stateful sessions.

See docs/tools.md for what is enforced where (namespaces, rlimits, per-call uid, wall clock).
"""

from .limits import ExecResult, SandboxLimits
from .pool import (
    PythonSession,
    SandboxError,
    SandboxPool,
    configure_default_pool,
    default_pool,
    run_python,
)

__all__ = [
    "ExecResult",
    "PythonSession",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "configure_default_pool",
    "default_pool",
    "run_python",
]
