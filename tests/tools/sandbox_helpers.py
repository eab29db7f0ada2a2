"""Helpers for the sandbox tests: find processes the sandbox left behind."""

from __future__ import annotations

import os
import time

SANDBOX_UID_BASE = 1_500_000_000


def processes_matching(marker: str | None = None) -> list[int]:
    """Pids running as a sandbox uid, or whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker is not None:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(entry))
            else:
                with open(f"/proc/{entry}/status", encoding="utf-8") as fh:
                    for line in fh:
                        if line.startswith("Uid:") and int(line.split()[1]) >= SANDBOX_UID_BASE:
                            found.append(int(entry))
                            break
        except (OSError, ValueError):
            continue
    return found


def wait_until_gone(marker: str | None = None, timeout_s: float = 3.0) -> list[int]:
    """Poll until no matching process is left (teardown is asynchronous); returns leftovers."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = processes_matching(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
