"""CPU debug mode: lets megatron-core 0.16.1 run on a CPU-only torch (tests and debugging only).

megatron-core hard-codes CUDA in a few places (``device="cuda"``, ``torch.cuda.current_device()``,
``Tensor.cuda()``, assertions on ``Tensor.type() == "torch.cuda.FloatTensor"``). This module
redirects those calls to the CPU so the real megatron code paths (GPTModel, TP mappings, DDP,
the optimizer, the schedules, distributed checkpoints) run over gloo.

It is never active on its own. The tests enter ``megatron_on_cpu()``; a CPU run of the
training loop opts in with ``RELAX_MEGATRON_CPU_SHIM=1`` (see ``MegatronBackend``). It refuses
to start where CUDA is available, so it can never sit on the GPU path.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # megatron passes torch.cuda.current_device() (an int) as a device.
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device requests to CPU and makes ``Tensor.type()`` report CUDA names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            args = tuple("cpu" if i > 0 and _is_cuda_device(a) else a for i, a in enumerate(args))
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


class _NullStream:
    """Stands in for a CUDA stream: waiting and synchronising are no-ops on CPU."""

    def wait_stream(self, other: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, event: Any = None) -> None:
        return None


_PATCHES: dict[str, Any] = {
    "current_device": lambda: 0,
    "current_stream": lambda *a, **k: _NullStream(),
    "synchronize": lambda *a, **k: None,
}


ENV_FLAG = "RELAX_MEGATRON_CPU_SHIM"
_active = 0
_process_wide: contextlib.ExitStack | None = None
_F = TypeVar("_F", bound=Callable[..., Any])


def is_active() -> bool:
    return _active > 0


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Run megatron-core on CPU inside this context; restores torch.cuda on exit."""
    global _active
    from megatron.core import tensor_parallel

    if torch.cuda.is_available():
        raise RuntimeError("the megatron CPU shim is for CPU-only machines; CUDA is available")
    saved = {name: getattr(torch.cuda, name) for name in _PATCHES}
    for name, fn in _PATCHES.items():
        setattr(torch.cuda, name, fn)
    backward_apply = BackwardCFunction.apply
    BackwardCFunction.apply = _backward_under_shim(backward_apply)  # type: ignore[method-assign]
    _active += 1
    try:
        with _mode_in_this_thread():
            tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)
            yield
    finally:
        _active -= 1
        BackwardCFunction.apply = backward_apply  # type: ignore[method-assign]
        for name, fn in saved.items():
            setattr(torch.cuda, name, fn)


def _backward_under_shim(apply: Callable[..., Any]) -> Callable[..., Any]:
    """The autograd engine runs a Python ``Function.backward`` without the caller's function
    modes, and megatron's TP mappings allocate on ``torch.cuda.current_device()`` there (the
    reduce-scatter behind an all-gather, e.g. attention with fewer key/value heads than TP)."""

    @functools.wraps(apply)
    def wrapper(self: Any, *args: Any) -> Any:
        with _mode_in_this_thread():
            return apply(self, *args)

    return wrapper


@contextlib.contextmanager
def _mode_in_this_thread() -> Iterator[None]:
    """Push the mode unless it is on this thread's stack already."""
    if any(isinstance(m, CudaToCpuMode) for m in _get_current_function_mode_stack()):
        yield
        return
    with CudaToCpuMode():
        yield


def on_any_thread(method: _F) -> _F:
    """Run ``method`` under the shim in whichever thread calls it, while the shim is on.

    The torch-function mode is per thread, and the training loop calls the backend from worker
    threads (``asyncio.to_thread``); the ``torch.cuda`` patches are process-wide already.
    """

    if inspect.isgeneratorfunction(method):
        return _generator_on_any_thread(method)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_active():
            return method(*args, **kwargs)
        with _mode_in_this_thread():
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _generator_on_any_thread(method: _F) -> _F:
    """A generator resumes in whichever thread calls ``next()``: each resumption enters the
    shim on its own (a mode held open across a ``yield`` would leak into the caller's stack)."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        gen = method(*args, **kwargs)
        while True:
            if is_active():
                with _mode_in_this_thread():
                    try:
                        item = next(gen)
                    except StopIteration:
                        return
            else:
                try:
                    item = next(gen)
                except StopIteration:
                    return
            yield item

    return wrapper  # type: ignore[return-value]


def refuse_on_cuda() -> None:
    """The switch asked for on a machine with CUDA is a mistake: say so in one line."""
    if os.environ.get(ENV_FLAG) == "1" and torch.cuda.is_available():
        raise RuntimeError(
            f"{ENV_FLAG}=1 asks for the CPU debug shim, but CUDA is available: unset it to train on the GPU"
        )


def enable_from_env() -> bool:
    """Enter the shim for the rest of the process if ``RELAX_MEGATRON_CPU_SHIM=1``; True if on."""
    global _process_wide
    if is_active():
        return True
    if os.environ.get(ENV_FLAG) != "1":
        return False
    _process_wide = contextlib.ExitStack()
    _process_wide.enter_context(megatron_on_cpu())
    atexit.register(_process_wide.close)  # before module teardown, not in the garbage collector
    return True
