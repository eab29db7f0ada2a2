"""Shared machinery for the multi-turn grid games (GridMaze, Sokoban).

The model sends a few moves per turn as ``\\boxed{...}`` (``U``/``D``/``L``/``R`` or the words
up/down/left/right); the env applies them in order, stops at the first blocked move, and
answers with the new board, as text (``render="text"``) or as a Pillow image
(``render="image"``). Unreadable answers and blocked moves become error messages in the next
observation -- never exceptions -- and are counted in ``info["invalid_actions"]`` and
``info["invalid_moves"]``. The game ends when it is solved or its turn budget is spent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from relax_gym.core import Env
from relax_gym.types import Action, ImagePart, Message, Observation

from ._answers import boxed_answer
from ._base import EnvOptionError, check_difficulty

Pos = tuple[int, int]
MOVES: dict[str, Pos] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R"}
_SPLIT = re.compile(r"[\s,;]+")
RENDERS = ("text", "image")


def parse_moves(raw: str) -> list[str] | None:
    """``"RRD"``, ``"R R D"``, ``"right, right, down"`` -> ``["R", "R", "D"]``; None if unreadable."""
    moves: list[str] = []
    for token in _SPLIT.split(raw.strip().upper()):
        if not token:
            continue
        if token in _WORDS:
            moves.append(_WORDS[token])
        elif all(ch in MOVES for ch in token):
            moves.extend(token)
        else:
            return None
    return moves or None


def step_pos(pos: Pos, move: str) -> Pos:
    dr, dc = MOVES[move]
    return pos[0] + dr, pos[1] + dc


class GridGameEnv(Env):
    """Base for grid games played over several turns; subclasses define the game itself.

    Subclass hooks: ``new_game(level)``, ``try_move(move) -> error text or None``,
    ``solved()``, ``board_text()``, ``board_image()``, ``plan() -> moves from the start state``,
    ``rules_text()``.
    """

    levels: ClassVar[Mapping[str, Any]]
    tags = ("multi-turn", "game")
    modalities = ("text", "image")
    moves_per_turn: ClassVar[int] = 8

    def __init__(self, difficulty: str = "easy", render: str = "text") -> None:
        check_difficulty(difficulty, self.levels)
        if render not in RENDERS:
            raise EnvOptionError(f"render must be one of {RENDERS}, got {render!r}")
        self.difficulty = difficulty
        self.level = self.levels[difficulty]
        self.render_kind = render
        self.turn_budget: int = int(self.level.turns)
        self._reset_counters()

    def _reset_counters(self) -> None:
        self.turns_used = 0
        self.moves_made = 0
        self.invalid_actions = 0
        self.invalid_moves = 0
        self.started = False

    # -- subclass hooks ---------------------------------------------------------------------------
    def new_game(self, level: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def try_move(self, move: str) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def solved(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def board_text(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def board_image(self) -> Image.Image:  # pragma: no cover - abstract
        raise NotImplementedError

    def plan(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def rules_text(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- the Env API ------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self._reset_counters()
        self.new_game(self.level)
        self.started = True
        intro = (
            f"{self.rules_text()} Each turn, send up to {self.moves_per_turn} moves as "
            "\\boxed{...} using U (up), D (down), L (left) and R (right), e.g. \\boxed{RRD}. "
            f"You have {self.turn_budget} turns."
        )
        return self._board_observation(intro), {"difficulty": self.difficulty, "turn_budget": self.turn_budget}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if not self.started:
            raise RuntimeError(f"{type(self).__name__}: call reset() first")
        self.turns_used += 1
        raw = boxed_answer(Action.coerce(action).text)
        moves = parse_moves(raw) if raw is not None else None
        notes: list[str] = []
        if moves is None:
            self.invalid_actions += 1
            notes.append(
                "Error: no moves found. Put your moves in \\boxed{...} using only U, D, L and R."
            )
        else:
            if len(moves) > self.moves_per_turn:
                notes.append(f"Only the first {self.moves_per_turn} of your {len(moves)} moves were used.")
                moves = moves[: self.moves_per_turn]
            for k, move in enumerate(moves, start=1):
                error = self.try_move(move)
                if error is not None:
                    self.invalid_moves += 1
                    notes.append(f"Error: move {k} ({move}) is not possible: {error}. The remaining moves were skipped.")
                    break
                self.moves_made += 1
                if self.solved():
                    break
        success = self.solved()
        out_of_turns = self.turns_used >= self.turn_budget
        terminated = success or out_of_turns
        if success:
            notes.append("Solved!")
        elif out_of_turns:
            notes.append("Out of turns: the game is over.")
        else:
            left = self.turn_budget - self.turns_used
            notes.append(f"{left} turn{'s' if left != 1 else ''} left.")
        info = {
            "success": success,
            "reward_components": {"solved": 1.0 if success else 0.0},
            "invalid_actions": self.invalid_actions,
            "invalid_moves": self.invalid_moves,
            "moves_made": self.moves_made,
            "turns_used": self.turns_used,
        }
        obs = self._board_observation(" ".join(notes))
        return obs, 1.0 if success else 0.0, terminated, False, info

    def oracle(self) -> Iterator[str]:
        """Plays :meth:`plan` (a solution from the start state) in chunks of the turn's limit."""
        moves = self.plan()
        for i in range(0, len(moves), self.moves_per_turn):
            yield f"\\boxed{{{''.join(moves[i : i + self.moves_per_turn])}}}"

    def random_action(self, rng: np.random.Generator) -> str:
        """1 to ``moves_per_turn`` uniformly random moves."""
        n = int(rng.integers(1, self.moves_per_turn + 1))
        return "\\boxed{" + "".join(str(m) for m in rng.choice(list(MOVES), size=n)) + "}"

    def _board_observation(self, text: str) -> Observation:
        if self.render_kind == "image":
            return Observation([Message.user(text, ImagePart(self.board_image(), id="board"))])
        return Observation([Message.user(f"{text}\n\n{self.board_text()}")])
