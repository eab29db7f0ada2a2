"""The reward registry: names -> reward functions.

A reward function takes one :class:`~relax_gym.rewards.RewardInput` (or, for a group-level
reward, the list of samples of one GRPO group) plus keyword arguments from the config, and
returns a number, a bool, a dict of named parts (with an optional ``"total"``), a
:class:`Score` or a :class:`~relax_gym.rewards.RewardResult`. It may be ``async``.

Names resolve to a registered name (``"math_equiv"``) or to an importable ``"module:function"``
path, so a training config can point at user code without registering it first.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_ATTR = "__relax_reward__"


@dataclass(frozen=True, slots=True)
class Score:
    """A reward value with optional named parts and details for logs (e.g. the extracted answer).

    ``parts`` become components ``<name>/<part>`` in the result; ``details`` are kept per
    component in :attr:`RewardResult.details` but never enter the total.
    """

    value: float
    parts: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RewardFn:
    """A resolved reward function and how to call it."""

    name: str
    fn: Callable[..., Any]
    group: bool = False
    is_async: bool = False
    description: str = ""


_REGISTRY: dict[str, RewardFn] = {}


def _describe(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _make(name: str, fn: Callable[..., Any], group: bool) -> RewardFn:
    if not callable(fn):
        raise TypeError(f"reward {name!r}: {fn!r} is not callable")
    return RewardFn(
        name=name,
        fn=fn,
        group=group,
        is_async=inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)),
        description=_describe(fn),
    )


@overload
def reward(name: F) -> F: ...
@overload
def reward(name: str | None = None, *, group: bool = False, override: bool = False) -> Callable[[F], F]: ...


def reward(name: Any = None, *, group: bool = False, override: bool = False) -> Any:
    """Register a reward function under ``name`` (default: the function's name).

    ``group=True`` marks a group-level reward: it receives the list of samples of one group
    (same ``metadata["group_id"]``) and returns one result per sample, in order. Registering a
    taken name raises unless ``override=True``. The function itself is returned unchanged.
    """
    if callable(name):  # used bare: @reward
        return reward(None)(name)

    def decorate(fn: F) -> F:
        reg_name = name or fn.__name__
        if not _NAME.match(reg_name):
            raise ValueError(
                f"invalid reward name {reg_name!r}: use letters, digits, '_', '.', '-' "
                "(a ':' is reserved for module:function paths)"
            )
        if reg_name in _REGISTRY and not override and _REGISTRY[reg_name].fn is not fn:
            raise ValueError(f"reward {reg_name!r} is already registered; pass override=True to replace it")
        rf = _make(reg_name, fn, group)
        _REGISTRY[reg_name] = rf
        try:
            setattr(fn, _ATTR, rf)
        except (AttributeError, TypeError):  # builtins / slotted callables: registry still works
            pass
        return fn

    return decorate


def register_reward(name: str, fn: Callable[..., Any], *, group: bool = False, override: bool = False) -> RewardFn:
    """Functional form of :func:`reward`."""
    reward(name, group=group, override=override)(fn)
    return _REGISTRY[name]


def unregister_reward(name: str) -> None:
    _REGISTRY.pop(name, None)


def get_reward(name: str) -> RewardFn:
    """Resolve a registered name or a ``module:function`` path to a :class:`RewardFn`."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a reward name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise KeyError(f"unknown reward {name!r}; registered: {known}; or give a 'module:function' path")
    module_name, _, attr_path = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise KeyError(f"reward {name!r}: cannot import module {module_name!r} ({exc})") from None
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise KeyError(f"reward {name!r}: module {module_name!r} has no attribute {attr_path!r}") from None
    if isinstance(obj, RewardFn):
        return obj
    registered = getattr(obj, _ATTR, None)
    if isinstance(registered, RewardFn):
        return registered
    return _make(name, obj, group=False)


def list_rewards() -> list[RewardFn]:
    """Every registered reward, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


__all__ = ["RewardFn", "Score", "get_reward", "list_rewards", "register_reward", "reward", "unregister_reward"]
