"""The rendered media really carry the answer: decode the audio, track the video and measure
the images with independent signal processing, and compare with each task's target."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import ndimage

from relax_gym.envs import dtmf, frame_order, morse, motion_track, scene_query, shape_count, tone_compare
from relax_gym.envs._audio import SAMPLE_RATE
from relax_gym.envs._draw import BACKGROUND, COLORS
from relax_gym.types import AudioPart, ImagePart, VideoPart

SEEDS = range(12)


def _segments(wave: np.ndarray, threshold: float, min_gap_s: float = 0.02) -> list[tuple[int, int]]:
    """Runs of samples whose 2 ms RMS exceeds ``threshold`` (gaps shorter than min_gap_s merged)."""
    hop = SAMPLE_RATE // 500
    frames = wave[: len(wave) // hop * hop].reshape(-1, hop)
    loud = np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1)) > threshold
    runs, start = [], None
    for i, on in enumerate(np.append(loud, False)):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append([start * hop, i * hop])
            start = None
    merged: list[list[int]] = []
    for run in runs:
        if merged and run[0] - merged[-1][1] < min_gap_s * SAMPLE_RATE:
            merged[-1][1] = run[1]
        else:
            merged.append(run)
    return [(a, b) for a, b in merged]


def _peak_hz(segment: np.ndarray, lo: float, hi: float) -> float:
    spectrum = np.abs(np.fft.rfft(segment * np.hanning(len(segment)), n=1 << 15))
    freqs = np.fft.rfftfreq(1 << 15, 1 / SAMPLE_RATE)
    band = (freqs >= lo) & (freqs <= hi)
    return float(freqs[band][np.argmax(spectrum[band])])


def _audio(env) -> np.ndarray:  # noqa: ANN001
    return env.task.media[0].waveform


@pytest.mark.parametrize("difficulty", ["easy", "medium"])
def test_dtmf_tones_decode_to_the_target(difficulty: str) -> None:
    env = dtmf.DTMFDecodeEnv(difficulty)
    for seed in SEEDS:
        env.reset(seed=seed)
        wave = _audio(env)
        keys = ""
        for a, b in _segments(wave, 0.15):
            low = _peak_hz(wave[a:b], 650, 1000)
            high = _peak_hz(wave[a:b], 1150, 1550)
            row = int(np.argmin([abs(low - f) for f in dtmf.ROWS_HZ]))
            col = int(np.argmin([abs(high - f) for f in dtmf.COLS_HZ]))
            keys += dtmf.KEYPAD[row][col]
        assert keys == env.task.target, seed


def test_morse_beeps_decode_to_the_word() -> None:
    env = morse.MorseDecodeEnv("easy")
    decode = {v: k for k, v in morse.CODE.items()}
    for seed in SEEDS:
        env.reset(seed=seed)
        wave = _audio(env)
        unit = 1.2 / env.level.wpm * SAMPLE_RATE
        segs = _segments(wave, 0.05, min_gap_s=0.0)
        word, letter = "", ""
        for i, (a, b) in enumerate(segs):
            letter += "." if (b - a) < 2 * unit else "-"
            gap = segs[i + 1][0] - b if i + 1 < len(segs) else math.inf
            if gap > 2 * unit:
                word += decode[letter]
                letter = ""
        assert word == env.task.target, seed


@pytest.mark.parametrize("difficulty", ["easy", "medium"])
def test_tone_compare_answer_matches_measured_pitch_and_length(difficulty: str) -> None:
    env = tone_compare.ToneCompareEnv(difficulty)
    for seed in SEEDS:
        env.reset(seed=seed)
        wave = _audio(env)
        segs = _segments(wave, 0.05)
        assert len(segs) == env._n, seed
        pitch = [_peak_hz(wave[a:b], 100, 2000) for a, b in segs]
        length = [b - a for a, b in segs]
        question = env.task.details["question"]
        values = pitch if question in ("highest", "lowest") else length
        pick = max if question in ("highest", "longest") else min
        assert values.index(pick(values)) + 1 == env.task.target, (seed, question)


def _red_centroids(frames: np.ndarray) -> np.ndarray:
    red = (frames[..., 0] > 200) & (frames[..., 1] < 100) & (frames[..., 2] < 100)
    out = []
    for mask in red:
        ys, xs = np.nonzero(mask)
        out.append((xs.mean(), ys.mean()))
    return np.array(out)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_motion_track_answer_matches_the_tracked_red_ball(difficulty: str) -> None:
    env = motion_track.MotionTrackEnv(difficulty)
    for seed in range(20):
        env.reset(seed=seed)
        frames = env.task.media[0].frames
        pos = _red_centroids(frames)
        kind = env.task.details["question"]
        if kind.startswith("direction"):
            dx, dy = pos[-1] - pos[0]
            horiz = "left" if dx < -3 else "right" if dx > 3 else ""
            vert = "up" if dy < -3 else "down" if dy > 3 else ""
            measured = "-".join(p for p in (vert, horiz) if p)
        elif kind == "bounces":
            vel = np.diff(pos, axis=0)
            measured = str(sum(int(np.sum(np.diff(np.sign(vel[:, k])) != 0)) for k in (0, 1)))
        else:
            x, y = pos[-1]
            measured = f"{'top' if y < 48 else 'bottom'}-{'left' if x < 48 else 'right'}"
        assert measured == env.task.target, (seed, kind)


def test_frame_order_answer_matches_measured_progress() -> None:
    env = frame_order.FrameOrderEnv("hard")
    for seed in range(16):
        env.reset(seed=seed)
        shots = env.task.media[0].frames[:: frame_order.HOLD]
        process = env.task.details["process"]
        progress = []
        for shot in shots.astype(int):
            r, g, b = shot[..., 0], shot[..., 1], shot[..., 2]
            if process == "tower":
                progress.append(np.sum((r == 200) & (g == 120) & (b == 40)))
            elif process == "glass":
                progress.append(np.sum((r == 70) & (g == 140) & (b == 230)))
            elif process == "ball":
                xs = np.nonzero((r == 60) & (g == 60) & (b == 200))[1]
                progress.append(xs.mean())
            else:  # clock: the red hand's angle clockwise from 12
                ys, xs = np.nonzero((r == 200) & (g == 30) & (b == 30))
                ang = math.degrees(math.atan2(xs.mean() - 48, -(ys.mean() - 48))) % 360
                progress.append(ang)
        order = "".join(frame_order.LETTERS[i] for i in np.argsort(progress))
        assert order == env.task.target, (seed, process)


def _components(img: np.ndarray, color: tuple[int, int, int] | None) -> list[tuple[float, float, slice, slice]]:
    mask = np.all(img == color, axis=-1) if color else ~np.all(img == BACKGROUND, axis=-1)
    labels, n = ndimage.label(mask)
    out = []
    for k, sl in enumerate(ndimage.find_objects(labels), start=1):
        ys, xs = np.nonzero(labels[sl] == k)
        out.append((xs.mean() + sl[1].start, ys.mean() + sl[0].start, sl[0], sl[1]))
    return out


@pytest.mark.parametrize("difficulty", ["easy", "medium"])
def test_shape_count_draws_every_object_separately(difficulty: str) -> None:
    env = shape_count.ShapeCountEnv(difficulty)
    for seed in SEEDS:
        env.reset(seed=seed)
        img = np.asarray(env.task.media[0].image)
        blobs = [c for c in _components(img, None) if (c[2].stop - c[2].start) > 4]  # drop anti-alias specks
        assert len(blobs) == env.task.details["objects"], seed
        color = re.match(r"(\w+) ", env.task.details["question"])
        if color and color.group(1) in COLORS:
            assert len(_components(img, COLORS[color.group(1)])) >= env.task.target


@pytest.mark.parametrize("difficulty", ["medium", "hard"])
def test_scene_query_positions_agree_with_the_pixels(difficulty: str) -> None:
    env = scene_query.SceneQueryEnv(difficulty)
    checked = 0
    for seed in range(30):
        env.reset(seed=seed)
        img = np.asarray(env.task.media[0].image)
        objs = {}
        for name in scene_query.COLOR_WORDS:
            comps = _components(img, COLORS[name])
            if comps:
                big = max(comps, key=lambda c: (c[2].stop - c[2].start) * (c[3].stop - c[3].start))
                objs[name] = big
        q = env.task.details["question"]
        if m := re.match(r"What colour is the (\w+)most object", q):
            side = m.group(1)
            key = {
                "left": lambda c: c[3].start, "right": lambda c: -c[3].stop,
                "top": lambda c: c[2].start, "bottom": lambda c: -c[2].stop,
            }[side]
            measured = min(objs, key=lambda n: key(objs[n]))
        elif m := re.match(r"What colour is the object closest to the (\w+) ", q):
            anchor = objs[m.group(1)]
            measured = min((n for n in objs if n != m.group(1)), key=lambda n: math.dist(objs[n][:2], anchor[:2]))
        elif m := re.match(r"Is the (\w+) \w+ (left of|right of|above|below) the (\w+) ", q):
            a, rel, b = objs[m.group(1)], m.group(2), objs[m.group(3)]
            truth = {"left of": a[0] < b[0], "right of": a[0] > b[0], "above": a[1] < b[1], "below": a[1] > b[1]}[rel]
            measured = "yes" if truth else "no"
        else:
            continue
        checked += 1
        assert measured == env.task.target, (seed, q)
    assert checked >= 20


def test_media_stay_small_enough_for_fast_tests() -> None:
    """The limits the test budget relies on: images <= 320 px, audio <= 3.5 s, video <= 24
    frames of <= 96 px."""
    import relax_gym
    from relax_gym.envs import SHIPPED

    for e in SHIPPED:
        env = relax_gym.make(e.id, difficulty="hard", **e.vision_kwargs)
        for seed in range(3):
            obs, _ = env.reset(seed=seed)
            for part in obs.parts():
                if isinstance(part, ImagePart):
                    assert max(part.image.size) <= 320, e.id
                elif isinstance(part, AudioPart):
                    assert part.duration_s <= 3.5 and part.sample_rate == 16_000, e.id
                elif isinstance(part, VideoPart):
                    assert part.frames.shape[0] <= 24 and max(part.frames.shape[1:3]) <= 96, e.id
