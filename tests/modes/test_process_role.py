"""ProcessRole: a role object in a spawned child process (the embedded runtime's learner)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

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


async def test_an_orphaned_child_closes_its_role_and_exits(tmp_path: Path) -> None:
    """The driver dies hard (no goodbye on the pipe): the child closes the role object (a learner
    stops its engines there) and exits by itself."""
    import subprocess
    import sys

    marker = tmp_path / "closed"
    driver = (
        "import asyncio, os, sys\n"
        "from relax_gym.trainer.modes.process_role import ProcessRole\n"
        "async def main():\n"
        f"    role = ProcessRole({TARGET!r}, {{'scale': 1, 'closed_marker': {str(marker)!r}}})\n"
        "    assert await role.times(5) == 5\n"
        "    print(role.process_id, flush=True)\n"
        "    os._exit(9)\n"
        "asyncio.run(main())\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", driver], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    child = int(proc.stdout.strip())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not marker.exists():
        await asyncio.sleep(0.1)
    assert marker.read_text() == "closed"
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        status = Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}/status").exists() else ""
        if "zombie" in status:
            break
        await asyncio.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()


async def test_sigterm_to_the_child_is_left_to_the_parent() -> None:
    """A supervisor's SIGTERM to the whole group: the child keeps serving until the parent has
    closed the run (the parent's own handler drives the shutdown)."""
    import signal

    role = ProcessRole(TARGET, {"scale": 2})
    try:
        assert await role.times(1) == 2
        os.kill(role.process_id, signal.SIGTERM)
        await asyncio.sleep(0.3)
        assert await role.times(4) == 8
    finally:
        await role.stop_process()
