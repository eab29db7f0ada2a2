"""An object for tests/modes/test_process_role.py to host in a child process."""

from __future__ import annotations

import asyncio
import os


class NeedsTwoArgs(Exception):
    """An exception that does not survive pickling (its __init__ takes two arguments)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}/{b}")


class Target:
    def __init__(self, scale: int, closed_marker: str | None = None) -> None:
        self.scale = scale
        self.closed_marker = closed_marker

    def close(self) -> None:
        if self.closed_marker:
            with open(self.closed_marker, "w", encoding="utf-8") as fh:
                fh.write("closed")

    def times(self, x: int) -> int:
        return x * self.scale

    async def slow_echo(self, value: str, delay_s: float) -> str:
        await asyncio.sleep(delay_s)
        return value

    def pid(self) -> int:
        return os.getpid()

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def fail_oddly(self) -> None:
        raise NeedsTwoArgs("a", "b")

    async def die_after(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        os._exit(7)


def broken_factory(scale: int) -> Target:
    raise RuntimeError(f"cannot build with scale {scale}")
