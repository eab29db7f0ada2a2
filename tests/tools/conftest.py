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


@pytest.fixture(scope="module")
def rlimits_pool() -> Iterator[SandboxPool]:
    """The fallback mode: no namespaces, only rlimits, a process group and (as root) a uid."""
    with SandboxPool(size=1, isolation="rlimits") as p:
        yield p
