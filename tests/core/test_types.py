from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from relax_gym import Action, AudioPart, ImagePart, Message, Observation, TextPart, ToolCall, ToolSpec, VideoPart


def test_media_parts_compare_by_value() -> None:
    a = ImagePart(Image.new("RGB", (4, 4), (1, 2, 3)))
    b = ImagePart(Image.new("RGB", (4, 4), (1, 2, 3)))
    c = ImagePart(Image.new("RGB", (4, 4), (1, 2, 4)))
    assert a == b and a != c
    w = np.linspace(-1, 1, 100, dtype=np.float32)
    assert AudioPart(w, 16000) == AudioPart(w.copy(), 16000)
    assert AudioPart(w, 16000) != AudioPart(w, 8000)
    frames = np.zeros((3, 4, 4, 3), np.uint8)
    other = frames.copy()
    other[1, 0, 0, 0] = 1
    assert VideoPart(frames, 2.0) == VideoPart(frames.copy(), 2.0)
    assert VideoPart(frames, 2.0) != VideoPart(other, 2.0)


def test_media_parts_validate_shapes() -> None:
    with pytest.raises(ValueError, match="1-D mono"):
        AudioPart(np.zeros((2, 10), np.float32), 16000)
    with pytest.raises(ValueError, match="sample_rate"):
        AudioPart(np.zeros(10, np.float32), 0)
    with pytest.raises(ValueError, match="uint8"):
        VideoPart(np.zeros((2, 4, 4, 3), np.float32), 2.0)
    with pytest.raises(ValueError, match="at least one frame"):
        VideoPart(np.zeros((0, 4, 4, 3), np.uint8), 2.0)


def test_message_constructors_and_views() -> None:
    img = Image.new("RGB", (2, 2))
    msg = Message.user("look: ", img, "ok")
    assert [type(p) for p in msg.content] == [TextPart, ImagePart, TextPart]
    assert msg.text == "look: ok"
    assert msg.modalities == {"text", "image"}
    with pytest.raises(ValueError, match="unknown role"):
        Message("robot", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot use int"):
        Message.user(3)
    obs = Observation([msg, Message.tool("42", tool_call_id="c1", name="calc")])
    assert obs.parts(ImagePart) == [ImagePart(img)]
    assert obs.modalities == {"text", "image"}


def test_action_coerce_and_toolspec() -> None:
    assert Action.coerce("hi") == Action(text="hi")
    act = Action("x", [ToolCall("calc", {"e": "1+1"}, "c0")], ["bad json"])
    assert Action.coerce(act) is act and act.has_errors
    with pytest.raises(TypeError, match="relax_gym.Action or str"):
        Action.coerce(5)  # type: ignore[arg-type]
    spec = ToolSpec("calc", "Evaluate", {"type": "object", "properties": {"e": {"type": "string"}}, "required": ["e"]})
    assert spec.to_openai()["function"]["name"] == "calc"
    assert ToolCall("a", {"x": 1, "y": 2}) == ToolCall("a", {"y": 2, "x": 1})
