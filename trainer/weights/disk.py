"""The disk transport: an HF folder per version, loaded with ``POST /update_weights_from_disk``.

Any SGLang-protocol engine that can read the folder takes this path. The backend writes the
folder itself (``save_pretrained``: config, tokenizer and processor files beside the weights; the
megatron backend streams ``iter_hf_buckets`` into shards on its writer rank), because an engine
needs a whole model folder, not loose tensors. The folder of the published version stays, so an
engine that joins or comes back later loads exactly it; older folders are deleted.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from pathlib import Path

from relax_gym.trainer.engines.in_process import engine_client
from relax_gym.protocol import UpdateWeightsFromDiskRequest
from relax_gym.trainer.rollout import WeightSyncError
from relax_gym.trainer.weights.transport import Delivery, WeightSource, WeightTransport, gather_failures


class DiskTransport(WeightTransport):
    """``<staging_dir>/v<version>`` folders (see the module docstring)."""

    name = "disk"
    needs_source_for_catch_up = False

    def __init__(self, staging_dir: str | Path, *, api_key: str | None = None, keep_folders: int = 2,
                 timeout_s: float = 600.0) -> None:
        self.staging_dir = Path(staging_dir)
        self.api_key = api_key
        self.keep_folders = max(1, keep_folders)
        self.timeout_s = timeout_s
        self.folder: Path | None = None  # the published version's folder
        self._folders: list[Path] = []

    async def send(self, source: WeightSource, version: str, urls: Sequence[str]) -> Delivery:
        folder = self.staging_dir / f"v{version:0>6}"
        await asyncio.to_thread(source.save_pretrained, folder)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        failed = await gather_failures({u: self._load(u, folder, version) for u in urls})
        self._remember(folder)
        return Delivery(bytes=size, buckets=1, failed=failed, folder=str(folder))

    async def send_one(self, source: WeightSource | None, version: str, url: str) -> None:
        if self.folder is None:
            raise WeightSyncError("no published weight folder to load")
        await self._load(url, self.folder, version)

    async def _load(self, url: str, folder: Path, version: str) -> None:
        async with engine_client(url, api_key=self.api_key, timeout_s=self.timeout_s) as client:
            await client.update_weights_from_disk(UpdateWeightsFromDiskRequest(model_path=str(folder),
                                                                               weight_version=version))

    def _remember(self, folder: Path) -> None:
        self.folder = folder
        if folder not in self._folders:
            self._folders.append(folder)
        while len(self._folders) > self.keep_folders:
            shutil.rmtree(self._folders.pop(0), ignore_errors=True)


__all__ = ["DiskTransport"]
