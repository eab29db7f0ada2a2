"""Small envs and suites for the leaderboard tests, registered under ``lbtest/``.

* ``Pick`` -- name the letter shown among ``choices`` letters; the random agent picks uniformly,
  so its success is exactly ``1 / choices`` in expectation.
* ``Picture`` -- name the colour of a square image (text + image).
* ``Lookup`` -- the answer is only available through a tool call (``tools`` tag, two turns).
* ``Flaky`` -- raises inside ``step`` on seeds divisible by 3 (a broken env, for error rows).
* ``LongClip`` -- a Pick prompt with a good clip and one over the default video budget (301 s).
* ``Chatter`` -- never ends before its 60 turns, each observation a long text: a conversation
  that fills a small model context.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from PIL import Image

import relax_gym
from relax_gym import Action, Message, Observation, ToolCall, ToolSpec

LETTERS = "ABCDEFGH"
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220)}


class PickEnv(relax_gym.Env):
    """Reply with the letter named in the prompt."""

    max_turns = 1

    def __init__(self, choices: int = 4) -> None:
        self.choices = choices
        self.answer = "A"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.answer = LETTERS[int(self.np_random.integers(0, self.choices))]
        return Observation([Message.user(f"Reply with the letter {self.answer}.")]), {}

    def step(self, action: Action | str):
        text = Action.coerce(action).text.strip()
        ok = text == self.answer
        return Observation(), float(ok), True, False, {"success": ok, "well_formed": text in LETTERS[: self.choices]}

    def oracle(self) -> Iterator[str]:
        yield self.answer

    def random_action(self, rng: np.random.Generator) -> str:
        return LETTERS[int(rng.integers(0, self.choices))]


class PictureEnv(relax_gym.Env):
    """Name the colour of the square (shown as an image, or named in words with ``image=False``)."""

    max_turns = 1
    modalities = ("text", "image")

    def __init__(self, image: bool = True) -> None:
        self.image = image
        if not image:
            self.modalities = ("text",)  # this instance shows no image

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.colour = list(COLOURS)[int(self.np_random.integers(0, len(COLOURS)))]
        question = "What colour is this square? Answer red, green or blue."
        if not self.image:
            return Observation([Message.user(f"The square is {self.colour}. {question}")]), {}
        img = Image.new("RGB", (32, 32), COLOURS[self.colour])
        return Observation([Message.user(question, img)]), {}

    def step(self, action: Action | str):
        ok = Action.coerce(action).text.strip().lower() == self.colour
        return Observation(), float(ok), True, False, {"success": ok}

    def oracle(self) -> Iterator[str]:
        yield self.colour

    def random_action(self, rng: np.random.Generator) -> str:
        return list(COLOURS)[int(rng.integers(0, len(COLOURS)))]


LOOKUP = ToolSpec(
    "lookup",
    "Return the secret word.",
    {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)


class LookupEnv(relax_gym.Env):
    """Call ``lookup`` to read a secret word, then reply with it."""

    max_turns = 3
    tags = ("tools",)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.secret = ["apple", "river", "stone", "cloud"][int(self.np_random.integers(0, 4))]
        self.calls = 0
        return Observation(
            [Message.user("Find the secret word with the lookup tool, then reply with it.")], tools=[LOOKUP]
        ), {}

    def step(self, action: Action | str):
        act = Action.coerce(action)
        if act.parse_errors:
            msgs = [Message.user("Your tool call could not be parsed: " + "; ".join(act.parse_errors))]
            return Observation(msgs, tools=[LOOKUP]), 0.0, False, False, {"invalid_action": True}
        if act.tool_calls:
            self.calls += 1
            msgs = []
            for call in act.tool_calls:
                body = self.secret if call.name == "lookup" else f"unknown tool {call.name}"
                msgs.append(Message.tool(body, tool_call_id=call.id, name=call.name))
            return Observation(msgs, tools=[LOOKUP]), 0.0, False, False, {}
        ok = act.text.strip().lower() == self.secret
        return Observation(), float(ok), True, False, {"success": ok}

    def oracle(self) -> Iterator[Action | str]:
        yield Action(tool_calls=[ToolCall("lookup", {"key": "secret"}, id="call_0")])
        yield self.secret

    def random_action(self, rng: np.random.Generator) -> str:
        return ["apple", "river", "stone", "cloud"][int(rng.integers(0, 4))]


class FlakyEnv(PickEnv):
    """A Pick env whose ``step`` raises on seeds divisible by 3."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.seed_used = seed
        return super().reset(seed=seed, options=options)

    def step(self, action: Action | str):
        if self.seed_used is not None and self.seed_used % 3 == 0:
            raise RuntimeError("flaky env broke")
        return super().step(action)


class LongClipEnv(PickEnv):
    """A Pick prompt showing a 2 s clip and a 301 s one (over the default 300 s budget)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        from relax_gym.types import VideoPart

        obs, info = super().reset(seed=seed, options=options)
        frames = np.zeros((301, 32, 32, 3), dtype=np.uint8)
        clips = [VideoPart(frames[:4], 2.0), VideoPart(frames, 1.0)]
        return Observation([Message.user(obs.messages[0].text, *clips)]), info


class ChatterEnv(PickEnv):
    """Every reply is answered with a long text; the episode only ends at ``max_turns``."""

    max_turns = 60

    def step(self, action: Action | str):
        text = " ".join(f"word{i}" for i in range(12))
        return Observation([Message.user(f"Go on. {text}")]), 0.0, False, False, {"success": False}


def register_all() -> None:
    """Register the test envs and suites once (idempotent)."""
    if "lbtest/Pick-v0" in relax_gym.registry:
        return
    relax_gym.register("lbtest/Pick-v0", PickEnv)
    relax_gym.register("lbtest/Pick-v1", PickEnv, kwargs={"choices": 5})
    relax_gym.register("lbtest/Picture-v0", PictureEnv)
    relax_gym.register("lbtest/Lookup-v0", LookupEnv)
    relax_gym.register("lbtest/Flaky-v0", FlakyEnv)
    relax_gym.register("lbtest/LongClip-v0", LongClipEnv)
    relax_gym.register("lbtest/Chatter-v0", ChatterEnv)
    relax_gym.register_suite(
        "lbtest/mini-v0", ["lbtest/Pick-v0", "lbtest/Picture-v0", "lbtest/Lookup-v0"], episodes_per_env=6
    )
    relax_gym.register_suite(
        "lbtest/mini-v1", ["lbtest/Pick-v1", "lbtest/Picture-v0", "lbtest/Lookup-v0"], episodes_per_env=6
    )
    relax_gym.register_suite("lbtest/flaky-v0", ["lbtest/Pick-v0", "lbtest/Flaky-v0"], episodes_per_env=9)


# random-agent success of each test env (exact expectations) for the normalised score
BASELINES = {
    "lbtest/Pick-v0": {"random": 0.25, "oracle": 1.0},
    "lbtest/Pick-v1": {"random": 0.2, "oracle": 1.0},
    "lbtest/Picture-v0": {"random": 1 / 3, "oracle": 1.0},
    "lbtest/Lookup-v0": {"random": 0.25, "oracle": 1.0},
    "lbtest/Flaky-v0": {"random": 0.25, "oracle": 1.0},
}
