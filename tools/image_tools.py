"""Image tools for the "thinking with images" pattern: ``crop``, ``zoom`` and ``rotate`` take
an image of the conversation by id and return a new image (which ToolEnv gives a fresh id, so
the model can zoom into a zoom).

Coordinates are pixels of the referenced image: ``bbox = (left, top, right, bottom)``, right
and bottom exclusive; a box reaching past the border is clipped to it.
"""

from __future__ import annotations

from typing import Annotated

from PIL import Image
from pydantic import Field

from relax_gym.types import ImagePart

from .declaration import ToolContext, ToolError, tool

MAX_OUTPUT_SIDE = 2048
BBox = tuple[int, int, int, int]


def _clip_box(image: Image.Image, bbox: BBox) -> tuple[int, int, int, int]:
    left, top, right, bottom = bbox
    if right <= left or bottom <= top:
        raise ToolError(f"bbox {list(bbox)} is empty: need left < right and top < bottom")
    w, h = image.size
    box = (max(0, left), max(0, top), min(w, right), min(h, bottom))
    if box[2] <= box[0] or box[3] <= box[1]:
        raise ToolError(f"bbox {list(bbox)} lies outside the image, which is {w}x{h} pixels")
    return box


@tool
def crop(image_id: str, bbox: BBox, ctx: ToolContext) -> ImagePart:
    """Cut a rectangular region out of an image of the conversation.

    Args:
        image_id: Id of an image shown earlier in the conversation.
        bbox: Region as [left, top, right, bottom] in pixels of that image.
    """
    image = ctx.image(image_id).image
    return ImagePart(image.crop(_clip_box(image, bbox)))


@tool
def zoom(
    image_id: str,
    bbox: BBox,
    ctx: ToolContext,
    factor: Annotated[float, Field(ge=1.0, le=8.0)] = 2.0,
) -> ImagePart:
    """Crop a region of an image of the conversation and enlarge it to see details.

    Args:
        image_id: Id of an image shown earlier in the conversation.
        bbox: Region as [left, top, right, bottom] in pixels of that image.
        factor: Enlargement factor (1-8).
    """
    image = ctx.image(image_id).image
    region = image.crop(_clip_box(image, bbox))
    w, h = region.size
    scale = min(factor, MAX_OUTPUT_SIDE / max(w, h))
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return ImagePart(region.resize(size, Image.Resampling.BICUBIC) if size != region.size else region)


_TRANSPOSE = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}


@tool
def rotate(image_id: str, degrees: float, ctx: ToolContext) -> ImagePart:
    """Rotate an image of the conversation counter-clockwise (the canvas grows to fit).

    Args:
        image_id: Id of an image shown earlier in the conversation.
        degrees: Angle, counter-clockwise; multiples of 90 are exact.
    """
    image = ctx.image(image_id).image
    angle = degrees % 360
    if angle == 0:
        return ImagePart(image.copy())
    if angle in _TRANSPOSE:
        return ImagePart(image.transpose(_TRANSPOSE[int(angle)]))
    return ImagePart(image.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True))
