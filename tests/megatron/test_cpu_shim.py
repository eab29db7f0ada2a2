"""The CPU debug shim holds wherever megatron-core runs: any thread, generators resumed in other
threads, and the backward of Python autograd Functions (which the engine runs without the
caller's function modes; megatron's TP mappings allocate on ``torch.cuda.current_device()``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from relax_gym.trainer.backends.megatron.cpu_debug import megatron_on_cpu, on_any_thread  # noqa: E402


class _AllocatesInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        buffer = torch.empty(grad.shape, device=torch.cuda.current_device())  # as megatron does
        return buffer.copy_(grad) * 2


def _step() -> Any:
    x = torch.ones(3, requires_grad=True)
    torch.autograd.backward(_AllocatesInBackward.apply(x).sum())
    return x.grad


@on_any_thread
def _step_anywhere() -> Any:
    return _step()


@on_any_thread
def _buckets() -> Iterator[str]:
    for _ in range(2):
        yield torch.zeros(1, device="cuda").device.type


def _in_thread(fn: Any) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(timeout=60)
    return out[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the shim refuses CUDA machines")
def test_shim_holds_in_backward_threads_and_generators() -> None:
    with megatron_on_cpu():
        assert _step().tolist() == [2.0, 2.0, 2.0]
        assert _in_thread(_step_anywhere).tolist() == [2.0, 2.0, 2.0]
        gen = _buckets()
        assert next(gen) == "cpu"
        assert _in_thread(lambda: next(gen)) == "cpu"  # resumed in another thread
    with pytest.raises((RuntimeError, AssertionError)):  # gone afterwards: CUDA requests fail again
        torch.zeros(1, device="cuda")
