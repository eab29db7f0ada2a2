"""A rank killed while megatron's checkpoint writers (forks of the rank) are alive takes them
with it: without the guard they wait forever in ``JoinableQueue.task_done`` for the dead parent,
orphans holding the rank's memory. Found by the torchrun kill test (tests/megatron/test_torchrun.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[2]

#: a "rank": forks one writer inside the guard and one outside it, prints both pids, then sleeps
_RANK = """
import multiprocessing as mp, sys, time
from relax_gym.trainer.backends.megatron.backend import _forked_writers_die_with_this_process
ctx = mp.get_context("fork")
with _forked_writers_die_with_this_process():
    guarded = ctx.Process(target=time.sleep, args=(120,))
    guarded.start()
free = ctx.Process(target=time.sleep, args=(120,))
free.start()
print(guarded.pid, free.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_writer_forked_inside_the_guard_dies_with_its_rank() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _RANK], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    guarded = free = None
    try:
        assert proc.stdout is not None
        guarded, free = (int(x) for x in proc.stdout.readline().split())
        assert _alive(guarded) and _alive(free)
        os.kill(proc.pid, signal.SIGKILL)  # no clean-up runs
        proc.wait(30)
        deadline = time.monotonic() + 20
        while _alive(guarded) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(guarded), "the guarded writer outlived its rank"
        assert _alive(free), "a fork outside the guard must be left alone"
    finally:
        for pid in (guarded, free):
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
