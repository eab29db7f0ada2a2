"""Small environments for the trainer tests: a text env whose reward varies with whatever a
random model writes (so advantages are never all zero) and a one-shape image env."""

from __future__ import annotations

from typing import Any

from PIL import Image, ImageDraw

import relax_gym
from relax_gym import Action, Message, Observation

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220)}


class LetterEnv(relax_gym.Env):
    """Write letters; reward = share of the letter ``a`` among the characters written.

    Success means at least half of the characters are ``a``; the oracle writes ``aaaa``.
    """

    max_turns = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(1, 1000))
        return Observation([Message.user(f"Task {self.n}: write the letter a several times.")]), {}

    def step(self, action: Action | str):
        text = Action.coerce(action).text
        share = text.count("a") / max(1, len(text))
        return Observation(), float(share), True, False, {"success": share >= 0.5,
                                                           "reward_components": {"share": share}}

    def oracle(self):
        yield "aaaa"


class ColourEnv(relax_gym.Env):
    """Name the colour of the square in a small image: ``\\boxed{red|green|blue}``."""

    modalities = ("text", "image")
    max_turns = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.colour = str(self.np_random.choice(sorted(COLOURS)))
        img = Image.new("RGB", (64, 64), (250, 250, 250))
        x, y = (int(v) for v in self.np_random.integers(8, 40, size=2))
        ImageDraw.Draw(img).rectangle((x, y, x + 16, y + 16), fill=COLOURS[self.colour])
        return Observation([Message.user("What colour is the square? Reply as \\boxed{colour}.", img)]), {}

    def step(self, action: Action | str):
        text = Action.coerce(action).text
        ok = f"\\boxed{{{self.colour}}}" in text
        return Observation(), float(ok), True, False, {"success": ok}

    def oracle(self):
        yield f"\\boxed{{{self.colour}}}"


CALC_SPEC = relax_gym.ToolSpec(
    name="calculator", description="Evaluate an arithmetic expression.",
    parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


class ToolOracleEnv(relax_gym.Env):
    """Two turns: call the calculator, then answer ``\\boxed{a*b}``; the oracle does both."""

    max_turns = 3

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.a, self.b = (int(x) for x in self.np_random.integers(2, 10, size=2))
        self.called = False
        return Observation([Message.system("Use the tools."), Message.user(f"What is {self.a} * {self.b}?")],
                           tools=[CALC_SPEC]), {}

    def step(self, action: Action | str):
        from relax_gym.tools.parsers import get_parser

        act = Action.coerce(action)
        if not act.tool_calls:
            act = get_parser("hermes").parse(act.text)
        if act.tool_calls and not self.called:
            self.called = True
            call = act.tool_calls[0]
            msg = Message.tool(str(self.a * self.b), tool_call_id=call.id or "call_0", name=call.name)
            return Observation([msg], tools=[CALC_SPEC]), 0.0, False, False, {"tool_calls": [call]}
        ok = f"\\boxed{{{self.a * self.b}}}" in act.text
        return Observation(), float(ok), True, False, {"success": ok}

    def oracle(self):
        from relax_gym.types import ToolCall

        yield Action(text="", tool_calls=[ToolCall("calculator", {"expression": f"{self.a}*{self.b}"})])
        yield f"\\boxed{{{self.a * self.b}}}"


def register_test_envs() -> None:
    for env_id, cls in (("test/Letters-v0", LetterEnv), ("test/Colour-v0", ColourEnv),
                        ("test/ToolOracle-v0", ToolOracleEnv)):
        if env_id not in relax_gym.registry:
            relax_gym.register(env_id, entry_point=cls)
