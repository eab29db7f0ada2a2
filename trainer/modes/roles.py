"""Role handles: how the runner talks to the trainer, rollout, queue, reward and logprob roles
without knowing where they live.

``await role.method(*args)`` works the same on a :class:`LocalRole` (an object in this process:
the embedded runtime; a method may be sync or async) and on a :class:`RayRole` (a Ray actor:
``actor.method.remote(...)`` awaited). The runner, the producer and the workers only ever hold
roles, so none of them knows which runtime it is in.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from relax_gym.trainer.config import TrainConfig


class Role:
    """Base: ``role.name(...)`` returns an awaitable of the method's result."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> Awaitable[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name.startswith("_"):
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> Awaitable[Any]:
            return self.call(name, *args, **kwargs)

        return method


async def call_method(obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``obj.name(*args, **kwargs)``, awaited when it returns an awaitable: how a role (in this
    process or inside a Ray actor) runs a method of the object it holds."""
    result = getattr(obj, name)(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class LocalRole(Role):
    """An object in this process; sync methods run inline (they must be quick), async ones are awaited."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await call_method(self.obj, name, *args, **kwargs)

    def __repr__(self) -> str:
        return f"LocalRole({type(self.obj).__name__})"


class RayRole(Role):
    """A Ray actor hosting a role object behind ``call(name, *args)`` (see ``ray_runtime``);
    picklable, so roles travel to other actors."""

    def __init__(self, actor: Any, name: str = "") -> None:
        self.actor = actor
        self.name = name

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return await self.actor.call.remote(name, *args, **kwargs)

    def __repr__(self) -> str:
        return f"RayRole({self.name})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (RayRole, (self.actor, self.name))



# ------------------------------------------------------------------------------------------------
# the set of roles a run needs, and who builds it: here, not in runner.py, because both runtimes
# (runner.py's embedded one and ray_runtime.py, which runner.py loads) build the same set
# ------------------------------------------------------------------------------------------------
@dataclass
class Roles:
    """Everything the runner talks to."""

    learner: Role
    queue: Role
    rollout: Role
    rewards: list[Role]
    ref_worker: Role | None = None
    prox_worker: Role | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Runtime(Protocol):
    """Builds the roles; two phases because the data plane needs the engines the learner opened."""

    async def make_learner(self, config: TrainConfig, *, resume: bool | str) -> Role: ...

    async def make_data_plane(self, config: TrainConfig, learner: Role, info: dict[str, Any]) -> Roles: ...

    async def shutdown(self) -> None: ...


def needs_workers(config: TrainConfig) -> tuple[bool, bool]:
    """(reference worker, proximal worker) for this config: only fully_async runs them, and only
    when the algorithm needs those logprobs."""
    if config.mode != "fully_async":
        return False, False
    return config.algorithm.needs_reference, config.train.updates_per_step > 1


__all__ = ["LocalRole", "RayRole", "Role", "Roles", "Runtime", "call_method", "needs_workers"]
