"""Megatron's checkpoint writers, kept from outliving or hanging their rank.

``dist_checkpointing.save`` forks writer processes (``filesystem_async``) and waits for them in a
``JoinableQueue.join()`` without a timeout. Two failures follow from that, and both hang for good:

* the rank dies mid-save (SIGKILL, the OOM killer, torchrun ending the group): its writers then
  wait forever in ``task_done`` for a parent that is gone -- orphans holding the rank's memory;
* a writer dies (the OOM killer takes the biggest process, often a writer holding a shard): the
  rank waits forever for a ``task_done`` that never comes, and the other ranks with it at the
  next collective.

:func:`guarded_writers` handles both for the duration of a save: children forked by the saving
thread get SIGKILL when the rank dies (the kernel's parent-death signal), and a watchdog thread
ends the rank with a clear message when one of them exits with a failure, so the launcher
(torchrun) ends the run and ``--resume`` continues from the last complete checkpoint.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_fork_guard = threading.local()
_fork_hook_installed = False
_PR_SET_PDEATHSIG = 1
#: seconds between two looks at the writers
WATCH_INTERVAL_S = 0.5


def _die_with_parent_after_fork() -> None:
    """In a child forked by a thread inside :func:`guarded_writers`: ask the kernel for SIGKILL
    when the parent dies, and leave at once if it already has."""
    parent = getattr(_fork_guard, "parent", None)
    if parent is None:
        return
    with contextlib.suppress(OSError):  # tell the watchdog which pid is a writer of this save
        os.write(_fork_guard.report_fd, os.getpid().to_bytes(4, "little"))
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no death signal to ask for
        return
    if os.getppid() != parent:  # the parent died between the fork and the prctl
        os._exit(1)


def _children() -> list[Any]:
    """This process's live ``multiprocessing`` children (megatron's writers among them)."""
    return list(multiprocessing.process._children)  # noqa: SLF001 - active_children() would reap them


def describe_exit(code: int) -> str:
    """A writer's exit code in words (a negative code is the signal that killed it)."""
    if code < 0:
        from relax_gym.tools.sandbox.pool import signal_name  # only on this error path

        hint = " (the OOM killer sends it when memory runs out)" if -code == signal.SIGKILL else ""
        return f"killed by {signal_name(-code)}{hint}"
    return f"exit code {code}"


def _watch(report_fd: int, stop: threading.Event, on_failure: Callable[[Any, int], None]) -> None:
    """Until ``stop``: a child that the saving thread forked (its pid reported through
    ``report_fd`` by the child itself) and that exited with a failure ends the rank."""
    writers: set[int] = set()
    while not stop.wait(WATCH_INTERVAL_S):
        with contextlib.suppress(BlockingIOError):
            data = os.read(report_fd, 4096)
            writers.update(int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data) - 3, 4))
        for child in _children():
            popen = getattr(child, "_popen", None)
            if popen is None or child.pid not in writers:
                continue
            code = popen.poll()  # waitpid(WNOHANG); the code is kept, so the saver's own join still works
            if code is not None and code != 0:
                on_failure(child, code)
                return


def _end_rank(child: Any, code: int) -> None:
    """The saving thread waits for this writer forever: end the rank, saying why."""
    print(
        f"relax-gym: megatron checkpoint writer {child.name} (pid {child.pid}) died: {describe_exit(code)}. "
        "megatron-core would wait for it forever; this rank stops so that the launcher ends the run. "
        "The checkpoint being written is left as step_N.tmp, which --resume skips: resume from the "
        "last complete one.",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


@contextlib.contextmanager
def guarded_writers(on_failure: Callable[[Any, int], None] = _end_rank) -> Iterator[None]:
    """The saving thread's forks die with this process, and one that fails ends it (see the
    module docstring). The death-signal guard is thread-local: forks by other threads, and
    ``subprocess`` (which runs no fork hooks), are untouched. The death signal fires when the
    forking thread ends; this one waits for its writers inside ``save``."""
    global _fork_hook_installed
    if not _fork_hook_installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_die_with_parent_after_fork)
        _fork_hook_installed = True
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(read_fd, stop, on_failure), name="checkpoint-writer-watch",
                               daemon=True)
    _fork_guard.parent, _fork_guard.report_fd = os.getpid(), write_fd
    watcher.start()
    try:
        yield
    finally:
        _fork_guard.parent = None
        stop.set()
        watcher.join()
        os.close(read_fd)
        os.close(write_fd)


__all__ = ["WATCH_INTERVAL_S", "describe_exit", "guarded_writers"]
