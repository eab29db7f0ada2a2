"""ProcessRole: a role object in a spawned child process (the embedded runtime's learner)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from relax_gym.trainer.modes.process_role import ProcessRole, RemoteCallError, RoleProcessDied

TARGET = "tests.modes.process_target:Target"


async def test_calls_run_in_the_child_and_overlap() -> None:
    role = ProcessRole(TARGET, {"scale": 3}, name="target")
    try:
        assert await role.times(14) == 42
        assert await role.pid() == role.process_id != os.getpid()
        start = time.monotonic()
        # three calls of 1 s each at once: they run concurrently in the child, as on a Ray actor
        got = await asyncio.gather(*(role.slow_echo(f"v{i}", 1.0) for i in range(3)))
        assert got == ["v0", "v1", "v2"]
        assert time.monotonic() - start < 2.5
    finally:
        await role.stop_process()
    assert role._proc.exitcode == 0  # it left when asked


async def test_errors_come_back_to_the_caller() -> None:
    role = ProcessRole(TARGET, {"scale": 1})
    try:
        with pytest.raises(ValueError, match="bad input"):
            await role.fail("bad input")
        with pytest.raises(RemoteCallError, match="NeedsTwoArgs: a/b"):
            await role.fail_oddly()  # could not be pickled back as itself: a plain error, not a hang
        with pytest.raises(AttributeError):
            await role.no_such_method()
        with pytest.raises(Exception, match="pickle"):
            await role.times(lambda: 1)  # an argument that cannot travel fails here, at once
        assert await role.times(2) == 2  # the role still serves after failed calls
        big = "x" * 1_000_000  # larger than a pipe's buffer: written from a worker thread
        assert await role.slow_echo(big, 0.0) == big
    finally:
        await role.stop_process()


async def test_a_factory_that_fails_reports_why_on_every_call() -> None:
    role = ProcessRole("tests.modes.process_target:broken_factory", {"scale": 5})
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="cannot build with scale 5"):
                await role.anything()
    finally:
        await role.stop_process()


async def test_a_dead_child_fails_calls_at_once() -> None:
    role = ProcessRole(TARGET, {"scale": 1}, name="learner")
    try:
        waiting = asyncio.create_task(role.slow_echo("never", 60.0))
        await asyncio.sleep(0.2)
        with pytest.raises(RoleProcessDied, match=r"learner process exited \(exit code 7\)"):
            await asyncio.wait_for(asyncio.gather(role.die_after(0.1), waiting), 30)
        with pytest.raises(RoleProcessDied, match="exit code 7"):
            await role.times(1)  # later calls fail too, at once
    finally:
        await role.stop_process()
