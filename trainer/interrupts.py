"""Run a training coroutine so that SIGTERM stops it like Ctrl-C.

A cluster scheduler stops jobs with SIGTERM. Cancelling the run's task (instead of dying at
once) lets its ``finally`` blocks stop the engines it started and close its writers; the
caller then sees :class:`KeyboardInterrupt`, as after Ctrl-C, and resumes from a checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_NO_SIGNALS = (NotImplementedError, RuntimeError, ValueError)  # not the main thread, or no signals


def run_stoppable(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())`` with SIGTERM cancelling it; raises KeyboardInterrupt when cancelled."""

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        stopping = False

        def stop() -> None:
            # the first SIGTERM cancels the run; a second one (a launcher that signals again,
            # e.g. torchrun after a rank died) must not cut the clean-up that stops the engines
            nonlocal stopping
            if not stopping and task is not None:
                stopping = True
                task.cancel()

        try:
            loop.add_signal_handler(signal.SIGTERM, stop)
        except _NO_SIGNALS:
            pass
        try:
            return await make()
        finally:
            with contextlib.suppress(*_NO_SIGNALS):
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt("training stopped by a signal") from None


__all__ = ["run_stoppable"]
