"""The in-memory transport: ``POST /update_weights_from_tensor`` with safetensors buckets.

For engines on the trainer's host (the embedded engine). Each bucket is written once and posted
to every engine concurrently before the next bucket is pulled; nothing touches the disk. How a
bucket travels is picked per engine, from its ``/server_info``:

* **shared memory** (the default for an engine on this host): one safetensors file in
  ``/dev/shm`` per bucket, its path in the body (``load_format="relax_gym_shm"``,
  :mod:`~relax_gym.trainer.engines.shm_weights`), removed once every engine answered;
* **in the body**: base64 text of the safetensors blob
  (:func:`~relax_gym.trainer.engines.weight_receiver.encode_named_tensors`), for an engine on
  another host (or with ``shared_memory=False``). About 30x slower from 15 MB up: base64, a JSON
  body of 4/3 the size, and the decode.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from relax_gym.trainer.engines.in_process import engine_client
from relax_gym.protocol import EngineClient, EngineError, UpdateWeightsFromTensorRequest
from relax_gym.trainer.engines.shm_weights import SHM_LOAD_FORMAT, host_id, shm_dir, write_shm_blob
from relax_gym.trainer.engines.weight_receiver import encode_named_tensors
from relax_gym.trainer.weights.transport import (
    Delivery,
    WeightSource,
    WeightSyncFailed,
    WeightTransport,
    gather_failures,
    nbytes,
    with_last,
)


class TensorTransport(WeightTransport):
    """Buckets of named tensors in the request body (see the module docstring)."""

    name = "tensor"

    def __init__(self, *, api_key: str | None = None, bucket_bytes: int = 256 << 20, timeout_s: float = 600.0,
                 shared_memory: bool = True) -> None:
        self.api_key = api_key
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.shared_memory = shared_memory
        self._checked: dict[str, Literal["shm", "body"]] = {}  # engines checked, and how they get buckets

    @property
    def modes(self) -> dict[str, str]:
        """How each engine seen so far gets its buckets: ``shm`` or ``body`` (base64)."""
        return dict(self._checked)

    async def _check(self, client: EngineClient) -> None:
        """Real SGLang accepts our safetensors items at the HTTP layer and then fails inside
        ("Unknown load_format"): refuse it up front, by the ``version`` its ``/server_info`` reports
        (the embedded engine's starts with ``relax-gym-embedded``; an unreadable one is let through).
        An engine that reads shared-memory files in our shm folder on our host gets those."""
        if client.base_url in self._checked:
            return
        try:
            info = await client.server_info()
        except EngineError:
            info = {}
        version = info.get("version")
        if isinstance(version, str) and version and not version.startswith("relax-gym-embedded"):
            raise WeightSyncFailed(
                f"{client.base_url} runs SGLang {version}: engine.sync 'tensor' works with embedded engines only "
                "(SGLang's /update_weights_from_tensor takes its own pickled CUDA IPC items, one per TP rank); "
                "use engine.sync 'distributed' (nccl) or 'disk'")
        local = (self.shared_memory and SHM_LOAD_FORMAT in (info.get("weight_load_formats") or [])
                 and info.get("host_id") == host_id() and info.get("weight_shm_dir") == str(shm_dir()))
        self._checked[client.base_url] = "shm" if local else "body"

    async def send(self, source: WeightSource, version: str, urls: Sequence[str]) -> Delivery:
        clients = {u: engine_client(u, api_key=self.api_key, timeout_s=self.timeout_s) for u in urls}
        out = Delivery()
        try:
            for client in clients.values():
                await self._check(client)
            for bucket, last in with_last(source.buckets(self.bucket_bytes)):
                out.buckets += 1
                out.bytes += nbytes(bucket)
                alive = [u for u in urls if u not in out.failed]
                if not alive:
                    continue  # still walk the source to its end (a collective export)
                weight_version = version if last else None
                shm = [u for u in alive if self._checked.get(u) == "shm"]
                body = [u for u in alive if u not in shm]
                calls = {}
                path: Path | None = None
                try:
                    # writing or encoding a bucket runs off the event loop, which meanwhile answers
                    # the trainer's other calls (the learner process) or drives rollouts
                    if shm:
                        path = await asyncio.to_thread(write_shm_blob, bucket)
                        req = UpdateWeightsFromTensorRequest(serialized_named_tensors=[str(path)],
                                                             load_format=SHM_LOAD_FORMAT,
                                                             weight_version=weight_version)
                        calls.update({u: clients[u].update_weights_from_tensor(req) for u in shm})
                    if body:
                        blob = await asyncio.to_thread(encode_named_tensors, bucket)
                        req = UpdateWeightsFromTensorRequest(serialized_named_tensors=[blob],
                                                             weight_version=weight_version)
                        calls.update({u: clients[u].update_weights_from_tensor(req) for u in body})
                    out.failed.update(await gather_failures(calls))
                finally:
                    for call in calls.values():  # not awaited when writing or encoding failed
                        with contextlib.suppress(AttributeError):
                            call.close()  # type: ignore[attr-defined]
                    if path is not None:
                        path.unlink(missing_ok=True)
        finally:
            for client in clients.values():
                await client.aclose()
        return out


__all__ = ["TensorTransport"]
