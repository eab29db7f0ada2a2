"""Audio for an omni model (the Qwen3-Omni thinker): waveforms to placeholder tokens and features.

Qwen3-Omni's processor turns each audio clip into log-mel features (Whisper's feature extractor,
16 kHz, 10 ms hop) and replaces the template's single ``<|audio_pad|>`` by as many pads as the
audio encoder emits for that clip: :func:`audio_token_count` (1 s of audio -> 13 tokens). This
module does those steps once, for the chat codec (rollout and eval), the embedded engine and the
trainer, so the three agree token for token and feature for feature:

* a clip is resampled to 16 kHz, checked against the budget (:class:`AudioSampling`) and kept as
  that *canonical* waveform: the trajectory stores it and the engine is sent it losslessly
  (float32 WAV, :func:`audio_payload`), so the engine and the trainer compute features from the
  same samples;
* features are computed **per clip** (the Whisper extractor pads a batch with zeros, which
  changes the last frames of a shorter clip; per clip they depend on the clip alone) and padded
  to a batch with a ``feature_attention_mask`` (:func:`batch_features`).

Only numpy (and PIL, through the token-run helpers of relax_gym.vision) at import time;
transformers is loaded when a feature extractor is built.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.content_cache import ContentCache
from relax_gym.errors import MediaError, RelaxGymError
from relax_gym.vision import collapse_runs, token_runs

AUDIO_TOKEN = "<|audio_pad|>"
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"
SAMPLE_RATE = 16_000  # what Qwen3-Omni's (Whisper) feature extractor reads
HOP_LENGTH = 160  # samples per feature frame (10 ms)
OMNI_MODEL_TYPES = frozenset({"qwen3_omni_moe_thinker"})
_DATA_URL = re.compile(r"^data:[^,]*;base64,", re.IGNORECASE)


class AudioInputError(RelaxGymError, ValueError):
    """The prompt's audio placeholders and the clips given do not fit together."""


class AudioBudgetError(MediaError):
    """A clip is over the configured duration budget and is refused (``reason`` is counted)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__("audio", "<clip>", detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AudioSampling:
    """How an audio observation is bounded before it reaches the model (``model.audio`` in a
    config): clips longer than ``max_seconds`` are refused (the model reads an error text in
    their place, counted), at most ``max_clips`` per request."""

    max_seconds: float = 30.0
    max_clips: int = 8


@dataclass(frozen=True, slots=True)
class AudioTokens:
    """Marker ids of an omni model and its audio encoder's window (``n_window``)."""

    audio_token_id: int
    audio_start_token_id: int
    audio_end_token_id: int
    n_window: int = 50

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any | None = None) -> AudioTokens:
        end = getattr(config, "audio_end_token_id", None)
        if end is None and tokenizer is not None:
            end = tokenizer.convert_tokens_to_ids(AUDIO_END)
        audio_cfg = getattr(config, "audio_config", None)
        return cls(int(config.audio_token_id), int(config.audio_start_token_id), int(end if end is not None else -1),
                   int(getattr(audio_cfg, "n_window", 50) or 50))

    @property
    def reserved(self) -> frozenset[int]:
        return frozenset(t for t in (self.audio_token_id, self.audio_start_token_id, self.audio_end_token_id) if t >= 0)


def is_omni(config: Any) -> bool:
    """Does this HF config describe a model that hears (the Qwen3-Omni thinker)?"""
    return str(getattr(config, "model_type", "")) in OMNI_MODEL_TYPES


def feature_frames(num_samples: int) -> int:
    """Feature frames the Whisper extractor gives one clip of ``num_samples`` (its mask's sum)."""
    return int(num_samples) // HOP_LENGTH


def audio_token_count(frames: int, n_window: int = 50) -> int:
    """Audio-encoder outputs (= ``<|audio_pad|>`` tokens) for ``frames`` feature frames: the
    encoder reads windows of ``2 * n_window`` frames, each downsampled 8x by three strided convs
    (the rule of transformers' ``_get_feat_extract_output_lengths``)."""
    chunk = n_window * 2
    rest = frames % chunk
    out = (rest - 1) // 2 + 1
    out = ((out - 1) // 2 + 1 - 1) // 2 + 1
    return int(out + (frames // chunk) * 13)


def canonical_waveform(wave: Any, sample_rate: int, sampling: AudioSampling) -> np.ndarray:
    """The 16 kHz float32 waveform the model hears, or a MediaError (corrupt, over budget)."""
    from relax_gym.media import resample_audio

    arr = np.asarray(wave, dtype=np.float32)
    if arr.ndim != 1 or arr.size == 0:
        raise MediaError("audio", "<clip>", f"expected a non-empty mono waveform, got shape {arr.shape}")
    if int(sample_rate) <= 0:
        raise MediaError("audio", "<clip>", f"invalid sample rate {sample_rate}")
    if not np.all(np.isfinite(arr)):
        raise MediaError("audio", "<clip>", "audio holds NaN or infinite samples")
    seconds = arr.size / float(sample_rate)
    if seconds > sampling.max_seconds:
        raise AudioBudgetError("duration", f"{seconds:.1f} s of audio exceed max_seconds {sampling.max_seconds:g}")
    if int(sample_rate) != SAMPLE_RATE:
        arr = resample_audio(arr, int(sample_rate), SAMPLE_RATE)
    if feature_frames(arr.size) < 1:
        raise MediaError("audio", "<clip>", f"clip too short: {arr.size} samples at 16 kHz")
    return np.ascontiguousarray(np.clip(arr, -1.0, 1.0), dtype=np.float32)


def load_feature_extractor(folder: str | Path | None = None, num_mel_bins: int = 128) -> Any:
    """Whisper's feature extractor as saved beside an omni model (``preprocessor_config.json``),
    or a default one with ``num_mel_bins`` mel bins."""
    from transformers import WhisperFeatureExtractor

    if folder is not None:
        cfg = Path(folder) / "preprocessor_config.json"
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        keys = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value", "dither")
        kwargs = {k: data[k] for k in keys if k in data}
        if kwargs:
            return WhisperFeatureExtractor(**kwargs)
    return WhisperFeatureExtractor(feature_size=num_mel_bins)


_DEFAULT_EXTRACTORS: dict[int, Any] = {}


def default_extractor(num_mel_bins: int = 128) -> Any:
    """A shared default Whisper extractor (what the tiny omni builder saves)."""
    if num_mel_bins not in _DEFAULT_EXTRACTORS:
        _DEFAULT_EXTRACTORS[num_mel_bins] = load_feature_extractor(None, num_mel_bins)
    return _DEFAULT_EXTRACTORS[num_mel_bins]


def clip_features(extractor: Any, wave: np.ndarray) -> np.ndarray:
    """``[mel, frames]`` log-mel features of one 16 kHz clip (computed alone: see the module doc)."""
    out = extractor([np.asarray(wave, dtype=np.float32)], sampling_rate=SAMPLE_RATE, padding=True, truncation=False,
                    return_attention_mask=True, return_tensors="np")
    frames = int(out["attention_mask"][0].sum())
    return np.asarray(out["input_features"][0][:, :frames], dtype=np.float32)


def batch_features(extractor: Any, waves: Sequence[np.ndarray]) -> dict[str, Any]:
    """``input_features [N, mel, T]`` and ``feature_attention_mask [N, T]`` (torch) for clips."""
    return pad_features([clip_features(extractor, w) for w in waves])


def pad_features(feats: Sequence[Any]) -> dict[str, Any]:
    """Stack per-clip ``[mel, frames]`` features (numpy or torch) zero-padded to the longest."""
    import torch

    tensors = [torch.as_tensor(f, dtype=torch.float32) for f in feats]
    width = max(int(t.shape[-1]) for t in tensors)
    out = torch.zeros((len(tensors), int(tensors[0].shape[0]), width), dtype=torch.float32)
    mask = torch.zeros((len(tensors), width), dtype=torch.long)
    for i, t in enumerate(tensors):
        out[i, :, : t.shape[-1]] = t
        mask[i, : t.shape[-1]] = 1
    return {"input_features": out, "feature_attention_mask": mask}


def cat_features(parts: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """Concatenate several ``(input_features, feature_attention_mask)`` batches (different widths)."""
    import torch

    width = max(int(f.shape[-1]) for f, _ in parts)
    feats = [torch.nn.functional.pad(f, (0, width - int(f.shape[-1]))) for f, _ in parts]
    masks = [torch.nn.functional.pad(m, (0, width - int(m.shape[-1]))) for _, m in parts]
    return {"input_features": torch.cat(feats, 0), "feature_attention_mask": torch.cat(masks, 0)}


def expand_audio_tokens(ids: Sequence[int], counts: Sequence[int], audio_token_id: int
                        ) -> tuple[list[int], list[tuple[int, int]]]:
    """Expand each run of ``<|audio_pad|>`` to its clip's token count; a run already of that
    length is kept (an engine may be sent either form). Returns the ids and each clip's span."""
    runs = token_runs(ids, audio_token_id)
    if len(runs) != len(counts):
        raise AudioInputError(f"the prompt holds {len(runs)} {AUDIO_TOKEN} placeholder(s) but {len(counts)} "
                              "audio clip(s) were given")
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    prev = 0
    for (start, end), n in zip(runs, counts, strict=True):
        if end - start not in (1, n):
            raise AudioInputError(f"a run of {end - start} {AUDIO_TOKEN} tokens fits neither one pad nor the "
                                  f"clip's {n} tokens")
        out.extend(ids[prev:start])
        spans.append((len(out), len(out) + n))
        out.extend([audio_token_id] * n)
        prev = end
    out.extend(ids[prev:])
    return out, spans


def collapse_audio_tokens(ids: Sequence[int], audio_token_id: int | None) -> list[int]:
    """One ``<|audio_pad|>`` per run, as the chat template renders it (what SGLang expands)."""
    return collapse_runs(ids, audio_token_id)


_PAYLOADS: ContentCache[str] = ContentCache(256)  # clips


def audio_payload(wave: np.ndarray) -> str:
    """A 16 kHz clip as a float32 WAV data URL: lossless, so the engine decodes exactly the
    samples the trainer keeps (16-bit PCM would not round-trip). Cached by content: a GRPO group
    sends one clip several times."""
    arr = np.ascontiguousarray(wave, dtype=np.float32)
    return _PAYLOADS.get_or_make(hashlib.sha1(arr.tobytes()).digest(), lambda: _wav_data_url(arr))


def _wav_data_url(arr: np.ndarray) -> str:
    try:
        import soundfile as sf
    except ImportError:
        raise MediaError("audio", "<clip>", "sending audio to a model needs soundfile: "
                         "pip install 'relax-gym[audio]'") from None
    buf = io.BytesIO()
    sf.write(buf, arr, SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def decode_audio_item(item: Any, *, max_bytes: int, max_seconds: float) -> np.ndarray:
    """One ``audio_data`` entry (data URL or bare base64; never a URL or path) to a canonical
    16 kHz waveform, or a MediaError saying why not."""
    from relax_gym.media import MediaLimits, load_audio

    if not isinstance(item, str) or not item:
        raise MediaError("audio", "<audio_data>", "expected a non-empty base64 string or data URL")
    if re.match(r"^[a-z][a-z0-9+.-]*://", item, re.IGNORECASE) or item.startswith("/"):
        raise MediaError("audio", "<audio_data>", "URLs and paths are not fetched; send base64 or a data URL")
    source = item if _DATA_URL.match(item) else "data:application/octet-stream;base64," + item
    limits = MediaLimits(max_bytes=max_bytes, max_audio_seconds=max_seconds)
    wave, _ = load_audio(source, sample_rate=SAMPLE_RATE, limits=limits)
    return canonical_waveform(wave, SAMPLE_RATE, AudioSampling(max_seconds=max_seconds))


@dataclass(slots=True)
class PreparedAudio:
    waves: list[np.ndarray] = field(default_factory=list)  # canonical 16 kHz clips
    counts: list[int] = field(default_factory=list)  # placeholder tokens per clip


@dataclass(slots=True)
class AudioSupport:
    """What an omni model needs to hear: its feature extractor, marker ids and the budget."""

    extractor: Any
    tokens: AudioTokens
    sampling: AudioSampling = field(default_factory=AudioSampling)

    @classmethod
    def from_folder(cls, folder: str | Path, config: Any, tokenizer: Any | None = None,
                    sampling: AudioSampling | None = None) -> AudioSupport:
        mel = int(getattr(getattr(config, "audio_config", None), "num_mel_bins", 128) or 128)
        return cls(load_feature_extractor(folder, mel), AudioTokens.from_config(config, tokenizer),
                   sampling or AudioSampling())

    @property
    def audio_token_id(self) -> int:
        return self.tokens.audio_token_id

    def prepare(self, clips: Sequence[tuple[Any, int]]) -> PreparedAudio:
        """Canonical waveforms and token counts of ``(waveform, sample_rate)`` clips; a corrupt
        or over-budget clip raises a MediaError (the rollout puts an error text in its place)."""
        if len(clips) > self.sampling.max_clips:
            raise AudioBudgetError("clips", f"{len(clips)} audio clips exceed max_clips {self.sampling.max_clips}")
        out = PreparedAudio()
        for wave, sr in clips:
            canon = canonical_waveform(wave, sr, self.sampling)
            out.waves.append(canon)
            out.counts.append(audio_token_count(feature_frames(canon.size), self.tokens.n_window))
        return out

    def features(self, waves: Sequence[np.ndarray]) -> dict[str, Any]:
        return batch_features(self.extractor, waves)


__all__ = [
    "AUDIO_END", "AUDIO_START", "AUDIO_TOKEN", "SAMPLE_RATE", "AudioBudgetError", "AudioInputError",
    "AudioSampling", "AudioSupport", "AudioTokens", "PreparedAudio", "audio_payload", "audio_token_count",
    "batch_features", "canonical_waveform", "cat_features", "clip_features", "collapse_audio_tokens",
    "decode_audio_item", "default_extractor", "expand_audio_tokens", "feature_frames", "is_omni", "load_feature_extractor",
    "pad_features",
]
