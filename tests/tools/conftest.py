"""Fixtures of the tool tests: sandbox pools shared by a test module and closed after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from relax_gym.tools import SandboxPool


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    """A pool with every isolation the kernel allows (namespaces, when we are root)."""
    with SandboxPool(size=2) as p:
        yield p


# Without a mount namespace, a per-call uid may not be able to read the interpreter (here it
# lives under a 0700 /root); the fallback tests force the uid drop anyway and preload the
# modules their attack code imports, so that the uid-based protections are exercised too.
FALLBACK_PRELOAD = ("json", "glob", "subprocess", "socket", "signal", "time", "uuid")


@pytest.fixture(scope="module")
def rlimits_pool() -> Iterator[SandboxPool]:
    """The fallback mode: no namespaces; rlimits, a process group and (as root) a per-call uid."""
    import os

    drop = "yes" if os.geteuid() == 0 else "no"
    with SandboxPool(size=1, isolation="rlimits", drop_privileges=drop, preload=FALLBACK_PRELOAD) as p:
        yield p
