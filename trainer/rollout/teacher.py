"""Teacher logprobs for on-policy distillation, scored through the engine protocol.

The teacher sees each student sample's exact tokens (and images) as a prompt with
``max_new_tokens=0`` and ``return_logprob=True``. SGLang answers with
``meta_info.input_token_logprobs``, one ``[logprob, token_id, text]`` triple per prompt token
from ``logprob_start_len``, and the first triple's logprob is always None (SGLang scores each
token from the position before it and drops the one at the start). So we ask from the token
before the first response token (``prompt_length - 1``) and skip that leading None. The result
is aligned with the sample's tokens (0 where the loss mask is 0); each triple's token id must
match the sample's token at its position.
"""

from __future__ import annotations

import asyncio

import torch

from relax_gym.media import image_to_data_url
from relax_gym.protocol import EngineClient, EngineError, GenerateRequest, SamplingParams
from relax_gym.audio import audio_payload
from relax_gym.video import video_payload
from relax_gym.vision import collapse_image_tokens
from relax_gym.trainer.rollout import Trajectory


async def teacher_logprobs(client: EngineClient, trajectories: list[Trajectory], *, concurrency: int = 16,
                           timeout_s: float = 300.0) -> list[torch.Tensor]:
    """Per-token teacher logprobs for each trajectory (raises EngineError on a malformed reply)."""
    sem = asyncio.Semaphore(concurrency)

    async def one(t: Trajectory) -> torch.Tensor:
        start = max(t.prompt_length - 1, 0)
        ids = list(t.token_ids)
        if t.images:  # one pad per image, as SGLang's Qwen3-VL processor expects (docs/rollout.md)
            ids = collapse_image_tokens(ids, t.image_token_id)
        req = GenerateRequest(
            input_ids=ids,
            image_data=[image_to_data_url(p.image) for p in t.images] or None,
            # videos go with their expanded placeholders (the embedded engine takes either form)
            video_data=[video_payload(v.frames, v.fps) for v in t.videos] or None,
            audio_data=[audio_payload(a.waveform) for a in t.audios] or None,  # expanded pads: either form is taken
            sampling_params=SamplingParams(max_new_tokens=0, temperature=1.0),
            return_logprob=True, logprob_start_len=start,
        )
        async with sem:
            reply = await client.generate(req, timeout_s=timeout_s)
        triples = reply.meta_info.input_token_logprobs
        if triples is None:
            raise EngineError(client.base_url, "the teacher returned no input_token_logprobs")
        out = torch.zeros(len(t.token_ids), dtype=torch.float32)
        if len(triples) != len(t.token_ids) - start:
            raise EngineError(client.base_url, f"the teacher returned {len(triples)} input_token_logprobs for "
                              f"{len(t.token_ids) - start} tokens from position {start}")
        for offset, triple in enumerate(triples):
            pos = start + offset
            if len(triple) < 2 or triple[1] is None or int(triple[1]) != t.token_ids[pos]:
                raise EngineError(client.base_url, f"teacher logprob misaligned at token {pos}")
            if not t.loss_mask[pos]:
                continue
            if triple[0] is None:
                raise EngineError(client.base_url, f"the teacher returned no logprob for response token {pos}")
            out[pos] = float(triple[0])
        return out

    return list(await asyncio.gather(*(one(t) for t in trajectories)))


__all__ = ["teacher_logprobs"]
