"""Mastermind: find a hidden code from feedback on each guess (text, several turns).

* **Task** -- the env hides a code of ``pegs`` digits, each from 1 to ``colors`` (repeats
  allowed). After each guess it says how many digits are right and in the right place
  ("exact") and how many more are right but in the wrong place ("misplaced").
* **Observation** -- the rules first; then, each turn, the feedback on the last guess and the
  number of guesses left (text only; earlier feedback is already in the conversation).
* **Action** -- one guess per turn as ``\\boxed{...}``, e.g. ``\\boxed{1324}`` (spaces and
  commas are ignored). A malformed guess gets an error message, uses up the turn and is
  counted in ``info["invalid_actions"]``.
* **Reward** -- 1.0 on the turn the code is found, else 0; ``success`` means the code was
  found within the guess budget.
* **Difficulty** -- ``easy``: 3 pegs, 4 colours, 8 guesses. ``medium``: 4 pegs, 6 colours
  (the classic game), 10 guesses. ``hard``: 5 pegs, 7 colours, 12 guesses.

The oracle really plays: it only uses the feedback, each time guessing the code (among those
still consistent with every answer so far) that leaves the fewest candidates in the worst case.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from relax_gym.core import Env
from relax_gym.types import Action, Message, Observation

from ._answers import boxed_answer
from ._base import check_difficulty

_STRIP = re.compile(r"[\s,;\-]")
SCORE_SAMPLE = 256  # candidates scored per oracle guess (keeps the hard level fast)


@dataclass(frozen=True)
class Level:
    pegs: int
    colors: int
    turns: int


LEVELS = {"easy": Level(3, 4, 8), "medium": Level(4, 6, 10), "hard": Level(5, 7, 12)}


def all_codes(pegs: int, colors: int) -> np.ndarray:
    """Every code as an ``[N, pegs]`` int8 array, in lexicographic order (digits from 1)."""
    return np.array(list(itertools.product(range(1, colors + 1), repeat=pegs)), dtype=np.int8)


def color_counts(codes: np.ndarray, colors: int) -> np.ndarray:
    """How often each colour occurs in each code: ``[N, colors]``."""
    return np.stack([(codes == c).sum(axis=-1) for c in range(1, colors + 1)], axis=-1)


def score(codes: np.ndarray, guess: np.ndarray, colors: int, counts: np.ndarray | None = None) -> np.ndarray:
    """Feedback of ``guess`` against each row of ``codes`` as ``exact * 16 + misplaced``
    (``counts``: the codes' precomputed :func:`color_counts`)."""
    exact = (codes == guess).sum(axis=1)
    counts = color_counts(codes, colors) if counts is None else counts
    common = np.minimum(counts, color_counts(guess, colors)).sum(axis=1)
    return exact * 16 + (common - exact)


class MastermindEnv(Env):
    """Crack a hidden digit code from exact/misplaced feedback, one guess per turn."""

    modalities = ("text",)
    tags = ("multi-turn", "game", "logic")
    max_turns = LEVELS["hard"].turns
    levels = LEVELS

    def __init__(self, difficulty: str = "easy") -> None:
        check_difficulty(difficulty, LEVELS)
        self.difficulty = difficulty
        self.level = LEVELS[difficulty]
        self.turn_budget = self.level.turns
        self._codes = all_codes(self.level.pegs, self.level.colors)
        self.secret: np.ndarray | None = None
        self.history: list[tuple[str, int, int]] = []
        self.invalid_actions = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        lv = self.level
        self.secret = self.np_random.integers(1, lv.colors + 1, size=lv.pegs).astype(np.int8)
        self.history = []
        self.invalid_actions = 0
        example = "".join(str(1 + (k % lv.colors)) for k in range(lv.pegs))
        intro = (
            f"Let's play Mastermind. I have chosen a secret code of {lv.pegs} digits, each from 1 to "
            f"{lv.colors}; digits may repeat. After each guess I tell you how many digits are correct "
            "and in the correct position (exact) and how many more are correct but in the wrong "
            f"position (misplaced). You have {lv.turns} guesses. Send one guess per turn as "
            f"\\boxed{{...}}, e.g. \\boxed{{{example}}}."
        )
        return Observation([Message.user(intro)]), {"difficulty": self.difficulty, "turn_budget": self.turn_budget}

    def parse_guess(self, raw: str | None) -> np.ndarray | None:
        if raw is None:
            return None
        digits = _STRIP.sub("", raw)
        lv = self.level
        if len(digits) != lv.pegs or not (digits.isascii() and digits.isdigit()) or any(not 1 <= int(d) <= lv.colors for d in digits):
            return None
        return np.array([int(d) for d in digits], dtype=np.int8)

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self.secret is None:
            raise RuntimeError("MastermindEnv: call reset() first")
        lv = self.level
        guess = self.parse_guess(boxed_answer(Action.coerce(action).text))
        turns_used = len(self.history) + self.invalid_actions + 1
        if guess is None:
            self.invalid_actions += 1
            lines = [
                f"Error: that is not a valid guess. Send exactly {lv.pegs} digits from 1 to {lv.colors} "
                "inside \\boxed{...}. This turn is used up."
            ]
            solved = False
        else:
            fb = int(score(self.secret[None, :], guess, lv.colors)[0])
            exact, misplaced = fb // 16, fb % 16
            code = "".join(str(int(d)) for d in guess)
            self.history.append((code, exact, misplaced))
            solved = exact == lv.pegs
            lines = [f"Guess {code}: {exact} exact, {misplaced} misplaced."]
        left = self.turn_budget - turns_used
        if solved:
            lines.append("You found the code!")
        elif left <= 0:
            lines.append(f"No guesses left: the code was {''.join(str(int(d)) for d in self.secret)}.")
        else:
            lines.append(f"{left} guess{'es' if left != 1 else ''} left.")
        info = {
            "success": solved,
            "reward_components": {"solved": 1.0 if solved else 0.0},
            "invalid_actions": self.invalid_actions,
            "guesses": len(self.history),
        }
        return Observation([Message.user(" ".join(lines))]), float(solved), solved or left <= 0, False, info

    # -- oracle and random agent ------------------------------------------------------------------
    def oracle(self) -> Iterator[str]:
        """Guess from the feedback alone: keep the codes consistent with every answer, and play
        the one whose worst-case answer leaves the fewest of them (ties: the first)."""
        lv = self.level
        candidates = self._codes
        seen = 0
        while True:
            for code, exact, misplaced in self.history[seen:]:
                guess = np.array([int(d) for d in code], dtype=np.int8)
                candidates = candidates[score(candidates, guess, lv.colors) == exact * 16 + misplaced]
            seen = len(self.history)
            yield "\\boxed{" + "".join(str(int(d)) for d in self._best_guess(candidates)) + "}"

    def _best_guess(self, candidates: np.ndarray) -> np.ndarray:
        if len(candidates) <= 2:
            return candidates[0]
        if len(candidates) == len(self._codes):  # the opening never depends on the secret
            return _opening(self.level.pegs, self.level.colors)
        return _minimax_guess(candidates, self.level.colors)

    def random_action(self, rng: np.random.Generator) -> str:
        lv = self.level
        return "\\boxed{" + "".join(str(int(d)) for d in rng.integers(1, lv.colors + 1, size=lv.pegs)) + "}"


@functools.lru_cache(maxsize=8)
def _opening(pegs: int, colors: int) -> np.ndarray:
    return _minimax_guess(all_codes(pegs, colors), colors)


def _minimax_guess(candidates: np.ndarray, colors: int) -> np.ndarray:
    """The candidate whose worst-case feedback leaves the fewest candidates."""
    pool = candidates
    if len(pool) > SCORE_SAMPLE:  # evenly spaced, so the choice stays deterministic
        pool = pool[np.linspace(0, len(pool) - 1, SCORE_SAMPLE).astype(int)]
    counts = color_counts(candidates, colors)
    worst = [np.bincount(score(candidates, g, colors, counts)).max() for g in pool]
    return pool[int(np.argmin(worst))]
