"""Push the trainer's weights to every engine, then flush their caches and check the version.

Two paths, chosen per engine (``engine.sync``):

* **tensor** (in memory, the embedded engine's fast path): the backend's named tensors go in
  buckets over ``POST /update_weights_from_tensor`` as safetensors blobs -- nothing touches the
  disk. Only the last bucket carries the new ``weight_version``, so an engine never reports a
  version whose weights are half loaded.
* **disk** (any SGLang-protocol engine): the backend writes an HF folder
  (``<staging>/v<version>``), every engine loads it with ``/update_weights_from_disk``; the
  router records the folder so an engine that joins or recovers later loads the same weights.

Either way generation is paused around the update (in colocate mode nothing is in flight, but a
late request must never see half-updated weights), ``/flush_cache`` drops KV/prefix caches
computed with the old weights, and each engine's ``/get_model_info`` must report the new
version afterwards or the sync fails loudly (:class:`WeightSyncFailed`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from relax_gym.errors import RelaxGymError
from relax_gym.protocol import EngineError
from relax_gym.trainer.backends.base import TrainerBackend


class WeightSyncFailed(RelaxGymError, RuntimeError):
    """An engine did not end up serving the new weights."""


@dataclass
class SyncResult:
    version: int
    path: str  # "tensor" or "disk"
    seconds: float
    bytes: int
    engines: int

    def metrics(self) -> dict[str, float]:
        return {"sync/seconds": self.seconds, "sync/megabytes": self.bytes / 2**20, "sync/engines": float(self.engines),
                "sync/version": float(self.version)}


class WeightSync:
    """Sends a backend's weights to the engines behind a rollout router."""

    def __init__(self, backend: TrainerBackend, router: object, *, path: Literal["tensor", "disk"],
                 staging_dir: str | Path, api_key: str | None = None, bucket_bytes: int = 256 << 20,
                 keep_folders: int = 2) -> None:
        self.backend = backend
        self.router = router
        self.path = path
        self.staging_dir = Path(staging_dir)
        self.api_key = api_key
        self.bucket_bytes = bucket_bytes
        self.keep_folders = keep_folders
        self._folders: list[Path] = []

    async def push(self, version: int) -> SyncResult:
        """Make every live engine serve the backend's current weights as ``version``."""
        from relax_gym.trainer.rollout import EngineRouter

        router = self.router
        assert isinstance(router, EngineRouter)
        start = time.perf_counter()
        nbytes = sum(t.numel() * t.element_size() for _, t in self.backend.named_weights())
        handles = await router.live_engines(wait_s=router.no_engine_timeout_s)
        if not handles:
            raise WeightSyncFailed(
                f"no live engine to sync weights to after waiting {router.no_engine_timeout_s:.0f} s; engines: "
                + ", ".join(f"{h.id} {h.state} ({h.last_error})" for h in router.engines)
            )
        async with router.paused_for_update():
            if self.path == "disk":
                folder = self.staging_dir / f"v{version:06d}"
                await asyncio.to_thread(self.backend.save_pretrained, folder)
                await router.update_weights_from_disk(str(folder), version)
                self._remember(folder)
            else:
                await self._push_tensors(handles, version)
                # The router's record is what engines added later are synced from; with the
                # tensor path there is no folder, so record the version only (a late engine
                # then fails its version check loudly instead of serving stale weights).
                router.weights_path = None
                router.weight_version = str(version)
            await asyncio.gather(*(h.client.flush_cache() for h in handles))
        problems = []
        for h in handles:
            try:
                info = await h.client.model_info()
            except EngineError as exc:
                problems.append(f"{h.id}: {exc}")
                continue
            if info.weight_version != str(version):
                problems.append(f"{h.id} reports weight version {info.weight_version!r}, expected {version}")
            else:
                h.weight_version = str(version)
        if problems:
            raise WeightSyncFailed("weight sync failed: " + "; ".join(problems))
        return SyncResult(version, self.path, time.perf_counter() - start, nbytes, len(handles))

    async def _push_tensors(self, handles: list[object], version: int) -> None:
        from relax_gym.trainer.engines.weights import push_weights_from_tensor

        named = list(self.backend.named_weights())
        await asyncio.gather(*(
            push_weights_from_tensor(h.url, named, weight_version=str(version),  # type: ignore[attr-defined]
                                     api_key=self.api_key, bucket_bytes=self.bucket_bytes)
            for h in handles
        ))

    def _remember(self, folder: Path) -> None:
        self._folders.append(folder)
        while len(self._folders) > self.keep_folders:
            shutil.rmtree(self._folders.pop(0), ignore_errors=True)


__all__ = ["SyncResult", "WeightSync", "WeightSyncFailed"]
