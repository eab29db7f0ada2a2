"""relax_gym.threads.run_in_thread: what asyncio.to_thread gives an env call, with less loop CPU."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from relax_gym.threads import _WORKERS, run_in_thread

REQUEST = contextvars.ContextVar("request", default="none")


def test_results_exceptions_and_context_come_back_from_a_worker_thread() -> None:
    async def main() -> None:
        REQUEST.set("episode-7")
        loop_thread = threading.get_ident()
        ident, seen = await run_in_thread(lambda: (threading.get_ident(), REQUEST.get()))
        assert ident != loop_thread and seen == "episode-7"
        assert await run_in_thread(divmod, 17, 5) == (3, 2)
        assert await run_in_thread(dict, a=1) == {"a": 1}
        with pytest.raises(ZeroDivisionError):
            await run_in_thread(lambda: 1 / 0)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await run_in_thread(next, iter([]))

    asyncio.run(main())


def test_many_calls_at_once_each_get_their_own_result_within_the_thread_bound() -> None:
    async def main() -> list[int]:
        return await asyncio.gather(*(run_in_thread(lambda i=i: (time.sleep(0.001), i * i)[1]) for i in range(300)))

    assert asyncio.run(main()) == [i * i for i in range(300)]
    assert asyncio.run(main()) == [i * i for i in range(300)]  # a new event loop is served as well
    assert 1 <= _WORKERS._threads <= _WORKERS.max_workers  # noqa: SLF001


def test_a_cancelled_caller_leaves_the_others_alone() -> None:
    async def main() -> tuple[bool, int]:
        slow = threading.Event()
        timed_out = False
        try:
            async with asyncio.timeout(0.05):
                await run_in_thread(slow.wait, 5)
        except TimeoutError:
            timed_out = True
        slow.set()  # the abandoned call finishes; its result is dropped
        return timed_out, await run_in_thread(int, "41") + 1

    assert asyncio.run(main()) == (True, 42)


def _child_runs_a_call() -> None:
    assert asyncio.run(asyncio.wait_for(run_in_thread(sum, [1, 2, 3]), 10)) == 6


def test_a_forked_child_gets_its_own_workers() -> None:
    """The parent's pool counts threads a forked child does not have: the child starts afresh."""
    import multiprocessing

    assert asyncio.run(run_in_thread(int, "7")) == 7  # the parent's pool has started a worker
    child = multiprocessing.get_context("fork").Process(target=_child_runs_a_call)
    child.start()
    child.join(timeout=30)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0


def test_calls_that_block_get_a_worker_each_up_to_the_bound() -> None:
    """A burst of blocking calls is not queued behind one idle worker: each starts or claims its own."""
    n = min(4, _WORKERS.max_workers)

    async def main() -> None:
        barrier = threading.Barrier(n, timeout=10)  # every call must be running at once to pass
        assert await asyncio.gather(*(run_in_thread(barrier.wait) for _ in range(n))) is not None

    asyncio.run(main())
    asyncio.run(main())  # and again with the workers now idle
