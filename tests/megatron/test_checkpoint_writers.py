"""Megatron's checkpoint writers (forks of the rank, waited for without a timeout) neither outlive
nor hang their rank (trainer/backends/megatron/writers.py):

* a rank killed while its writers are alive takes them with it; before, they waited forever in
  ``JoinableQueue.task_done`` for the dead parent (found by tests/megatron/test_torchrun.py);
* a writer that dies (the OOM killer) ends its rank with a message naming it, instead of the
  rank waiting forever in ``JoinableQueue.join``, as megatron-core's saver does.

Each "rank" here is a subprocess that forks writers the way megatron does (fork context,
a ``JoinableQueue`` joined without a timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")

ROOT = Path(__file__).resolve().parents[2]

#: forks one writer inside the guard and one outside it, prints both pids, then sleeps
_RANK_KILLED = """
import multiprocessing as mp, time
from relax_gym.trainer.backends.megatron.writers import guarded_writers
ctx = mp.get_context("fork")
with guarded_writers():
    guarded = ctx.Process(target=time.sleep, args=(120,))
    guarded.start()
free = ctx.Process(target=time.sleep, args=(120,))
free.start()
print(guarded.pid, free.pid, flush=True)
time.sleep(120)
"""

#: megatron's pattern: writers that task_done a JoinableQueue the saver joins without a timeout;
#: writer 1 is killed as the OOM killer would
_WRITER_DIES = """
import multiprocessing as mp, os, signal, time
from relax_gym.trainer.backends.megatron.writers import guarded_writers

def write_preloaded_data(index, count):
    if index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    count.get()
    count.task_done()

ctx = mp.get_context("fork")
count = ctx.JoinableQueue()
with guarded_writers():
    writers = [ctx.Process(target=write_preloaded_data, args=(i, count)) for i in range(2)]
    for i, w in enumerate(writers):
        count.put(i)
        w.start()
    count.join()
print("the save returned", flush=True)
"""

#: the same with writers that all succeed: the save returns and nothing ends the process
_WRITERS_SUCCEED = _WRITER_DIES.replace("if index == 1:", "if index == 99:")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_writer_forked_inside_the_guard_dies_with_its_rank() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _RANK_KILLED], cwd=ROOT, stdout=subprocess.PIPE, text=True)
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


def test_a_writer_that_dies_ends_its_rank_with_a_message_instead_of_a_hang() -> None:
    proc = subprocess.run([sys.executable, "-c", _WRITER_DIES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "the save returned" not in proc.stdout
    assert "checkpoint writer" in proc.stderr and "killed by SIGKILL" in proc.stderr and "OOM killer" in proc.stderr
    assert "--resume" in proc.stderr
    ok = subprocess.run([sys.executable, "-c", _WRITERS_SUCCEED], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "the save returned" in ok.stdout, ok.stderr[-2000:]
