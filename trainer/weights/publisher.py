"""Weight updates while rollouts run: the distributed broadcast path, publishing with failover,
and bringing engines that join (or come back) to the current weights before they serve.

* :class:`DistributedWeightSync` -- SGLang's tensor-broadcast path. The trainer is rank 0 of a
  process group the engines join through ``/init_weights_update_group``; each bucket of weights
  is announced with ``/update_weights_from_distributed`` (names, dtypes, shapes) and broadcast
  over the group. With ``backend="nccl"`` this is the GPU code path against SGLang; the embedded
  engine implements the receiving side over gloo, so the same code runs (and is tested) on CPU.
  A process group has a fixed membership, so the group is rebuilt whenever the set of live
  engines changes (an engine died, joined or was removed).
* :class:`WeightPublisher` -- what the trainer calls after each step: pause the engines (in-flight
  segments come back partial and resume afterwards), push over the configured path (in-memory
  tensors, disk, or broadcast), flush caches, verify every engine reports the new version.
  An engine that dies mid-push is found by a health check and the push is retried on the
  survivors, so one crash never stops training. It keeps the published weights so an engine
  that joins later gets exactly them (:meth:`WeightPublisher.bring_up_to_date`).
* :class:`ElasticRouter` -- the rollout router whose "bring this engine to the current weights"
  step (used when an engine is added through the control API and when a dead one revives) asks
  the trainer to push, then checks the version, so an engine never silently serves stale weights.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import httpx
import torch
from relax_gym.trainer.backends.base import TrainerBackend
from relax_gym.trainer.rollout import EngineHandle, EngineRouter, WeightSyncError
from relax_gym.trainer.weights.engine_sync import SyncResult, WeightSyncFailed

from relax_gym.protocol import EngineClient, EngineError

log = logging.getLogger("relax_gym.trainer.modes")

SyncPath = Literal["tensor", "disk", "distributed"]
_group_ids = itertools.count()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------
# the distributed (broadcast) path
# ------------------------------------------------------------------------------------------------
class _Broadcaster:
    """Rank 0 of one weight-update group over ``urls`` (one rank per engine).

    Tensors are broadcast from where the collective needs them: CUDA for NCCL (the GPU path
    against SGLang), CPU for gloo (the embedded engine). Each bucket is announced to every engine
    with ``/update_weights_from_distributed`` while the broadcast runs.
    """

    def __init__(self, urls: list[str], *, api_key: str | None, master_address: str, master_port: int,
                 group_name: str, backend: str, timeout_s: float) -> None:
        self.urls = urls
        self.api_key = api_key
        self.master_address = master_address
        self.master_port = master_port
        self.group_name = group_name
        self.backend = backend
        self.timeout_s = timeout_s
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.clients = [EngineClient(u, api_key=api_key, timeout_s=timeout_s) for u in urls]
        self.group: Any = None

    async def init(self) -> None:
        from relax_gym.trainer.engines.weights import new_process_group

        from relax_gym.protocol import InitWeightsUpdateGroupRequest

        world = 1 + len(self.urls)
        joins = [asyncio.create_task(c.init_weights_update_group(InitWeightsUpdateGroupRequest(
            master_address=self.master_address, master_port=self.master_port, rank_offset=rank, world_size=world,
            group_name=self.group_name, backend=self.backend))) for rank, c in enumerate(self.clients, start=1)]
        try:
            self.group = await asyncio.to_thread(
                new_process_group, self.master_address, self.master_port, 0, world, group_name=self.group_name,
                backend=self.backend, timeout_s=self.timeout_s)
        finally:
            replies = await asyncio.gather(*joins, return_exceptions=True)
        for url, reply in zip(self.urls, replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            if not reply.success:
                raise EngineError(url + "/init_weights_update_group", reply.message)

    async def push(self, named: list[tuple[str, torch.Tensor]], *, weight_version: str,
                   bucket_bytes: int) -> int:
        from relax_gym.trainer.engines.weights import broadcast, buckets, dtype_name

        from relax_gym.protocol import UpdateWeightsFromDistributedRequest

        groups = list(buckets(((n, t.detach().to(self.device).contiguous()) for n, t in named), bucket_bytes))
        for i, group in enumerate(groups):
            req = UpdateWeightsFromDistributedRequest(
                names=[n for n, _ in group], dtypes=[dtype_name(t.dtype) for _, t in group],
                shapes=[list(t.shape) for _, t in group], group_name=self.group_name,
                weight_version=weight_version if i == len(groups) - 1 else None)
            announced = [asyncio.create_task(c.update_weights_from_distributed(req)) for c in self.clients]
            try:
                await asyncio.to_thread(broadcast, self.group, [t for _, t in group], 0)
            finally:
                replies = await asyncio.gather(*announced, return_exceptions=True)
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        return len(groups)

    async def close(self) -> None:
        for url, client in zip(self.urls, self.clients, strict=True):
            await client.aclose()
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            try:
                async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10.0) as http:
                    await http.post("/destroy_weights_update_group", json={"group_name": self.group_name})
            except httpx.HTTPError:
                pass  # the engine is gone: nothing to release there
        self.group = None


class DistributedWeightSync:
    """Broadcast weights to engines over a process group (see the module docstring).

    ``push(named, version, urls)`` (re)builds the group when ``urls`` differ from its members,
    then sends bucket after bucket. Only the last bucket carries the version, so an engine never
    reports a version whose weights are half loaded.
    """

    def __init__(self, *, api_key: str | None = None, backend: str = "gloo", master_address: str = "127.0.0.1",
                 master_port: int | None = None, bucket_bytes: int = 256 << 20, timeout_s: float = 120.0) -> None:
        self.api_key = api_key
        self.backend = backend
        self.master_address = master_address
        self.master_port = master_port
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self._broadcaster: _Broadcaster | None = None
        self._members: tuple[str, ...] = ()
        self.rebuilds = 0

    @property
    def members(self) -> tuple[str, ...]:
        return self._members

    async def _open(self, urls: tuple[str, ...]) -> _Broadcaster:
        port = self.master_port if self.master_port and not self.rebuilds else free_port(self.master_address)
        name = f"relax_weights_{next(_group_ids)}_{port}"
        bc = _Broadcaster(list(urls), api_key=self.api_key, master_address=self.master_address, master_port=port,
                          group_name=name, backend=self.backend, timeout_s=self.timeout_s)
        await asyncio.wait_for(bc.init(), self.timeout_s)
        return bc

    async def ensure_group(self, urls: list[str]) -> None:
        members = tuple(sorted(u.rstrip("/") for u in urls))
        if self._broadcaster is not None and members == self._members:
            return
        await self.close()
        self._broadcaster = await self._open(members)
        self._members = members
        self.rebuilds += 1

    async def push(self, named: list[tuple[str, torch.Tensor]], version: int | str, urls: list[str]) -> int:
        """Broadcast ``named`` to the engines at ``urls``; returns the number of buckets."""
        await self.ensure_group(urls)
        assert self._broadcaster is not None
        try:
            return await asyncio.wait_for(
                self._broadcaster.push(named, weight_version=str(version), bucket_bytes=self.bucket_bytes),
                self.timeout_s)
        except BaseException:
            await self.close()  # a broken collective cannot be reused
            raise

    async def push_one(self, named: list[tuple[str, torch.Tensor]], version: int | str, url: str) -> int:
        """A one-off group with a single engine (a joiner), leaving the main group alone."""
        bc = await self._open((url.rstrip("/"),))
        try:
            return await asyncio.wait_for(
                bc.push(named, weight_version=str(version), bucket_bytes=self.bucket_bytes), self.timeout_s)
        finally:
            await bc.close()

    async def close(self) -> None:
        if self._broadcaster is not None:
            bc, self._broadcaster = self._broadcaster, None
            self._members = ()
            try:
                await bc.close()
            except Exception:
                log.debug("closing the weight group failed", exc_info=True)


# ------------------------------------------------------------------------------------------------
# publishing after each step
# ------------------------------------------------------------------------------------------------
class WeightPublisher:
    """Pushes a backend's weights to every live engine of a router as a numbered version."""

    def __init__(self, backend: TrainerBackend, router: EngineRouter, *, path: SyncPath, staging_dir: str | Path,
                 api_key: str | None = None, bucket_bytes: int = 256 << 20,
                 distributed: DistributedWeightSync | None = None, retries: int = 2) -> None:
        self.backend = backend
        self.router = router
        self.path = path
        self.api_key = api_key
        self.bucket_bytes = bucket_bytes
        self.retries = retries
        self.staging_dir = Path(staging_dir)
        self._folders: list[Path] = []
        self.distributed = distributed
        if path == "distributed" and distributed is None:
            self.distributed = DistributedWeightSync(api_key=api_key, bucket_bytes=bucket_bytes)
        self.version: int | None = None  # the version engines serve
        self._snapshot: list[tuple[str, torch.Tensor]] | None = None
        self.lock = asyncio.Lock()
        self.events: dict[str, int] = {"publishes": 0, "retries": 0, "joins": 0}

    def _live(self) -> list[EngineHandle]:
        return self.router.live()

    async def publish(self, version: int, named: list[tuple[str, torch.Tensor]] | None = None) -> dict[str, float]:
        """Make every live engine serve ``named`` (default: the backend's current weights; a CPU
        snapshot when the trainer goes on training meanwhile) as ``version``."""
        async with self.lock:
            start = time.perf_counter()
            attempt = 0
            while True:
                try:
                    result = await self._push_all(version, named)
                    break
                except (EngineError, WeightSyncFailed, WeightSyncError, httpx.HTTPError, OSError, RuntimeError,
                        TimeoutError) as exc:
                    attempt += 1
                    self.events["retries"] += 1
                    log.warning("weight push v%d failed (%s); checking engine health and retrying", version, exc)
                    await self.router.check_health()
                    if attempt > self.retries or not self._live():
                        raise WeightSyncFailed(f"weight sync v{version} failed after {attempt} attempts: {exc}") from exc
            self.version = version
            if self.path != "disk":
                # the exact weights engines serve now; a joiner gets these, not a half-trained later state
                self._snapshot = named if named is not None else [
                    (n, t.detach().to("cpu", copy=True)) for n, t in self.backend.named_weights()]
            self.events["publishes"] += 1
            metrics = result.metrics()
            metrics["sync/seconds"] = time.perf_counter() - start
            metrics["sync/retries"] = float(attempt)
            return metrics

    @property
    def snapshot(self) -> list[tuple[str, torch.Tensor]] | None:
        """The weights engines serve (tensor and distributed paths), as CPU tensors."""
        return self._snapshot

    async def _push_all(self, version: int, named: list[tuple[str, torch.Tensor]] | None = None) -> SyncResult:
        router = self.router
        start = time.perf_counter()
        # the only engine may have missed a few health checks under load: wait (bounded) for revival
        handles = await router.live_engines(wait_s=router.no_engine_timeout_s)
        if not handles:
            raise WeightSyncFailed(f"no live engine to sync weights to after waiting {router.no_engine_timeout_s:.0f} s")
        if named is None:
            named = list(self.backend.named_weights())
        nbytes = sum(t.numel() * t.element_size() for _, t in named)
        async with router.paused_for_update():
            if self.path == "disk":
                # the disk path writes the backend's own weights: callers never overlap it with training
                folder = self.staging_dir / f"v{version:06d}"
                await asyncio.to_thread(self.backend.save_pretrained, folder)
                await router.update_weights_from_disk(str(folder), version)  # marks failing engines unhealthy
                self._remember(folder)
            else:
                if self.path == "tensor":
                    from relax_gym.trainer.engines.weights import push_weights_from_tensor

                    await asyncio.gather(*(push_weights_from_tensor(
                        h.url, named, weight_version=str(version), api_key=self.api_key,
                        bucket_bytes=self.bucket_bytes) for h in handles))
                else:
                    assert self.distributed is not None
                    await self.distributed.push(named, version, [h.url for h in handles])
                # no folder: engines that join later get the kept snapshot (bring_up_to_date)
                router.weights_path = None
                router.weight_version = str(version)
            # The update itself drops cached prefixes (SGLang's flush_cache=True default). An
            # explicit flush is refused while a request that slipped in before the pause waits
            # in the engine; that request runs on the new weights, so the refusal is harmless.
            await asyncio.gather(*(self._flush(h) for h in handles))
        problems = []
        live = [h for h in handles if h.state in ("ready", "draining")]
        for h in live:
            info = await h.client.model_info()
            if info.weight_version != str(version):
                problems.append(f"{h.id} reports {info.weight_version!r}, expected {version}")
            else:
                h.weight_version = str(version)
        if problems or not live:
            raise WeightSyncFailed("; ".join(problems) or "every engine failed the update")
        return SyncResult(version, self.path, time.perf_counter() - start, nbytes, len(live))

    async def _flush(self, handle: EngineHandle) -> None:
        try:
            await handle.client.flush_cache()
        except EngineError as exc:
            if exc.status != 400:
                raise

    def _remember(self, folder: Path) -> None:
        self._folders.append(folder)
        while len(self._folders) > 2:
            shutil.rmtree(self._folders.pop(0), ignore_errors=True)

    async def bring_up_to_date(self, url: str) -> str | None:
        """Push the published weights to one engine (a joiner or a revived one); returns the
        version it now serves (None before the first publish: it keeps its own weights)."""
        async with self.lock:
            if self.version is None:
                return None
            self.events["joins"] += 1
            if self.path == "disk":
                folder = self.router.weights_path
                if folder is None:
                    raise WeightSyncError("no published weight folder to load")
                from relax_gym.protocol import UpdateWeightsFromDiskRequest

                async with EngineClient(url, api_key=self.api_key) as client:
                    await client.update_weights_from_disk(UpdateWeightsFromDiskRequest(
                        model_path=folder, weight_version=str(self.version)))
            elif self.path == "tensor":
                from relax_gym.trainer.engines.weights import push_weights_from_tensor

                assert self._snapshot is not None
                await push_weights_from_tensor(url, self._snapshot, weight_version=str(self.version),
                                               api_key=self.api_key, bucket_bytes=self.bucket_bytes)
            else:
                assert self._snapshot is not None and self.distributed is not None
                await self.distributed.push_one(self._snapshot, self.version, url)
            return str(self.version)

    async def close(self) -> None:
        if self.distributed is not None:
            await self.distributed.close()


WeightsProvider = Callable[[str], Awaitable[str | None]]


class ElasticRouter(EngineRouter):
    """An :class:`EngineRouter` whose joining or reviving engines get the trainer's current
    weights before they take traffic (``provider(url)`` pushes them and returns the version)."""

    def __init__(self, *args: Any, provider: WeightsProvider | None = None,
                 on_change: Callable[[str, str], Awaitable[Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.provider = provider
        self.on_change = on_change  # ("added" | "removed", url): keeps another router in step
        self.events.setdefault("joined_with_weights", 0)

    async def add_engine(self, url: str, *, engine_id: str | None = None) -> EngineHandle:
        handle = await super().add_engine(url, engine_id=engine_id)
        if self.on_change is not None:
            await self.on_change("added", handle.url)
        return handle

    async def remove_engine(self, engine_id: str, *, drain: bool = True, wait: bool = True,
                            timeout_s: float | None = None) -> None:
        handle = self.get(engine_id)
        url = handle.url if handle is not None else None
        await super().remove_engine(engine_id, drain=drain, wait=wait, timeout_s=timeout_s)
        if self.on_change is not None and url is not None:
            await self.on_change("removed", url)

    async def _bring_to_current_weights(self, handle: EngineHandle) -> None:
        if self.provider is None:
            await super()._bring_to_current_weights(handle)
            return
        info = await handle.client.model_info()
        if self.weight_version is not None and info.weight_version == self.weight_version:
            handle.weight_version = info.weight_version  # already serves the current version
            return
        for _ in range(3):  # a publish may land between the push and the check: push again
            pushed = await self.provider(handle.url)
            info = await handle.client.model_info()
            wanted = self.weight_version if pushed is None else pushed
            if (wanted is None or info.weight_version == wanted) and (
                    self.weight_version is None or info.weight_version == self.weight_version):
                handle.weight_version = info.weight_version
                self.events["joined_with_weights"] += 1
                return
        raise WeightSyncError(
            f"engine {handle.id} reports weight version {info.weight_version!r}, expected {self.weight_version!r}")

    def set_version(self, version: int | str) -> None:
        """Record the version the trainer published (routers in other processes learn it here)."""
        self.weight_version = str(version)
        for h in self.engines:
            if h.state in ("ready", "draining"):
                h.weight_version = str(version)


__all__ = [
    "DistributedWeightSync",
    "ElasticRouter",
    "SyncPath",
    "WeightPublisher",
    "WeightsProvider",
    "free_port",
]
