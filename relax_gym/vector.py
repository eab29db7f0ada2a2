"""Run many environment instances at once.

* :func:`make_vec` -- N copies of one env stepped together, in this thread (``"sync"``), in a
  thread pool (``"thread"``, for envs that release the GIL or wait on I/O) or one worker
  process per env (``"process"``, for CPU-heavy rendering). There is no auto-reset: LLM episodes
  end at different turns, so finished slots take ``None`` actions until ``reset_at`` is called.
* :class:`AsyncEnvPool` -- a bounded pool of env instances for asyncio rollouts: each episode
  borrows one and returns it, so thousands of concurrent episodes need only ``size`` envs.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, Literal

import numpy as np

from relax_gym.core import Env
from relax_gym.errors import EnvStepError
from relax_gym.registration import EnvSpec, spec as lookup_spec
from relax_gym.types import Action, Observation

VecMode = Literal["sync", "thread", "process"]


class VectorEnv:
    """N independent episodes of one env, stepped as a batch."""

    def __init__(self, env_spec: EnvSpec, num_envs: int, mode: VecMode = "sync", **kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if mode not in ("sync", "thread", "process"):
            raise ValueError(f"unknown vector mode {mode!r}; expected 'sync', 'thread' or 'process'")
        self.spec = env_spec
        self.num_envs = num_envs
        self.mode = mode
        self._closed = False
        self._runner: _Runner
        if mode == "process":
            self._runner = _ProcessRunner(env_spec, kwargs, num_envs)
        else:
            envs = [env_spec.make(**kwargs) for _ in range(num_envs)]
            self._runner = _LocalRunner(envs, threaded=mode == "thread")

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Observation], list[dict[str, Any]]]:
        """Reset every env; an int seed gives env ``i`` the seed ``seed + i``."""
        seeds = _expand_seeds(seed, self.num_envs)
        results = self._runner.call("reset", [((), {"seed": s, "options": options}) for s in seeds])
        return [r[0] for r in results], [r[1] for r in results]

    def reset_at(
        self, index: int, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Reset one env (e.g. after its episode ended) without touching the others."""
        calls: list[tuple[tuple[Any, ...], dict[str, Any]] | None] = [None] * self.num_envs
        calls[index] = ((), {"seed": seed, "options": options})
        return self._runner.call("reset", calls)[index]

    def step(
        self, actions: Sequence[Action | str | None]
    ) -> tuple[list[Observation | None], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Step every env whose action is not ``None``; skipped slots return ``None`` / zeros."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        calls = [None if a is None else ((a,), {}) for a in actions]
        results = self._runner.call("step", calls)
        obs: list[Observation | None] = []
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: list[dict[str, Any]] = []
        for i, r in enumerate(results):
            if r is None:
                obs.append(None)
                infos.append({"skipped": True})
                continue
            obs.append(r[0])
            rewards[i], terminated[i], truncated[i] = r[1], r[2], r[3]
            infos.append(r[4])
        return obs, rewards, terminated, truncated, infos

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._runner.close()

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def make_vec(id: str | EnvSpec, num_envs: int, mode: VecMode = "sync", **kwargs: Any) -> VectorEnv:
    """``make_vec("relax/Maze-v0", 8, mode="process", difficulty="hard")``."""
    env_spec = id if isinstance(id, EnvSpec) else lookup_spec(id)
    return VectorEnv(env_spec, num_envs, mode, **kwargs)


def _expand_seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ValueError(f"expected {n} seeds, got {len(seeds)}")
    return seeds


Call = tuple[tuple[Any, ...], dict[str, Any]] | None


class _Runner:
    def call(self, method: str, calls: Sequence[Call]) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _LocalRunner(_Runner):
    def __init__(self, envs: list[Env], threaded: bool) -> None:
        self.envs = envs
        self.pool = ThreadPoolExecutor(len(envs), thread_name_prefix="relax-vec") if threaded else None

    def call(self, method: str, calls: Sequence[Call]) -> list[Any]:
        def run(i: int) -> Any:
            c = calls[i]
            return None if c is None else getattr(self.envs[i], method)(*c[0], **c[1])

        if self.pool is None:
            return [run(i) for i in range(len(self.envs))]
        return list(self.pool.map(run, range(len(self.envs))))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        for env in self.envs:
            env.close()


def _worker(conn: Any, env_spec: EnvSpec, kwargs: dict[str, Any]) -> None:
    """Own one env in a child process and serve (method, args, kwargs) requests over a pipe."""
    try:
        env = env_spec.make(**kwargs)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        conn.close()
        return
    conn.send(("ok", None))
    while True:
        try:
            method, args, kw = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if method == "close":
            env.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(env, method)(*args, **kw)))
        except Exception as exc:
            conn.send(("raise", exc if _picklable(exc) else EnvStepError(f"{type(exc).__name__}: {exc}")))
    conn.close()


def _picklable(obj: Any) -> bool:
    import pickle

    try:
        pickle.dumps(obj)
        return True
    except Exception:
        return False


class _ProcessRunner(_Runner):
    """One spawned process per env (spawn, so threads in the parent cannot deadlock a child)."""

    def __init__(self, env_spec: EnvSpec, kwargs: dict[str, Any], n: int, context: str = "spawn") -> None:
        ctx = mp.get_context(context)
        self.conns = []
        self.procs = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, env_spec, kwargs), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            status, payload = conn.recv()
            if status != "ok":
                self.close()
                raise EnvStepError(f"{env_spec.id}: worker failed to build the env: {payload}")

    def call(self, method: str, calls: Sequence[Call]) -> list[Any]:
        for conn, c in zip(self.conns, calls):
            if c is not None:
                conn.send((method, c[0], c[1]))
        out: list[Any] = []
        error: BaseException | None = None
        for conn, c in zip(self.conns, calls):
            if c is None:
                out.append(None)
                continue
            try:
                status, payload = conn.recv()
            except EOFError:
                status, payload = "raise", EnvStepError("env worker process died")
            if status == "raise":
                error = error or payload
                out.append(None)
            else:
                out.append(payload)
        if error is not None:
            raise error
        return out

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("close", (), {}))
                conn.recv()
            except (OSError, EOFError, BrokenPipeError):
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self.conns, self.procs = [], []


class AsyncEnvPool:
    """A bounded pool of env instances shared by concurrent asyncio episodes.

    ``async with pool.episode() as env:`` borrows an env (building one lazily while fewer than
    ``size`` exist, otherwise waiting for one to be returned) and gives it back afterwards.
    """

    def __init__(self, factory: Callable[[], Env] | str, size: int, **kwargs: Any) -> None:
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        if isinstance(factory, str):
            env_spec = lookup_spec(factory)
            self._factory: Callable[[], Env] = lambda: env_spec.make(**kwargs)
        else:
            self._factory = factory
        self.size = size
        self._idle: list[Env] = []
        self._all: list[Env] = []
        self._cond = asyncio.Condition()

    @property
    def created(self) -> int:
        return len(self._all)

    @asynccontextmanager
    async def episode(self) -> AsyncIterator[Env]:
        env = await self._acquire()
        try:
            yield env
        finally:
            async with self._cond:
                self._idle.append(env)
                self._cond.notify()

    async def _acquire(self) -> Env:
        async with self._cond:
            while not self._idle and len(self._all) >= self.size:
                await self._cond.wait()
            if self._idle:
                return self._idle.pop()
            env = self._factory()
            self._all.append(env)
            return env

    def close(self) -> None:
        for env in self._all:
            env.close()
        self._all, self._idle = [], []
