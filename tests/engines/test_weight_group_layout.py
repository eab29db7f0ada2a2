"""The trainer's rank 0 meets an engine side built the way SGLang builds its weight-update group.

SGLang's engine ranks join with ``tcp://`` rendezvous, ``PrefixStore(group_name)`` and torch's
``_new_process_group_helper`` (``sglang.srt.utils.common.init_custom_process_group``). This test
builds the engine side from those torch pieces (no sglang needed), in threads, and checks that
our :func:`new_process_group` as rank 0 opens the group with them and that a broadcast of real
tensors arrives; ``tests/sglang_compat`` repeats it against SGLang's own function when installed.
Before the key layout was matched, both sides timed out here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

from relax_gym.trainer.engines.weight_receiver import broadcast, new_process_group
from relax_gym.trainer.weights.broadcast import free_port

#: one engine rank, joined as SGLang joins (tcp rendezvous, group-name prefix, torch's helper);
#: a process of its own, since torch's helper allows one group of a name per process
ENGINE_RANK = textwrap.dedent("""
    import datetime as dt, sys, torch, torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous
    port, rank, world, name = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    timeout = dt.timedelta(seconds=20)
    store, rank, world = next(rendezvous(f"tcp://127.0.0.1:{port}", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(world, rank, [], Backend("gloo"), PrefixStore(name, store),
                                      group_name=name, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    got = [torch.empty(3, 2), torch.empty(5, dtype=torch.bfloat16)]
    works = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in got]
    for w in works:
        w.wait()
    print(repr([t.float().tolist() for t in got]))
""")


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_rank0_meets_torch_built_engine_ranks(tp: int) -> None:
    port, name, world = free_port(), f"layout_{uuid.uuid4().hex[:8]}", 1 + tp
    procs = [subprocess.Popen([sys.executable, "-c", ENGINE_RANK, str(port), str(1 + r), str(world), name],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(tp)]  # rank = rank_offset (1) + tp_rank
    try:
        handle = new_process_group("127.0.0.1", port, 0, world, group_name=name, timeout_s=20)
        sent = [torch.arange(6.0).reshape(3, 2), torch.linspace(-1, 1, 5).to(torch.bfloat16)]
        broadcast(handle, sent, 0)
        for p in procs:
            out, err = p.communicate(timeout=30)
            assert p.returncode == 0, err[-2000:]
            assert out.strip() == repr([t.float().tolist() for t in sent])
    finally:
        for p in procs:
            p.kill()
