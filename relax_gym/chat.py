"""One chat encoder for evaluation and training: an episode becomes the same token ids in both.

``relax-gym eval`` (the ``sglang:`` and ``hf:`` agents) and the rollout manager that builds
training samples both hold an episode as a :class:`ChatContext`, so a model is scored on exactly
the prompt format it is trained on. Nothing the model wrote is ever re-tokenized: the context is
built append-only,

* the **prompt** -- the first observation (with the system prompt, when the env gave none)
  rendered with the tools and ``add_generation_prompt=True``;
* each **generated segment** -- the token ids the engine sampled, as they are;
* the **closing glue** -- what the template writes after an assistant message's content (for
  Qwen: ``<|im_end|>`` then ``\\n``), found by rendering a sentinel assistant message; only the
  part the engine did not sample itself is appended;
* each **observation delta** -- the tokens of the new env/tool messages plus the next generation
  prompt, by *render and trim*: render a fixed base conversation, render base + new messages
  with ``add_generation_prompt=True``, keep the suffix. The base is chosen per call from a short
  list of candidates and the prefix property is verified, never assumed.

:class:`ChatCodec` derives each piece from renders of the model's own template rather than from
hard-coded strings, and holds the **full re-render** used to check the incremental tokens at the
end of an episode (:meth:`ChatCodec.check_drift`).

**Media.** Observations come from ``env.format_observation(obs, "hf")``. An image is encoded
when the model has an image processor (Qwen-VL): its placeholder is expanded to the image's
patch count, and the image goes to the engine as ``image_data``. Any other media part has no
tokens here (:meth:`ChatCodec.takes`): training renders it as a short text placeholder, and
evaluation refuses the episode instead of scoring a model that never saw the media.

**Earlier assistant turns keep their reasoning.** An assistant turn stays in the context exactly
as sampled, ``<think>`` block included, although Qwen3's template drops the reasoning of turns
before the latest user query when it re-renders a conversation. Token-level multi-turn RL needs
this: every sampled token's logprob was computed by the engine on the context before it, and the
loss mask and the recomputed logprobs must address that same sequence, so the sample can only
grow at its end. Evaluation follows the same rule so that its prompts are the training prompts.
The training-only ``split`` policy (``docs/rollout.md``) instead starts a new sample, re-rendered
by the template, where the template would drop reasoning.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from relax_gym.audio import AudioSupport, audio_payload, canonical_waveform, collapse_audio_tokens
from relax_gym.content_cache import ContentCache, image_digest
from relax_gym.errors import MediaError, RelaxGymError
from relax_gym.media import image_to_data_url
from relax_gym.types import AudioPart, ImagePart, VideoPart
from relax_gym.video import VideoSupport, collapse_video_text, expand_video_tokens, video_payload
from relax_gym.vision import VisionInputError, collapse_image_tokens, expand_image_tokens, image_token_count

ThinkPolicy = Literal["keep", "split"]
_SENTINEL = "\u2063RELAXGYMSENTINEL\u2063"
MEDIA_KINDS = ("image", "audio", "video")
_Built = TypeVar("_Built")


#: markup a tool parser or the thinking split must see even where the tokenizer marks it special
KEPT_SPECIAL_TAGS = frozenset({"<tool_call>", "</tool_call>", "<think>", "</think>"})


def hidden_special_ids(tokenizer: Any) -> frozenset[int] | None:
    """Ids dropped from an env's text: the special ones minus :data:`KEPT_SPECIAL_TAGS`; None when
    no kept tag is special (the common case: plain ``skip_special_tokens`` decoding)."""
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for tok_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            special.add(int(tok_id))
    kept = {i for i in special if tokenizer.convert_ids_to_tokens(i) in KEPT_SPECIAL_TAGS}
    return frozenset(special - kept) if kept else None


class TemplateError(RelaxGymError, ValueError):
    """The chat template cannot render an observation as a delta (e.g. it rejects the role order)."""


_THINK_TAG_SPACE = re.compile(r"\s*(</?think>)\s*")


def normalize_think_whitespace(text: str) -> str:
    """``text`` with the whitespace around ``<think>`` / ``</think>`` removed: Qwen3-style
    templates rewrite that whitespace (strip newlines inside, put ``\n\n`` after the block), so
    two renders equal under this map hold the same reasoning and the same answer."""
    return _THINK_TAG_SPACE.sub(r"\1", text)


@dataclass(slots=True)
class DriftReport:
    """How the incrementally built tokens compare with a full re-render of the conversation.

    ``kind`` is ``"none"`` when they agree, ``"think_whitespace"`` when the only differences are
    whitespace around ``<think>`` / ``</think>`` that the template re-renders canonically (the
    model wrote ``<think>x</think>y``, the template writes ``<think>\nx\n</think>\n\ny``: nothing
    is lost, so every policy accepts it), ``"think_dropped"`` when reasoning blocks of earlier
    turns are missing from the template's render (expected under the ``keep`` think policy), and
    ``"template"`` for any other disagreement. ``expected`` says whether the configured policy
    accepts the difference; unexpected drift makes the sample untrainable.
    """

    kind: Literal["none", "think_whitespace", "think_dropped", "template", "unchecked"] = "unchecked"
    expected: bool = True
    mismatched_chunks: int = 0
    first_mismatch_token: int | None = None
    detail: str = ""

    @property
    def drifted(self) -> bool:
        return self.kind not in ("none", "unchecked")


@dataclass(slots=True)
class VisionSupport:
    """What a Qwen-VL model needs beyond its tokenizer: the image processor and the marker ids."""

    image_processor: Any
    image_token_id: int
    merge_size: int
    # placeholder/marker ids the model must never emit itself (a sampled <|image_pad|> would
    # claim image features that do not exist): generation stops at them and they are cut off
    reserved_ids: frozenset[int] = frozenset()
    video: VideoSupport | None = None  # Qwen3-VL: video sampling, patches and placeholder tokens

    def grids(self, images: Sequence[Any]) -> list[list[int]]:
        """The ``(t, h, w)`` patch grid of each image, from the model's own processor."""
        if not images:
            return []
        out = self.image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        return [[int(x) for x in g] for g in out["image_grid_thw"].tolist()]


@dataclass(slots=True)
class Rendered:
    """Token ids for a piece of context plus the images whose placeholders it holds."""

    ids: list[int]
    text: str
    images: list[Any] = field(default_factory=list)
    grids: list[list[int]] = field(default_factory=list)
    videos: list[VideoPart] = field(default_factory=list)  # sampled frames, as the model sees them
    video_grids: list[list[int]] = field(default_factory=list)
    video_spans: list[tuple[int, int]] = field(default_factory=list)  # each video's tokens in ``ids``
    video_reduced: list[str] = field(default_factory=list)  # what sampling reduced ("fps", "frames", ...)
    audios: list[AudioPart] = field(default_factory=list)  # canonical 16 kHz clips, as the model hears them


class ChatCodec:
    """Renders and tokenizes chat context for one model; see the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        vision: VisionSupport | None = None,
        audio: AudioSupport | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.audio = audio  # an omni model's feature extractor and audio markers (relax_gym.audio)
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise TemplateError("the tokenizer has no chat template; pass chat_template=")
        self.template_kwargs = dict(template_kwargs or {})
        self.vision = vision
        self._compiled = _compile(self.chat_template)
        self._backend = _fast_backend(tokenizer)
        self._pieces = _PieceEncoder.for_tokenizer(tokenizer, self._backend)
        self._special_kwargs = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
        self._added_ids = frozenset(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}))
        self._hidden_ids = hidden_special_ids(tokenizer)
        self._base_cache: dict[tuple[int, str], str] = {}
        self.closing_glue: list[int] = self._derive_closing_glue()
        self.assistant_prefix: str = self._derive_assistant_prefix()

    @classmethod
    def from_pretrained(cls, path: str | Path, *, template_kwargs: dict[str, Any] | None = None,
                        video: Any | None = None, audio: Any | None = None) -> ChatCodec:
        """Load the tokenizer (and for a Qwen-VL folder, its image processor) saved beside a model."""
        from transformers import AutoConfig, AutoTokenizer

        folder = Path(path)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        vision = None
        if (folder / "preprocessor_config.json").is_file():
            from relax_gym.vision import VisionTokens, load_image_processor

            tokens = VisionTokens.from_config(AutoConfig.from_pretrained(str(folder)))
            reserved = frozenset({tokens.image_token_id, tokens.video_token_id, tokens.vision_start_token_id,
                                  tokens.vision_end_token_id})
            image_processor = load_image_processor(folder)
            vision = VisionSupport(image_processor, tokens.image_token_id, tokens.merge_size, reserved,
                                   video=_video_support(folder, image_processor, tokens.video_token_id, video))
        audio_support = _audio_support(folder, tokenizer, audio)
        if audio_support is not None and vision is not None:  # the trainer's batches find it beside the images'
            vision.image_processor.relax_audio_extractor = audio_support.extractor
        return cls(tokenizer, template_kwargs=template_kwargs, vision=vision, audio=audio_support)

    # -- primitives -------------------------------------------------------------------------------
    def render(self, messages: Sequence[dict[str, Any]], *, tools: Sequence[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        """The chat template applied to ``messages`` (what ``apply_chat_template(tokenize=False)``
        returns, through a cached compiled template)."""
        kwargs = {**self._special_kwargs, **self.template_kwargs}
        try:
            if self._compiled is not None:
                return str(self._compiled.render(messages=list(messages), tools=list(tools) if tools else None,
                                                 documents=None, add_generation_prompt=add_generation_prompt, **kwargs))
            return str(self.tokenizer.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=add_generation_prompt, chat_template=self.chat_template,
                **self.template_kwargs,
            ))
        except Exception as exc:  # noqa: BLE001 -- jinja's raise_exception and any template bug
            raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
        return json.dumps(list(tools), sort_keys=True) if tools else ""

    def encode(self, text: str) -> list[int]:
        if self._pieces is not None:
            return self._pieces.encode(text)
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens,
                                         clean_up_tokenization_spaces=False))

    def action_text(self, ids: Sequence[int]) -> str:
        """What the env is given: the text without special tokens, except tool-call and thinking
        tags, which some tokenizers mark special (a Qwen2.5 GGUF's converted vocabulary marks
        every added token control): dropping those would erase the call the model made."""
        if self._hidden_ids is None:
            return self.decode(ids, skip_special_tokens=True)
        return self.decode([i for i in ids if i not in self._hidden_ids])

    @property
    def source(self) -> str:
        """The folder (or hub name) the tokenizer was loaded from, for messages and run configs."""
        return str(getattr(self.tokenizer, "name_or_path", "") or "<tokenizer>")

    # -- messages -----------------------------------------------------------------------------------
    def takes(self, kind: str) -> bool:
        """Can a ``kind`` content part become tokens? Text always; an image with an image processor
        (its placeholder is expanded to the image's patch count); a video with Qwen3-VL's video
        support (:mod:`relax_gym.video`); audio with an omni model's (:mod:`relax_gym.audio`)."""
        if kind == "audio":
            return self.audio is not None
        if kind == "video":
            return self.vision is not None and self.vision.video is not None
        return kind == "text" or (kind == "image" and self.vision is not None)

    @property
    def reserved_ids(self) -> frozenset[int]:
        """Vision markers the model must never emit (empty for a text model): generation stops at
        them (``stop_token_ids``) and :meth:`first_reserved` cuts a segment before one."""
        ids = self.vision.reserved_ids if self.vision is not None else frozenset()
        return ids | self.audio.tokens.reserved if self.audio is not None else ids

    def first_reserved(self, ids: Sequence[int]) -> int | None:
        """Index of the first reserved id in generated ``ids``, else None."""
        reserved = self.reserved_ids
        return next((i for i, t in enumerate(ids) if t in reserved), None) if reserved else None

    def adapt_messages(self, messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Make env messages (``format_observation(obs, "hf")``) renderable by this model.

        Media parts the model cannot take (:meth:`takes`) become a short text placeholder; text-only content collapses to a string, as text templates
        expect. Returns the messages and how many parts were replaced.
        """
        out: list[dict[str, Any]] = []
        replaced = 0
        for msg in messages:
            content = msg.get("content")
            if isinstance(content, list):
                parts: list[Any] = []
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind in MEDIA_KINDS and not self.takes(kind):
                        parts.append({"type": "text", "text": _placeholder(part)})
                        replaced += 1
                    else:
                        parts.append(part)
                if all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
                    content = "".join(p["text"] for p in parts)
                else:
                    content = parts
            out.append({**msg, "content": content if content is not None else ""})
        return out, replaced

    def screen_media(self, messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[MediaError]]:
        """Check each video and audio part of ``messages`` on its own; one that is corrupt or over
        its budget becomes a text part saying why, so the model reads an error observation and
        the episode goes on. Returns the messages and the errors, in render order."""
        errors: list[MediaError] = []
        out: list[dict[str, Any]] = []
        for msg in messages:
            content = msg.get("content")
            if not isinstance(content, list):
                out.append(msg)
                continue
            parts: list[Any] = []
            for part in content:
                error = self._clip_error(part) if isinstance(part, dict) else None
                if error is None:
                    parts.append(part)
                else:
                    errors.append(error)
                    parts.append({"type": "text", "text": f"[{error.kind} could not be used: {error.cause}]"})
            out.append({**msg, "content": parts})
        return out, errors

    def build_screened(self, build: Callable[[list[dict[str, Any]]], _Built], messages: list[dict[str, Any]],
                       on_errors: Callable[[list[MediaError]], None]) -> tuple[_Built, list[dict[str, Any]]]:
        """``build(messages)``; when a clip in them is corrupt or over its budget, ``on_errors``
        gets the clips' errors and ``build`` runs again with each replaced by its error text
        (:meth:`screen_media`). Returns the result and the messages it encodes. A MediaError no
        single clip causes (more clips than the budget) propagates."""
        try:
            return build(messages), messages
        except MediaError:
            screened, errors = self.screen_media(messages)
            if not errors:
                raise
            on_errors(errors)
            return build(screened), screened

    def _clip_error(self, part: dict[str, Any]) -> MediaError | None:
        """Why this video or audio part cannot reach the model, or None."""
        try:
            if part.get("type") == "video" and self.vision is not None and self.vision.video is not None:
                self.vision.video.prepare([(part["video"], float(part.get("fps") or 1.0))], self.encode)
            elif part.get("type") == "audio" and self.audio is not None:
                canonical_waveform(part["audio"], int(part.get("sampling_rate") or 16000), self.audio.sampling)
        except MediaError as exc:
            return exc
        return None

    @staticmethod
    def images_of(messages: Sequence[dict[str, Any]]) -> list[Any]:
        """The image objects of ``messages`` in the order their placeholders render."""
        images: list[Any] = []
        for msg in messages:
            content = msg.get("content")
            if isinstance(content, list):
                images.extend(p["image"] for p in content if isinstance(p, dict) and p.get("type") == "image")
        return images

    @staticmethod
    def videos_of(messages: Sequence[dict[str, Any]]) -> list[tuple[Any, float]]:
        """``(frames, fps)`` of the video parts of ``messages`` in the order they render."""
        clips: list[tuple[Any, float]] = []
        for msg in messages:
            content = msg.get("content")
            if isinstance(content, list):
                clips.extend((p["video"], float(p.get("fps") or 1.0)) for p in content
                             if isinstance(p, dict) and p.get("type") == "video")
        return clips

    @staticmethod
    def audios_of(messages: Sequence[dict[str, Any]]) -> list[tuple[Any, int]]:
        """``(waveform, sample_rate)`` of the audio parts of ``messages`` in render order."""
        return [(p["audio"], int(p.get("sampling_rate") or 16000)) for msg in messages
                if isinstance(msg.get("content"), list)
                for p in msg["content"] if isinstance(p, dict) and p.get("type") == "audio"]

    def _tokenize_rendered(self, text: str, images: list[Any], videos: list[tuple[Any, float]] | None = None,
                           audios: list[tuple[Any, int]] | None = None) -> Rendered:
        ids = self.encode(text)
        canonical: list[AudioPart] = []
        if audios and self.audio is not None:  # a corrupt or over-budget clip: MediaError (see screen_media)
            from relax_gym.audio import AudioInputError, expand_audio_tokens

            prepared = self.audio.prepare(audios)
            try:
                ids, _ = expand_audio_tokens(ids, prepared.counts, self.audio.audio_token_id)
            except AudioInputError as exc:
                raise TemplateError(str(exc)) from None
            canonical = [AudioPart(w, 16000) for w in prepared.waves]
        grids: list[list[int]] = []
        if images:
            if self.vision is None:
                raise TemplateError("images given to a model without an image processor")
            grids = self.vision.grids(images)
            counts = [image_token_count(g, self.vision.merge_size) for g in grids]
            try:
                ids = expand_image_tokens(ids, counts, self.vision.image_token_id)
            except VisionInputError as exc:
                raise TemplateError(str(exc)) from None
        rendered = Rendered(ids, text, list(images), grids, audios=canonical)
        if videos:
            self._add_videos(rendered, videos)
        return rendered

    def _add_videos(self, rendered: Rendered, videos: list[tuple[Any, float]]) -> None:
        """Sample the clips and expand their placeholders (a MediaError for a bad or over-budget
        clip propagates; :meth:`screen_media` finds which and replaces it with an error text)."""
        support = self.vision.video if self.vision is not None else None
        if support is None:
            raise TemplateError("videos given to a model without video support")
        prepared = support.prepare(videos, self.encode)
        rendered.ids, rendered.video_spans = expand_video_tokens(rendered.ids, prepared.expansions,
                                                                 support.video_token_id)
        rendered.videos = [VideoPart(c.frames, c.fps) for c in prepared.clips]
        rendered.video_grids = prepared.grids
        rendered.video_reduced = [r for c in prepared.clips for r in c.reduced]

    # -- the four rules -------------------------------------------------------------------------------
    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> Rendered:
        """The initial context: ``messages`` rendered with the generation prompt, image pads
        expanded to each image's patch count."""
        text = self.render(messages, tools=tools, add_generation_prompt=True)
        return self._tokenize_rendered(text, self.images_of(messages), self.videos_of(messages),
                                       self.audios_of(messages))

    def _derive_closing_glue(self) -> list[int]:
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render(msgs)
        if text.count(_SENTINEL) != 1:
            raise TemplateError("cannot find the assistant content in the template's render")
        return self.encode(text.split(_SENTINEL, 1)[1])

    def _derive_assistant_prefix(self) -> str:
        """Text the generation prompt adds beyond an assistant message's header -- e.g. Qwen3's
        ``<think>\\n\\n</think>\\n\\n`` with ``enable_thinking=False``. It belongs to the assistant's
        content: the template renders it (or drops it) as part of that message."""
        user = [{"role": "user", "content": "hi"}]
        base = self.render(user)
        generation_prompt = self.render(user, add_generation_prompt=True)
        around = self.render([*user, {"role": "assistant", "content": _SENTINEL}, {"role": "user", "content": "again"}])
        if not (generation_prompt.startswith(base) and around.startswith(base) and _SENTINEL in around):
            return ""
        header = around[len(base):].split(_SENTINEL, 1)[0]
        prompt_part = generation_prompt[len(base):]
        return prompt_part[len(header):] if prompt_part.startswith(header) else ""

    def split_segment(self, segment: Sequence[int]) -> tuple[int, list[int]]:
        """For a generated segment, return ``(k, glue)``: the segment's last ``k`` tokens already
        are the start of the closing glue (e.g. the sampled ``<|im_end|>``), and ``glue`` is the
        rest of it, to append with loss mask 0."""
        glue = self.closing_glue
        for k in range(min(len(glue), len(segment)), 0, -1):
            if list(segment[len(segment) - k:]) == glue[:k]:
                return k, glue[k:]
        return 0, list(glue)

    def observation_delta(self, new_messages: Sequence[dict[str, Any]],
                          tools: Sequence[dict[str, Any]] | None = None, *, tools_key: str | None = None) -> Rendered:
        """Tokens for new env/tool messages followed by the next generation prompt (with no new
        messages: the generation prompt alone).

        Render-and-trim against the first base conversation for which the prefix property holds
        (the render of base + new starts with the render of base). ``tools_key`` (see
        :meth:`tools_key`) saves serialising the tools again on every call.
        """
        if tools_key is None:
            tools_key = self.tools_key(tools)
        errors: list[str] = []
        for idx, base in enumerate(_BASES):
            key = (idx, tools_key)
            try:
                base_text = self._base_cache.get(key)
                if base_text is None:
                    base_text = self._base_cache[key] = self.render(base, tools=tools)
                full = self.render([*base, *new_messages], tools=tools, add_generation_prompt=True)
            except TemplateError as exc:
                errors.append(str(exc))
                continue
            if full.startswith(base_text):
                return self._tokenize_rendered(full[len(base_text):], self.images_of(new_messages),
                                               self.videos_of(new_messages), self.audios_of(new_messages))
            errors.append(f"base {idx}: prefix property does not hold")
        raise TemplateError("cannot render the observation as a delta: " + "; ".join(errors))

    # -- drift -----------------------------------------------------------------------------------------
    def expected_context(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                         *, keep_reasoning: bool) -> str:
        """The template's render of a whole conversation with the next generation prompt.

        With ``keep_reasoning`` each assistant message carries an explicit empty
        ``reasoning_content`` so templates that strip reasoning from earlier turns render the
        assistant text verbatim -- the render the ``keep`` policy's tokens follow.
        """
        msgs = [
            {**m, "reasoning_content": ""} if keep_reasoning and m.get("role") == "assistant" else m
            for m in messages
        ]
        return self.render(msgs, tools=tools, add_generation_prompt=True)

    def template_drops_reasoning(self, messages: Sequence[dict[str, Any]],
                                 tools: Sequence[dict[str, Any]] | None = None) -> bool:
        """Whether the template renders this conversation differently from the verbatim one
        (it drops earlier reasoning): the ``split`` policy's cue to start a new sample. A render
        that only re-spaces the ``<think>`` tags drops nothing and does not count."""
        return normalize_think_whitespace(self.expected_context(messages, tools, keep_reasoning=False)) != \
            normalize_think_whitespace(self.expected_context(messages, tools, keep_reasoning=True))

    def check_drift(self, context_ids: Sequence[int], messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None, *, policy: ThinkPolicy) -> DriftReport:
        """Compare incrementally built context tokens with a full re-render of ``messages``.

        ``context_ids`` are the tokens up to the last generation prompt and ``messages`` the
        conversation they encode (assistant messages hold the raw generated text). The check is
        on text (our ids decoded, image-pad runs collapsed), because sampled tokens need not be
        the canonical tokenization of their text; env and glue tokens come from the tokenizer, so
        equal text means equal tokens there.
        """
        ours = self.decode(self._collapse_images(context_ids))
        if self.vision is not None and self.vision.video is not None:
            ours = collapse_video_text(ours)
        try:
            plain = self.expected_context(messages, tools, keep_reasoning=False)
            if ours == plain:
                return DriftReport(kind="none", expected=True)
            kept = self.expected_context(messages, tools, keep_reasoning=True)
        except TemplateError as exc:
            return DriftReport(kind="template", expected=False, detail=f"re-render failed: {exc}")
        if normalize_think_whitespace(ours) == normalize_think_whitespace(plain):
            return DriftReport(kind="think_whitespace", expected=True,
                               mismatched_chunks=_count_diff_regions(ours, plain),
                               first_mismatch_token=self._first_token_mismatch(context_ids, plain),
                               detail="the template re-spaces <think> tags; no text differs")
        if ours == kept or normalize_think_whitespace(ours) == normalize_think_whitespace(kept):
            return DriftReport(kind="think_dropped", expected=policy == "keep",
                               mismatched_chunks=_count_diff_regions(ours, plain),
                               first_mismatch_token=self._first_token_mismatch(context_ids, plain),
                               detail="the template drops reasoning of earlier turns; the tokens keep it")
        return DriftReport(kind="template", expected=False, mismatched_chunks=_count_diff_regions(ours, plain),
                           first_mismatch_token=self._first_token_mismatch(context_ids, plain),
                           detail=_first_diff(ours, plain))

    def _collapse_images(self, ids: Sequence[int]) -> list[int]:
        ids = collapse_image_tokens(ids, self.vision.image_token_id if self.vision is not None else None)
        return collapse_audio_tokens(ids, self.audio.audio_token_id) if self.audio is not None else ids

    def _first_token_mismatch(self, context_ids: Sequence[int], text: str) -> int | None:
        ref = self.encode(text)
        ours = self._collapse_images(context_ids)
        for i, (a, b) in enumerate(zip(ours, ref)):
            if a != b:
                return i
        return None if len(ours) == len(ref) else min(len(ours), len(ref))


@dataclass(slots=True)
class Reply:
    """What one generated segment added to a :class:`ChatContext`."""

    glue: list[int]  # closing-glue tokens appended after the segment (not sampled)
    text: str  # the segment's content as written, special tokens kept (what the context encodes)
    action_text: str  # the same without special tokens: what the env is given


class ChatContext:
    """One episode's context as token ids, built append-only by the rules of the module docstring.

    This is what the engine is sent on every turn -- by the rollout manager and by the eval
    agents alike -- and what a training sample holds. ``messages`` are the template messages the
    ids encode (assistant messages hold the raw generated text); ``images`` (RGB), ``grids`` and
    ``payloads`` (PNG data URLs for the engine's ``image_data``) follow the image placeholders in
    order. The first list of tools stays in the prompt for the whole episode.
    """

    def __init__(self, codec: ChatCodec, messages: Sequence[dict[str, Any]],
                 tools: Sequence[dict[str, Any]] | None = None, *, system_prompt: str | None = None) -> None:
        self.codec = codec
        self.tools: list[dict[str, Any]] = list(tools or [])
        self._tools_key = codec.tools_key(self.tools)
        first = list(messages)
        if system_prompt and not any(m.get("role") == "system" for m in first):
            first.insert(0, {"role": "system", "content": system_prompt})
        self.ids: list[int] = []
        self.messages: list[dict[str, Any]] = []
        self.images: list[ImagePart] = []
        self.grids: list[list[int]] = []
        self.payloads: list[str] = []
        self.videos: list[VideoPart] = []  # sampled frames; ``video_payloads`` decode to exactly these
        self.video_grids: list[list[int]] = []
        self.video_payloads: list[str] = []
        self.video_spans: list[tuple[int, int]] = []  # each video's expanded tokens in ``ids``
        self.video_reduced: list[str] = []
        self.audios: list[AudioPart] = []  # canonical clips; ``audio_payloads`` decode to exactly these
        self.audio_payloads: list[str] = []
        self._generation_prompt_at = (0, 0)  # (len(ids), len(messages)) at the last generation prompt
        self.extend(codec.prompt(first, self.tools), first)
        self.prompt_length = len(self.ids)

    def extend(self, rendered: Rendered, messages: Sequence[dict[str, Any]]) -> None:
        """Append a prompt or an observation delta (it ends at a generation prompt) and the
        messages it encodes."""
        offset = len(self.ids)
        self.ids.extend(rendered.ids)
        self.messages.extend(messages)
        for image, grid in zip(rendered.images, rendered.grids, strict=True):
            rgb = image.convert("RGB")
            self.images.append(ImagePart(rgb))
            self.grids.append(grid)
            self.payloads.append(_png_url(rgb))
        for clip, vgrid, (start, end) in zip(rendered.videos, rendered.video_grids, rendered.video_spans, strict=True):
            self.videos.append(clip)
            self.video_grids.append(vgrid)
            self.video_payloads.append(video_payload(clip.frames, clip.fps))
            self.video_spans.append((offset + start, offset + end))
        self.video_reduced.extend(rendered.video_reduced)
        self.audios.extend(rendered.audios)
        self.audio_payloads.extend(audio_payload(a.waveform) for a in rendered.audios)
        self._generation_prompt_at = (len(self.ids), len(self.messages))

    def observation(self, messages: Sequence[dict[str, Any]]) -> Rendered:
        """The delta for new env/tool messages (adapted with :meth:`ChatCodec.adapt_messages`),
        not yet appended: a caller that bounds the length looks at it first."""
        return self.codec.observation_delta(messages, self.tools, tools_key=self._tools_key)

    def add_observation(self, messages: Sequence[dict[str, Any]]) -> Rendered:
        """Render and append the delta for new env/tool messages."""
        delta = self.observation(messages)
        self.extend(delta, messages)
        return delta

    def add_reply(self, segment: Sequence[int]) -> Reply:
        """Append a generated segment as sampled, then the closing glue it lacks."""
        overlap, glue = self.codec.split_segment(segment)
        content = list(segment[: len(segment) - overlap])
        text = self.codec.decode(content)
        self.ids.extend(segment)
        self.ids.extend(glue)
        self.messages.append({"role": "assistant", "content": self.codec.assistant_prefix + text})
        return Reply(glue, text, self.codec.action_text(content))

    def drops_reasoning(self, new_messages: Sequence[dict[str, Any]]) -> bool:
        """Would the template render the context plus ``new_messages`` other than verbatim (it
        drops earlier reasoning)? The ``split`` policy's cue to start a new sample."""
        try:
            return self.codec.template_drops_reasoning([*self.messages, *new_messages], self.tools)
        except TemplateError:
            return False

    def check_drift(self, policy: ThinkPolicy = "keep") -> DriftReport:
        """The context up to its last generation prompt against a full re-render of its messages."""
        end, count = self._generation_prompt_at
        return self.codec.check_drift(self.ids[:end], self.messages[:count], self.tools, policy=policy)


# Base conversations for render-and-trim, tried in a fixed order so a delta never depends on the
# episode's history. The first ends with an assistant turn (with reasoning, which Qwen3 keeps
# before tool results), as a real conversation does; the second is the minimal fallback for
# templates that re-render that turn once a new user query follows.
_BASES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "user", "content": "base"},
     {"role": "assistant", "content": "<think>\nbase\n</think>\n\nbase", "reasoning_content": "base"}],
    [{"role": "user", "content": "base"}],
)


def _compile(template: str) -> Any | None:
    """transformers' compiled template (same sandbox, filters and globals as apply_chat_template),
    about 5x faster than apply_chat_template per call, recompiled in a private overlay of its
    sandbox whose attribute checks are memoized (:func:`_memoized_attribute_check`: 40% less CPU
    per render); None falls back to the public API. Its globals are flattened into one dict:
    jinja keeps them as a ChainMap over the environment's, which every render copied key by key
    in Python (nothing changes the overlay's globals after this)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        sandbox = _compile_jinja_template(template).environment.overlay()
        sandbox.is_safe_attribute = _memoized_attribute_check(sandbox.is_safe_attribute)
        compiled = sandbox.from_string(template)
        compiled.globals = dict(compiled.globals)
        return compiled
    except Exception:  # noqa: BLE001 # pragma: no cover - depends on the transformers version
        return None


def _memoized_attribute_check(check: Callable[[Any, str, Any], bool]) -> Callable[[Any, str, Any], bool]:
    """jinja's immutable sandbox asks ``is_safe_attribute`` on every attribute a template reads
    (``message.content``, ``content.split`` ...), and the answer costs a dozen ``isinstance``
    checks against ABCs; most of a render's CPU went there. The answer depends only on the
    object's type and the attribute's name (a leading underscore, a function's or frame's
    internals, a mutating method of a mutable container), so it is computed once per pair."""
    verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = verdicts.get(key)
        if verdict is None:
            verdict = verdicts[key] = bool(check(obj, attr, value))
        return verdict

    return is_safe_attribute


class _PieceEncoder:
    """``encode`` for a fast tokenizer, cached piece by piece.

    A tokenizer cuts its input at added tokens (``<|im_start|>``, ``<tool_call>`` ...) before
    anything else and encodes the pieces between them independently, so encoding each piece and
    joining the ids gives the same ids. Most pieces of rendered chat context recur (the system
    prompt with the tool list, role headers, the empty think block), so their ids come from a
    bounded cache and only new text (an env's observation, a user query) is tokenized. Used only
    where that holds: every added token matched verbatim (not normalized, no strip, not
    single-word), checked on a probe like :func:`_fast_backend`.
    """

    def __init__(self, backend: Any, added: dict[str, int], cache_size: int = 4096) -> None:
        self._added = added
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)) + ")")
        self._piece = functools.lru_cache(maxsize=cache_size)(
            lambda piece: tuple(backend.encode(piece, add_special_tokens=False).ids))

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, backend: Any | None) -> _PieceEncoder | None:
        tokens = list(getattr(tokenizer, "added_tokens_decoder", {}).items())
        if backend is None or not tokens:
            return None
        if any(t.normalized or t.lstrip or t.rstrip or t.single_word for _, t in tokens):
            return None
        pieces = cls(backend, {t.content: int(i) for i, t in tokens})
        probe = ("<|im_start|>system\nhé 12 <think>x</think>\n\n{\"a\": [1, 2]}<|im_end|>\n"
                 + "".join(f" {t.content}x{t.content}" for _, t in tokens))
        same = pieces.encode(probe) == list(backend.encode(probe, add_special_tokens=False).ids)
        return pieces if same else None

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if not piece:
                continue
            token = self._added.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._piece(piece))
        return ids


def _fast_backend(tokenizer: Any) -> Any | None:
    """The Rust ``tokenizers.Tokenizer`` behind a fast HF tokenizer, used directly (about 30% less
    CPU per call than the HF wrapper) when the wrapper adds nothing to encode/decode: no
    tokenization-space clean-up and no special-token splitting. None otherwise."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    if getattr(tokenizer, "split_special_tokens", False):
        return None
    probe = "<|im_start|>user\nhé 12 <think>x</think>\n\n"
    try:
        same = backend.encode(probe, add_special_tokens=False).ids == tokenizer.encode(probe, add_special_tokens=False)
    except Exception:  # noqa: BLE001
        return None
    return backend if same else None


def _video_support(folder: Path, image_processor: Any, video_token_id: int, sampling: Any | None) -> VideoSupport | None:
    """Video support for a Qwen3-VL folder (its timestamped placeholders are what
    :mod:`relax_gym.video` builds); None for other Qwen-VL families."""
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None
    if model_type != "qwen3_vl":
        return None
    from relax_gym.video import VideoProcessor, VideoSampling

    return VideoSupport(VideoProcessor.from_image_processor(image_processor), sampling or VideoSampling(),
                        int(video_token_id))


def _audio_support(folder: Path, tokenizer: Any, sampling: Any | None) -> AudioSupport | None:
    """Audio support for an omni folder (the Qwen3-Omni thinker); None for any other model."""
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError):
        return None
    from relax_gym.audio import OMNI_MODEL_TYPES

    if model_type not in OMNI_MODEL_TYPES:
        return None
    from transformers import AutoConfig

    return AudioSupport.from_folder(folder, AutoConfig.from_pretrained(str(folder)), tokenizer, sampling)


#: PNG data URLs by image content: a GRPO group's samples send one image G times
_PNG_URLS: ContentCache[str] = ContentCache(4096, max_bytes=64 << 20, size_of=len)


def _png_url(rgb: Any) -> str:
    return _PNG_URLS.get_or_make(image_digest(rgb), lambda: image_to_data_url(rgb))


def _placeholder(part: dict[str, Any]) -> str:
    kind = part.get("type", "media")
    if kind == "image" and hasattr(part.get("image"), "size"):
        w, h = part["image"].size
        return f"[image: {w}x{h}]"
    if kind == "audio" and part.get("sampling_rate"):
        return f"[audio: {len(part.get('audio', [])) / float(part['sampling_rate']):.2f} s]"
    if kind == "video" and hasattr(part.get("video"), "shape"):
        return f"[video: {part['video'].shape[0]} frames]"
    return f"[{kind}]"


def _count_diff_regions(a: str, b: str) -> int:
    import difflib

    return sum(1 for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal")


def _first_diff(a: str, b: str) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at char {i}: tokens {a[max(0, i - 20):i + 40]!r} vs render {b[max(0, i - 20):i + 40]!r}"


__all__ = [
    "MEDIA_KINDS",
    "ChatCodec",
    "ChatContext",
    "DriftReport",
    "Rendered",
    "Reply",
    "TemplateError",
    "ThinkPolicy",
    "VisionSupport",
]
