"""Stop a run whose episodes keep failing in the env, instead of training on nothing.

An episode whose env raised (``reset``/``step``, a timeout, a malformed observation) ends with
``stop_reason == "env_error"`` and is never trained on. One such episode now and then is the
env's bad luck; most of a step's episodes failing means a broken env or config, and a run that
goes on would finish with exit 0 having learnt nothing. ``rollout.max_env_error_rate`` (default
0.5) is the share of a step's episodes that may fail; above it the run stops with
:class:`EnvErrorRateExceeded` (``relax-gym train`` exits with :data:`EXIT_CODE`).

Both runners use :class:`EnvErrorWindow`: the colocate loop over each step's (and each
evaluation's) episodes, the asynchronous producer over the last step's worth of finished
episodes (a group failing whole is redrawn, so there a step may never complete).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from relax_gym.errors import RelaxGymError, find_cause

#: ``relax-gym train``'s exit status when the run stopped for env errors.
EXIT_CODE = 3


class EnvErrorRateExceeded(RelaxGymError, RuntimeError):
    """Too many of a step's episodes failed in the env; the message names the count, the rate
    and the first error."""


class EnvErrorWindow:
    """The last ``size`` episodes' outcomes (env error or not) and their first error."""

    def __init__(self, size: int, max_rate: float) -> None:
        self.size = max(1, int(size))
        self.max_rate = float(max_rate)
        self._window: deque[tuple[bool, str]] = deque(maxlen=self.size)

    def add(self, trajectories: Iterable[Any]) -> None:
        """Record finished episodes (one per episode: the first part of a split one); aborted
        ones -- cut short by a stop or a weight update -- say nothing about the env."""
        for t in trajectories:
            if getattr(t, "part", 0) != 0 or t.stop_reason == "aborted":
                continue
            failed = t.stop_reason == "env_error"
            self._window.append((failed, f"{t.env_id}: {t.error}" if failed else ""))

    @property
    def full(self) -> bool:
        return len(self._window) >= self.size

    def check(self, where: str, *, require_full: bool = False) -> None:
        """Raise :class:`EnvErrorRateExceeded` when the recorded error rate is above the bound."""
        if not self._window or (require_full and not self.full):
            return
        errors = [msg for failed, msg in self._window if failed]
        rate = len(errors) / len(self._window)
        if rate > self.max_rate:
            raise EnvErrorRateExceeded(
                f"{where}: {len(errors)} of {len(self._window)} episodes ({rate:.0%}) failed in the env, above "
                f"rollout.max_env_error_rate = {self.max_rate:g}; first error: {' '.join(errors[0].split())[:500]}"
            )

    def clear(self) -> None:
        self._window.clear()


def find_env_error_stop(exc: BaseException) -> EnvErrorRateExceeded | None:
    """The :class:`EnvErrorRateExceeded` behind ``exc`` (itself, a cause, or what a Ray actor raised)."""
    return find_cause(exc, EnvErrorRateExceeded)


def check_env_errors(trajectories: Iterable[Any], max_rate: float, where: str) -> None:
    """One batch's check: raise when more than ``max_rate`` of its episodes failed in the env."""
    episodes = list(trajectories)
    window = EnvErrorWindow(max(1, len(episodes)), max_rate)
    window.add(episodes)
    window.check(where)


__all__ = ["EXIT_CODE", "EnvErrorRateExceeded", "EnvErrorWindow", "check_env_errors", "find_env_error_stop"]
