from __future__ import annotations

import base64
import builtins
import io
import wave

import numpy as np
import pytest
from PIL import Image

from relax_gym import MediaError
from relax_gym import media


def _png() -> bytes:
    img = Image.new("RGB", (16, 12), (10, 200, 30))
    img.putpixel((3, 4), (255, 0, 0))
    return media.encode_image(img)


def test_image_round_trip_all_sources(tmp_path) -> None:
    data = _png()
    path = tmp_path / "x.png"
    path.write_bytes(data)
    b64 = base64.b64encode(data).decode()
    url = media.to_data_url(data, "png")
    images = [media.load_image(src) for src in (data, str(path), path, b64, url, bytearray(data))]
    for img in images:
        assert img.size == (16, 12) and img.getpixel((3, 4)) == (255, 0, 0)
    assert media.encode_image(images[0]) == data  # PNG encoding is deterministic


@pytest.mark.parametrize(
    "src, cause",
    [
        (_png()[:60], "corrupt or truncated"),
        (b"\x00\x01garbage" * 10, "not a recognised image"),
        (b"", "empty"),
        (12345, "expected bytes"),
        ("definitely not base64!!", "neither an existing file path nor valid base64"),
        ("missing/file.png", "no such file"),
        ("data:image/png,notbase64", "not base64-encoded"),
    ],
)
def test_broken_images_raise_media_error(src, cause) -> None:
    with pytest.raises(MediaError, match=cause) as info:
        media.load_image(src)
    assert info.value.kind == "image"
    assert "cannot read image from" in str(info.value)


def _tone(sr: int = 16000, secs: float = 0.25) -> np.ndarray:
    t = np.arange(int(sr * secs)) / sr
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_audio_wav_and_flac_round_trip() -> None:
    wave_in = _tone()
    for fmt in ("wav", "flac"):
        data = media.encode_audio(wave_in, 16000, fmt)
        out, sr = media.load_audio(data)
        assert sr == 16000 and out.dtype == np.float32 and out.shape == wave_in.shape
        assert np.max(np.abs(out - wave_in)) < 1e-3  # 16-bit quantisation


def test_audio_resampling_and_stereo_downmix() -> None:
    buf = io.BytesIO()
    stereo = np.stack([_tone(), _tone()], axis=1)
    pcm = (stereo * 32767).astype("<i2")
    with wave.open(buf, "wb") as wf:
        wf.setnchannels(2)
        wf.setsampwidth(2)
        wf.setframerate(16000)
        wf.writeframes(pcm.tobytes())
    out, sr = media.load_audio(buf.getvalue(), sample_rate=8000)
    assert sr == 8000 and out.ndim == 1 and abs(len(out) - 2000) <= 1
    # the resampled tone keeps its frequency: zero crossings ~ 2 * 440 * 0.25 s
    crossings = np.sum(np.diff(np.signbit(out)) != 0)
    assert 200 <= crossings <= 240


def test_audio_without_soundfile_uses_stdlib(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_soundfile(name, *args, **kwargs):
        if name == "soundfile":
            raise ImportError("simulated missing soundfile")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_soundfile)
    data = media.encode_audio(_tone(), 16000, "wav")
    out, sr = media.load_audio(data)
    assert sr == 16000 and len(out) == 4000
    with pytest.raises(MediaError, match="truncated"):
        media.load_audio(data[: len(data) // 2])
    with pytest.raises(MediaError, match="needs soundfile"):
        media.encode_audio(_tone(), 16000, "flac")


@pytest.mark.parametrize(
    "make_src, cause",
    [
        (lambda: media.encode_audio(_tone(), 16000)[:30], "not a readable|truncated"),
        (lambda: media.encode_audio(_tone(), 16000)[: 44 + 1000], "truncated"),
        (lambda: b"RIFF1234WAVEjunkjunkjunk" * 4, "not a readable|malformed"),
        (lambda: b"\x00garbage that is no audio" * 8, "not a readable"),
        (lambda: 3.14, "expected bytes"),
    ],
)
def test_broken_audio_raises_media_error(make_src, cause) -> None:
    with pytest.raises(MediaError, match=cause) as info:
        media.load_audio(make_src())
    assert info.value.kind == "audio"


def _frames(t: int = 12, h: int = 32, w: int = 48) -> np.ndarray:
    frames = np.zeros((t, h, w, 3), np.uint8)
    for i in range(t):
        frames[i, :, : (i + 1) * w // t] = 200
    return frames


def test_video_round_trip_and_sampling() -> None:
    frames = _frames()
    data = media.encode_video(frames, fps=6.0)
    assert data == media.encode_video(frames, fps=6.0), "encoding must be deterministic"
    out, fps = media.load_video(data)
    assert out.shape == frames.shape and fps == pytest.approx(6.0)
    assert np.abs(out.astype(int) - frames.astype(int)).mean() < 8  # lossy but close
    half, fps_half = media.load_video(data, fps=3.0)
    assert half.shape[0] == 6 and fps_half == pytest.approx(3.0)
    few, _ = media.load_video(data, max_frames=4)
    assert few.shape[0] == 4
    odd = media.encode_video(_frames(h=31, w=47), fps=4.0)  # odd sizes are padded for yuv420p
    assert media.load_video(odd)[0].shape[1:3] == (32, 48)


def test_encoded_videos_are_memoised_by_content(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    real = media._encode_video

    def counting(arr: np.ndarray, fps: float) -> bytes:
        calls.append(arr.shape)
        return real(arr, fps)

    monkeypatch.setattr(media, "_encode_video", counting)
    monkeypatch.setattr(media, "_ENCODED_VIDEOS", media.ContentCache(2))
    a, b = _frames(), _frames()
    b[:, :8, :8] = (255, 0, 0)  # a red corner
    first = media.encode_video(a, 6.0)
    assert media.encode_video(a.copy(), 6.0) is first and len(calls) == 1  # same content: no re-encode
    assert media.encode_video(b, 6.0) != first and len(calls) == 2  # other content: encoded
    assert media.encode_video(a, 5.0) != first and len(calls) == 3  # fps is part of the key
    media.encode_video(a, 6.0)  # evicted by the bound of 2: encoded again
    assert len(calls) == 4 and len(media._ENCODED_VIDEOS) == 2


def test_sample_frame_indices() -> None:
    assert media.sample_frame_indices(0, 30.0) == []
    assert media.sample_frame_indices(10, 10.0, fps=5.0) == [0, 2, 4, 6, 8]
    assert media.sample_frame_indices(10, 10.0, max_frames=3) == [0, 4, 9]
    assert media.sample_frame_indices(10, 10.0, fps=20.0) == list(range(10))


@pytest.mark.parametrize(
    "make_src, cause",
    [
        (lambda: media.encode_video(_frames(), 6.0)[:200], "corrupt|zero frames|no video"),
        (lambda: b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, "corrupt|zero frames|no video"),
        (lambda: b"not a video at all" * 10, "corrupt|zero frames|no video"),
        (lambda: media.encode_audio(_tone(), 16000), "corrupt|zero frames|no video"),
    ],
)
def test_broken_video_raises_media_error(make_src, cause) -> None:
    with pytest.raises(MediaError, match=cause) as info:
        media.load_video(make_src())
    assert info.value.kind == "video"


def test_encode_rejects_empty_inputs() -> None:
    with pytest.raises(MediaError, match="T >= 1"):
        media.encode_video(np.zeros((0, 4, 4, 3), np.uint8), 2.0)
    with pytest.raises(MediaError, match="non-empty 1-D"):
        media.encode_audio(np.zeros(0, np.float32), 16000)
