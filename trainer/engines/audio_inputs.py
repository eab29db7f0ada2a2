"""``audio_data`` for the embedded engine: decode, check, expand placeholders, compute features.

SGLang's ``/generate`` takes ``audio_data`` (one entry per ``<|audio_pad|>`` in the prompt) for
omni models. Here an entry is a data URL or bare base64 (never a URL or a path); the count and
encoded size are checked before anything is decoded, the duration from the header while
decoding (:func:`relax_gym.media.load_audio`). Each clip becomes the canonical 16 kHz waveform
the rollout's codec keeps (:mod:`relax_gym.audio`), so the engine's features are the trainer's.
A prompt may carry one pad per clip (as the template renders it) or the expanded run.
"""

from __future__ import annotations

from typing import Any

from relax_gym.audio import AudioInputError, AudioSupport, decode_audio_item, expand_audio_tokens
from relax_gym.errors import MediaError


NO_AUDIO_SUPPORT = "audio_data was given but the served model takes no audio (a Qwen3-Omni thinker does)"


def audio_inputs(ids: list[int], items: list[Any] | None, support: AudioSupport | None, limits: Any,
                 bad_request: type[Exception]) -> tuple[list[int], dict[str, Any] | None]:
    """Expanded ids and ``input_features`` / ``feature_attention_mask`` for a request's audio,
    or the ids unchanged and None when it has none; bad input raises ``bad_request``. The count
    and encoded sizes are checked before (``prepare.check_raw_audios``)."""
    if support is None:
        if items:
            raise bad_request(NO_AUDIO_SUPPORT)
        return ids, None
    items = list(items or [])
    if not items and support.audio_token_id not in ids:
        return ids, None
    waves = []
    for k, item in enumerate(items):
        try:
            waves.append(decode_audio_item(item, max_bytes=limits.max_audio_bytes,
                                           max_seconds=limits.max_audio_seconds))
        except MediaError as exc:
            raise bad_request(f"audio_data[{k}]: {exc.cause}") from None
    try:
        prepared = support.prepare([(w, 16000) for w in waves])
        ids, _ = expand_audio_tokens(ids, prepared.counts, support.audio_token_id)
    except (AudioInputError, MediaError) as exc:
        raise bad_request(f"audio_data: {getattr(exc, 'cause', exc)}") from None
    return ids, support.features(prepared.waves)


__all__ = ["NO_AUDIO_SUPPORT", "audio_inputs"]
