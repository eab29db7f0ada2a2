"""Small environments for the rollout tests: their episode length does not depend on what a
random tiny model writes, so token/mask invariants can be asserted exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

import relax_gym
from relax_gym import Action, Message, Observation, ToolSpec

CALC = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


class FixedToolEnv(relax_gym.Env):
    """A tool-use episode of exactly ``turns`` actions: every action gets a tool result back (as
    if the model had called the calculator) until the last, which ends the episode.

    With ``user_turn_at`` the env sends a new *user* message after that turn instead (the case
    where Qwen3's template drops earlier reasoning). ``fail_at`` raises inside step at that turn.
    """

    max_turns = 16

    def __init__(self, turns: int = 3, user_turn_at: int | None = None, fail_at: int | None = None) -> None:
        self.turns = turns
        self.user_turn_at = user_turn_at
        self.fail_at = fail_at

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(1, 100, size=2))
        self.t = 0
        obs = Observation(
            [Message.system("You are a careful assistant."), Message.user(f"What is {self.a} * {self.b}? Use the tool.")],
            tools=[CALC],
        )
        return obs, {}

    def step(self, action: Action | str):
        action = Action.coerce(action)
        self.t += 1
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError("the env broke on purpose")
        if self.t >= self.turns:
            ok = str(self.a * self.b) in action.text
            return Observation([Message.user("Episode over.")]), float(ok), True, False, {
                "success": ok, "reward_components": {"answer": float(ok), "turns": float(self.t)}}
        if self.user_turn_at is not None and self.t == self.user_turn_at:
            return Observation([Message.user(f"Now also add {self.a}.")]), 0.0, False, False, {}
        msg = Message.tool(f"{self.a * self.b + self.t}", tool_call_id=f"call_{self.t}", name="calculator")
        return Observation([msg], tools=[CALC]), 0.0, False, False, {
            "tool_calls": [{"id": f"call_{self.t}", "name": "calculator", "arguments": {"expression": "a*b"}}],
            "tool_latency_s": 0.001}


class ImageTurnsEnv(relax_gym.Env):
    """Each turn shows a new small image (different sizes, so different patch grids); the episode
    lasts exactly ``turns`` actions."""

    modalities = ("text", "image")
    max_turns = 8

    def __init__(self, turns: int = 2) -> None:
        self.turns = turns

    def _image(self) -> Image.Image:
        w, h = [(64, 32), (32, 64), (96, 64), (32, 32)][self.t % 4]
        pixels = self.np_random.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        return Image.fromarray(pixels, "RGB")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        return Observation([Message.user("How many squares?", self._image())]), {}

    def step(self, action: Action | str):
        self.t += 1
        if self.t >= self.turns:
            return Observation(), 1.0, True, False, {"success": True}
        return Observation([Message.user("And here?", self._image())]), 0.0, False, False, {}


__all__ = ["CALC", "FixedToolEnv", "ImageTurnsEnv"]
