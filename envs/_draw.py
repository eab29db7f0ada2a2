"""Pillow drawing helpers shared by the image and video envs: named colours, shapes, fonts and
non-overlapping placement. Nothing here draws randomness itself -- callers pass the env's
``np_random`` -- so rendering stays a pure function of the seed.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from PIL import ImageDraw, ImageFont

RGB = tuple[int, int, int]

# Colours far apart in hue and brightness, with plain names a model can say.
COLORS: dict[str, RGB] = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (140, 60, 180),
    "orange": (245, 130, 20),
    "black": (20, 20, 20),
    "cyan": (40, 190, 210),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "hexagon")
BACKGROUND: RGB = (245, 245, 240)


@lru_cache(maxsize=16)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled font at ``size`` px (no font files are read from the system)."""
    return ImageFont.load_default(size=size)


def polygon_points(shape: str, cx: float, cy: float, r: float, angle_deg: float = 0.0) -> list[tuple[float, float]]:
    """Vertices of a regular shape of circumradius ``r`` rotated by ``angle_deg``."""
    if shape == "square":
        n, offset, radii = 4, 45.0, [r]
    elif shape == "diamond":  # a narrow rhombus, so no rotation turns a square into one
        n, offset, radii = 4, -90.0, [r, r * 0.6]
    elif shape == "triangle":
        n, offset, radii = 3, -90.0, [r]
    elif shape == "hexagon":
        n, offset, radii = 6, 0.0, [r]
    elif shape == "star":
        n, offset, radii = 10, -90.0, [r, r * 0.45]
    else:
        raise ValueError(f"no polygon for shape {shape!r}")
    pts = []
    for k in range(n):
        theta = math.radians(offset + angle_deg + 360.0 * k / n)
        rk = radii[k % len(radii)]
        pts.append((cx + rk * math.cos(theta), cy + rk * math.sin(theta)))
    return pts


def draw_shape(
    draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill: RGB, angle_deg: float = 0.0
) -> None:
    """Draw a filled shape centred on (cx, cy) with circumradius ``r``."""
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    else:
        draw.polygon(polygon_points(shape, cx, cy, r, angle_deg), fill=fill)


def grid_positions(
    rng: np.random.Generator, n: int, size: int, cells: int, radius: float, margin: int = 4
) -> list[tuple[float, float]]:
    """``n`` centres in distinct cells of a ``cells x cells`` grid over a ``size`` px square,
    jittered inside their cell; shapes of circumradius ``radius`` never overlap."""
    if n > cells * cells:
        raise ValueError(f"cannot place {n} objects in {cells}x{cells} cells")
    cell = size / cells
    slack = max(0.0, cell / 2 - radius - margin)
    chosen = rng.choice(cells * cells, size=n, replace=False)
    out = []
    for idx in chosen:
        row, col = divmod(int(idx), cells)
        jx, jy = rng.uniform(-slack, slack, size=2) if slack > 0 else (0.0, 0.0)
        out.append((cell * (col + 0.5) + float(jx), cell * (row + 0.5) + float(jy)))
    return out


def text_center(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, size: int, fill: RGB) -> None:
    """Draw ``text`` centred on ``xy``."""
    draw.text(xy, text, fill=fill, font=font(size), anchor="mm")
