"""``hf:PATH`` -- a local transformers model, nothing served.

Text models load with ``AutoModelForCausalLM``. Qwen-VL models (a ``vision_config`` in
``config.json``) load with ``AutoModelForImageTextToText`` and take images through the PIL
image processor saved beside them (torchvision is not needed). The episode is encoded by the
core's chat encoder, as in training (see ``local_chat.py``), and each turn's generated ids join
it as they are. One model instance serves every episode: generation is serialised behind a lock
and runs in a worker thread, and each turn is seeded from its episode key, so a run is
reproducible whatever the concurrency. Video and audio are refused with
:class:`ModalityRejected`: the encoder has no tokens for them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from relax_gym.core import Env
from relax_gym.model_context import folder_context

from .base import AgentOptions, EpisodeInfo, FatalAgentError
from .local_chat import Conversation, LocalChatAgent, LocalChatSession, load_codec


class HFAgent(LocalChatAgent):
    def __init__(self, spec: str, path: str, options: AgentOptions) -> None:
        super().__init__(spec, options)
        self.path = path
        self.model: Any = None
        self.vision = False
        self._vision_tokens: Any = None
        self._lock = threading.Lock()

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        config_file = Path(self.path) / "config.json"
        if not config_file.exists():
            raise FatalAgentError(f"hf: {self.path!r} is not a model folder (no config.json)")
        config = json.loads(config_file.read_text())
        self.vision = "vision_config" in config
        self.codec = load_codec(self.options.tokenizer or self.path, self.options)
        if self.vision and self.codec.vision is None:
            raise FatalAgentError(f"hf: {self.path!r} has a vision tower but no image processor beside its tokenizer")
        try:
            import torch  # noqa: F401
            from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
        except ImportError as exc:
            raise FatalAgentError(f"hf: agent needs torch and transformers ({exc})") from None
        try:
            if self.vision:
                # Qwen-VL input preparation is the core's, shared with the engine and the trainer
                from relax_gym.vision import VisionTokens
                from transformers import AutoConfig

                self.model = AutoModelForImageTextToText.from_pretrained(self.path)
                self._vision_tokens = VisionTokens.from_config(AutoConfig.from_pretrained(self.path))
            else:
                self.model = AutoModelForCausalLM.from_pretrained(self.path)
        except (OSError, ValueError) as exc:
            raise FatalAgentError(f"hf: cannot load the model in {self.path!r}: {exc}") from None
        self.model.eval()
        self.set_context_limit(folder_context(self.path))

    def session(self, env: Env, episode: EpisodeInfo) -> _HFSession:
        return _HFSession(self, env, episode)

    def versions(self) -> dict[str, str]:
        import transformers

        return {"transformers": transformers.__version__}

    def generate(self, conv: Conversation, seed: int, max_new_tokens: int) -> list[int]:
        """The generated token ids (the end-of-turn token included); runs under the model lock."""
        import torch

        assert conv.context is not None
        ids = list(conv.context.ids)
        extra: dict[str, Any] = {}
        images = [part.image for part in conv.context.images]
        if images or self.vision:
            from relax_gym.vision import prepare_vision_inputs

            assert conv.codec.vision is not None  # checked when the model was loaded
            videos = [(v.frames, v.fps) for v in conv.context.videos]
            prepared = prepare_vision_inputs(ids, images, conv.codec.vision.image_processor, self._vision_tokens,
                                             videos=videos, video=conv.codec.vision.video, encode=conv.codec.encode)
            ids = prepared.input_ids
            if conv.codec.audio is None:  # Qwen3-VL's M-RoPE reads them; the omni thinker takes none
                extra["mm_token_type_ids"] = torch.tensor([prepared.mm_token_type_ids])
            if prepared.pixel_values is not None:
                extra["pixel_values"] = prepared.pixel_values
                extra["image_grid_thw"] = prepared.image_grid_thw
            if prepared.pixel_values_videos is not None:
                extra["pixel_values_videos"] = prepared.pixel_values_videos
                extra["video_grid_thw"] = prepared.video_grid_thw
        if conv.context.audios and conv.codec.audio is not None:  # the thinker hears: log-mel features per clip
            extra.update(conv.codec.audio.features([a.waveform for a in conv.context.audios]))
        o = self.options
        sample = o.temperature > 0
        gen_kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": sample}
        if sample:
            gen_kwargs.update(temperature=o.temperature, top_p=o.top_p)
            if o.top_k > 0:
                gen_kwargs["top_k"] = o.top_k
            if o.min_p > 0:
                gen_kwargs["min_p"] = o.min_p
        input_ids = torch.tensor([ids])
        with self._lock, torch.no_grad():
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **gen_kwargs, **extra
            )
        return [int(t) for t in out[0, input_ids.shape[1] :].tolist()]


class _HFSession(LocalChatSession):
    agent: HFAgent

    async def generate(self, seed: int, max_new_tokens: int) -> tuple[list[int], int, int]:
        prompt_tokens = len(self.conv.ids)
        new = await asyncio.to_thread(self.agent.generate, self.conv, seed, max_new_tokens)
        return new, prompt_tokens, len(new)


__all__ = ["HFAgent", "AgentOptions"]
