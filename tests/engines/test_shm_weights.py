"""The shared-memory weight path: /dev/shm safetensors files whose paths are posted.

The file helpers round-trip exactly and refuse anything but our own files; against a live engine
the tensor transport picks shared memory by itself, the engine serves exactly the sent weights
under the sent version, no file is left behind, and a bad path is a 400 that leaves the served
weights untouched."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
import torch
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.engines.shm_weights import (
    FILE_PREFIX,
    SHM_LOAD_FORMAT,
    read_shm_blob,
    shm_dir,
    write_shm_blob,
)
from relax_gym.trainer.engines.weight_receiver import WeightTransportError
from relax_gym.trainer.weights.tensor import TensorTransport
from relax_gym.trainer.weights.transport import Snapshot
from transformers import AutoModelForCausalLM

from relax_gym.protocol import EngineClient

from .conftest import API_KEY
from .test_weights import fresh_logprobs, max_diff, probe


def ours() -> set[str]:
    return {p.name for p in shm_dir().iterdir() if p.name.startswith(FILE_PREFIX)}


def test_a_file_round_trips_tied_weights_and_is_private() -> None:
    emb = torch.randn(7, 3)
    named = [("embed.weight", emb), ("lm_head.weight", emb), ("b", torch.arange(4, dtype=torch.int64))]
    path = write_shm_blob(named)
    try:
        assert path.parent == shm_dir() and path.name.startswith(FILE_PREFIX)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        back = dict(read_shm_blob(str(path), max_bytes=1 << 20))
    finally:
        path.unlink()
    assert set(back) == {"embed.weight", "lm_head.weight", "b"}
    assert torch.equal(back["embed.weight"], emb) and torch.equal(back["lm_head.weight"], emb)
    assert torch.equal(back["b"], torch.arange(4))


def test_anything_but_our_own_file_is_refused(tmp_path: Path) -> None:
    good = write_shm_blob([("w", torch.ones(64))])
    link = shm_dir() / f"{FILE_PREFIX}link{os.getpid()}.safetensors"
    junk = shm_dir() / f"{FILE_PREFIX}junk{os.getpid()}.safetensors"
    elsewhere = tmp_path / good.name
    try:
        link.symlink_to(good)
        junk.write_bytes(b"not a safetensors blob")
        elsewhere.write_bytes(good.read_bytes())
        cases = {
            good.name: "is not a",  # relative
            str(elsewhere): "is not a",  # another folder
            str(shm_dir() / "other.safetensors"): "is not a",  # not our name
            str(shm_dir() / f"{FILE_PREFIX}../{good.name}"): "is not a",  # tries to climb out
            str(link): "cannot open",  # links are not followed
            str(shm_dir() / f"{FILE_PREFIX}gone{os.getpid()}.safetensors"): "cannot open",
            str(junk): "not a safetensors blob",
        }
        for item, fragment in cases.items():
            with pytest.raises(WeightTransportError, match=fragment):
                read_shm_blob(item, max_bytes=1 << 20)
        with pytest.raises(WeightTransportError, match="more than"):
            read_shm_blob(str(good), max_bytes=16)
    finally:
        for p in (good, link, junk):
            p.unlink(missing_ok=True)


@pytest.mark.parametrize("shared", [True, False])
async def test_the_transport_picks_shared_memory_for_a_local_engine(
    engine: EmbeddedEngineProcess, bpe_qwen3_seed1: Path, shared: bool
) -> None:
    target = dict(AutoModelForCausalLM.from_pretrained(str(bpe_qwen3_seed1), dtype=torch.float32).state_dict())
    before = ours()
    transport = TensorTransport(api_key=API_KEY, bucket_bytes=64 << 10, shared_memory=shared)
    delivery = await transport.send(Snapshot(list(target.items())), "shm-1", [engine.url])
    async with EngineClient(engine.url, api_key=API_KEY) as client:
        out = await probe(client)
    assert transport.modes == {engine.url: "shm" if shared else "body"}
    assert delivery.buckets > 2 and not delivery.failed
    assert out.meta_info.weight_version == "shm-1"
    assert max_diff(fresh_logprobs(bpe_qwen3_seed1, out), out) < 1e-4
    assert ours() <= before  # every bucket's file was removed


async def test_a_bad_shared_memory_item_is_refused_and_changes_nothing(engine: EmbeddedEngineProcess,
                                                                       tmp_path: Path) -> None:
    outside = tmp_path / f"{FILE_PREFIX}x.safetensors"
    outside.write_bytes(b"{}")
    wrong = write_shm_blob([("no.such.weight", torch.zeros(3))])
    try:
        async with EngineClient(engine.url, api_key=API_KEY) as client:
            before = await probe(client)
            version = (await client.model_info()).weight_version
            info = await client.server_info()
            assert SHM_LOAD_FORMAT in info["weight_load_formats"] and info["weight_shm_dir"] == str(shm_dir())
            async with httpx.AsyncClient(base_url=engine.url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
                for item, fragment in ((str(outside), "is not a"), ("/etc/passwd", "is not a"),
                                       (str(wrong), "unknown parameter")):
                    resp = await http.post("/update_weights_from_tensor", json={
                        "serialized_named_tensors": [item], "load_format": SHM_LOAD_FORMAT, "weight_version": "bad"})
                    assert resp.status_code == 400 and fragment in resp.text, resp.text
                # the control route stays behind the key
                resp = await httpx.AsyncClient(base_url=engine.url).post("/update_weights_from_tensor", json={
                    "serialized_named_tensors": [str(wrong)], "load_format": SHM_LOAD_FORMAT})
                assert resp.status_code == 401
            after = await probe(client)
            assert (await client.model_info()).weight_version == version
    finally:
        wrong.unlink(missing_ok=True)
    assert after.output_ids == before.output_ids
