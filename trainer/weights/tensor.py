"""The in-memory transport: ``POST /update_weights_from_tensor`` with safetensors buckets.

For engines on the trainer's host (the embedded engine). Each bucket is encoded once (base64 text
of a safetensors blob, :func:`~relax_gym.trainer.engines.weight_receiver.encode_named_tensors`) and
posted to every engine concurrently before the next bucket is pulled; nothing touches the disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from relax_gym.protocol import EngineClient, EngineError, UpdateWeightsFromTensorRequest
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

    def __init__(self, *, api_key: str | None = None, bucket_bytes: int = 256 << 20, timeout_s: float = 600.0) -> None:
        self.api_key = api_key
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self._checked: set[str] = set()  # engines whose /server_info said they take our items

    async def _refuse_sglang(self, client: EngineClient) -> None:
        """Real SGLang accepts our safetensors items at the HTTP layer and then fails inside
        ("Unknown load_format"): refuse it up front, by the ``version`` its ``/server_info`` reports
        (the embedded engine's starts with ``relax-gym-embedded``; an unreadable one is let through)."""
        if client.base_url in self._checked:
            return
        try:
            version = (await client.server_info()).get("version")
        except EngineError:
            version = None
        if isinstance(version, str) and version and not version.startswith("relax-gym-embedded"):
            raise WeightSyncFailed(
                f"{client.base_url} runs SGLang {version}: engine.sync 'tensor' works with embedded engines only "
                "(SGLang's /update_weights_from_tensor takes its own pickled CUDA IPC items, one per TP rank); "
                "use engine.sync 'distributed' (nccl) or 'disk'")
        self._checked.add(client.base_url)

    async def send(self, source: WeightSource, version: str, urls: Sequence[str]) -> Delivery:
        clients = {u: EngineClient(u, api_key=self.api_key, timeout_s=self.timeout_s) for u in urls}
        out = Delivery()
        try:
            for client in clients.values():
                await self._refuse_sglang(client)
            for bucket, last in with_last(source.buckets(self.bucket_bytes)):
                out.buckets += 1
                out.bytes += nbytes(bucket)
                alive = [u for u in urls if u not in out.failed]
                if not alive:
                    continue  # still walk the source to its end (a collective export)
                # encoding a bucket takes tens of ms per 10 MB: off the event loop, which meanwhile
                # answers the trainer's other calls (the learner process) or drives rollouts
                blob = await asyncio.to_thread(encode_named_tensors, bucket)
                req = UpdateWeightsFromTensorRequest(serialized_named_tensors=[blob],
                                                     weight_version=version if last else None)
                out.failed.update(await gather_failures({u: clients[u].update_weights_from_tensor(req)
                                                         for u in alive}))
        finally:
            for client in clients.values():
                await client.aclose()
        return out


__all__ = ["TensorTransport"]
