"""Box IoU reward for grounding tasks.

The model's boxes are read from its answer: JSON such as ``{"bbox_2d": [x1, y1, x2, y2]}``
(Qwen-VL's grounding format) or a list of them, or bare ``[x1, y1, x2, y2]`` groups of four
numbers. The label is one box or a list of boxes in the same coordinates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from relax_gym.answers import last_boxed, loads_json
from relax_gym.rewards.registry import Score, reward
from relax_gym.rewards.types import RewardError, RewardInput

Box = tuple[float, float, float, float]

_NUM = r"-?\d+(?:\.\d+)?"
_BOX4 = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")
MAX_BOXES = 100


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes; 0 for empty boxes."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    area_a = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    area_b = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0


def _to_xyxy(box: Sequence[float], fmt: str) -> Box:
    x1, y1, a, b = (float(v) for v in box)
    return (x1, y1, x1 + a, y1 + b) if fmt == "xywh" else (x1, y1, a, b)


def _json_boxes(obj: Any) -> list[list[float]]:
    if isinstance(obj, dict):
        for key in ("bbox_2d", "bbox", "box"):
            if key in obj:
                return _json_boxes(obj[key])
        return []
    if isinstance(obj, list):
        if len(obj) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj):
            box = [_finite(v) for v in obj]
            return [box] if all(v is not None for v in box) else []  # type: ignore[list-item]
        return [b for item in obj for b in _json_boxes(item)]
    return []


def _finite(value: float | str) -> float | None:
    """``float(value)`` when it is a finite number (a 400-digit int overflows float)."""
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def parse_boxes(text: str) -> list[list[float]]:
    """Boxes in a model answer: JSON first (fenced or bare), else groups of four numbers."""
    text = text[-20_000:]
    candidates = re.findall(r"```(?:json)?\s*(.*?)```", text, re.DOTALL) + [text]
    for cand in candidates:
        cand = cand.strip()
        if cand[:1] in "[{":
            try:
                boxes = _json_boxes(loads_json(cand))
            except ValueError:  # bad, too deep or too long: not JSON boxes
                boxes = []
            if boxes:
                return boxes[:MAX_BOXES]
    groups = ([_finite(g) for g in m.groups()] for m in _BOX4.finditer(text))
    return [box for box in groups if all(v is not None for v in box)][:MAX_BOXES]  # type: ignore[misc]


def _label_boxes(label: Any) -> list[list[float]]:
    boxes = _json_boxes(label) if not isinstance(label, str) else parse_boxes(label)
    if not boxes:
        raise RewardError("config", f"iou needs a box label like [x1, y1, x2, y2], got {label!r}")
    return boxes


def _matched_mean_iou(pred: list[Box], ref: list[Box]) -> float:
    """Greedy one-to-one matching by IoU; unmatched boxes on either side count as 0."""
    pairs = sorted(((iou(p, r), i, j) for i, p in enumerate(pred) for j, r in enumerate(ref)), reverse=True)
    used_p: set[int] = set()
    used_r: set[int] = set()
    total = 0.0
    for value, i, j in pairs:
        if i not in used_p and j not in used_r:
            used_p.add(i)
            used_r.add(j)
            total += value
    return total / max(len(pred), len(ref))


@reward("iou")
def iou_reward(
    sample: RewardInput,
    *,
    threshold: float | None = None,
    box_format: str = "xyxy",
) -> Score:
    """Mean IoU between predicted and labelled boxes (one-to-one greedy matching; extra or
    missing boxes count as 0). With ``threshold``, 1.0 when that mean reaches it, else 0.0.
    ``box_format`` is ``xyxy`` or ``xywh`` for both sides."""
    if box_format not in ("xyxy", "xywh"):
        raise RewardError("config", f"box_format must be 'xyxy' or 'xywh', got {box_format!r}")
    ref = [_to_xyxy(b, box_format) for b in _label_boxes(sample.label)]
    boxed = last_boxed(sample.response)
    pred_raw = parse_boxes(boxed) if boxed else []
    pred_raw = pred_raw or parse_boxes(sample.response)
    if not pred_raw:
        return Score(0.0, details={"boxes": []})
    pred = [_to_xyxy(b, box_format) for b in pred_raw]
    value = _matched_mean_iou(pred, ref)
    details = {"boxes": pred_raw, "iou": value}
    if threshold is not None:
        return Score(float(value >= threshold), details=details)
    return Score(value, details=details)


__all__ = ["iou", "iou_reward", "parse_boxes"]
