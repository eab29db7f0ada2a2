"""Sokoban: push every box onto a target, a few moves per turn, with feedback each turn.

* **Task** -- a small walled room with boxes and as many targets; the player walks and pushes
  (never pulls) one box at a time. Put every box on a target.
* **Observation** -- each turn, a user message with feedback (errors, turns left) and the
  board: XSB text (``#`` wall, ``-`` floor, ``.`` target, ``$`` box, ``*`` box on target,
  ``@`` player, ``+`` player on target) with ``render="text"``, or a Pillow image with
  ``render="image"``.
* **Action** -- up to 10 moves per turn as ``\\boxed{...}`` with ``U``/``D``/``L``/``R``.
  Walking into a wall, or pushing a box into a wall or another box, is rejected with an error
  message and the rest of that turn's moves are skipped; unreadable answers are reported the
  same way. Both are counted in ``info``.
* **Reward** -- 1.0 on the turn the last box reaches a target, else 0; ``success`` means the
  room was solved within the turn budget.
* **Difficulty** -- ``easy``: 1 box in a 5x5 room, 10 turns. ``medium``: 2 boxes in a 6x6 room
  with up to 2 inner wall squares, 16 turns. ``hard``: 3 boxes in a 7x7 room with up to 4
  inner wall squares, 24 turns. Every box starts off its target when the generator can manage
  it within 50 tries (it nearly always can).

Levels are made by playing backwards from the solved room (the player pulls boxes off their
targets), so every level is solvable; reversing that play gives the oracle's solution, with
the walks between pushes shortened by breadth-first search.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from ._grid_game import MOVES, GridGameEnv, Pos, step_pos

_OPPOSITE = {"U": "D", "D": "U", "L": "R", "R": "L"}


@dataclass(frozen=True)
class Level:
    boxes: int
    room: int          # interior is room x room
    inner_walls: int
    turns: int
    min_pushes: int
    pull_steps: int    # length of the backwards play
    tile: int


LEVELS = {
    "easy": Level(1, 5, 0, 10, 3, 40, 28),
    "medium": Level(2, 6, 2, 16, 6, 100, 26),
    "hard": Level(3, 7, 4, 24, 10, 200, 24),
}


@dataclass
class State:
    player: Pos
    boxes: frozenset[Pos]


class SokobanEnv(GridGameEnv):
    """Push the boxes onto the targets over several turns (text or image board)."""

    levels = LEVELS
    max_turns = max(level.turns for level in LEVELS.values())
    moves_per_turn = 10

    # -- generation -----------------------------------------------------------------------------
    def new_game(self, level: Level) -> None:
        """Draw rooms and backwards plays until one has every box off its target and enough
        pushes (almost always within a few tries); otherwise keep the best one seen."""
        best: tuple[tuple[int, int], tuple[np.ndarray, frozenset[Pos], State, list[str]]] | None = None
        limit = int(0.6 * self.moves_per_turn * level.turns)  # keep the solution well inside the budget
        for _ in range(50):
            walls = self._room(level)
            floor = [tuple(int(v) for v in p) for p in np.argwhere(~walls)]
            picks = self.np_random.choice(len(floor), size=level.boxes + 1, replace=False)
            targets = frozenset(floor[int(i)] for i in picks[:-1])
            state, pushes, reverse_moves = self._pull_back(walls, State(floor[int(picks[-1])], targets), level.pull_steps)
            off_target = len(state.boxes - targets)
            if off_target == 0:
                continue
            solution = shorten(walls, state, [_OPPOSITE[m] for m in reversed(reverse_moves)])
            if len(solution) > limit:
                continue
            score = (off_target, min(pushes, level.min_pushes))
            if best is None or score > best[0]:
                best = (score, (walls, targets, state, solution))
            if score == (level.boxes, level.min_pushes):
                break
        game = best[1] if best is not None else self._one_push_room(level)  # the fallback is never seen
        self.walls, self.targets, start_state, self.solution = game
        self.player, self.boxes = start_state.player, set(start_state.boxes)

    def _room(self, level: Level) -> np.ndarray:
        """A bordered room with a few inner wall squares that keep the floor connected."""
        n = level.room + 2
        walls = np.zeros((n, n), dtype=bool)
        walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
        for _ in range(level.inner_walls):
            r, c = (int(v) for v in self.np_random.integers(1, n - 1, size=2))
            walls[r, c] = True
            if not _connected(walls):
                walls[r, c] = False
        return walls

    def _pull_back(self, walls: np.ndarray, solved: State, steps: int) -> tuple[State, int, list[str]]:
        """Random backwards play from the solved room; returns the start state, the number of
        pulls and the backwards moves. Half the steps prefer a pull when one is possible, so
        boxes travel rather than the player wandering."""
        rng = self.np_random
        player, boxes = solved.player, set(solved.boxes)
        moves: list[str] = []
        pulls = 0
        for _ in range(steps):
            free = [m for m in MOVES if not walls[step_pos(player, m)] and step_pos(player, m) not in boxes]
            if not free:
                break
            pulling = [m for m in free if step_pos(player, _OPPOSITE[m]) in boxes]
            options = pulling if pulling and rng.random() < 0.5 else free
            move = options[int(rng.integers(0, len(options)))]
            behind = step_pos(player, _OPPOSITE[move])
            if behind in boxes and rng.random() < 0.8:
                boxes.remove(behind)
                boxes.add(player)
                pulls += 1
            player = step_pos(player, move)
            moves.append(move)
        return State(player, frozenset(boxes)), pulls, moves

    def _one_push_room(self, level: Level) -> tuple[np.ndarray, frozenset[Pos], State, list[str]]:
        n = level.room + 2
        walls = np.zeros((n, n), dtype=bool)
        walls[0, :] = walls[-1, :] = walls[:, 0] = walls[:, -1] = True
        return walls, frozenset({(1, 3)}), State((1, 1), frozenset({(1, 2)})), ["R"]

    # -- play -----------------------------------------------------------------------------------
    def try_move(self, move: str) -> str | None:
        nxt = step_pos(self.player, move)
        if self.walls[nxt]:
            return "there is a wall"
        if nxt in self.boxes:
            beyond = step_pos(nxt, move)
            if self.walls[beyond]:
                return "the box would hit a wall"
            if beyond in self.boxes:
                return "the box would hit another box"
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
        self.player = nxt
        return None

    def solved(self) -> bool:
        return self.boxes == set(self.targets)

    def plan(self) -> list[str]:
        return list(self.solution)

    def rules_text(self) -> str:
        legend = (
            "# wall, - floor, . target, $ box, * box on a target, @ you, + you on a target"
            if self.render_kind == "text"
            else "dark squares are walls, rings are targets, brown squares are boxes (green once on a "
            "target), the blue circle is you"
        )
        return (
            f"Sokoban: push every box onto a target ({legend}). You can push one box at a time by "
            "walking into it; you cannot pull boxes."
        )

    def board_text(self) -> str:
        rows = []
        for r in range(self.walls.shape[0]):
            row = []
            for c in range(self.walls.shape[1]):
                p = (r, c)
                if self.walls[p]:
                    ch = "#"
                elif p in self.boxes:
                    ch = "*" if p in self.targets else "$"
                elif p == self.player:
                    ch = "+" if p in self.targets else "@"
                else:
                    ch = "." if p in self.targets else "-"
                row.append(ch)
            rows.append("".join(row))
        return "\n".join(rows)

    def board_image(self) -> Image.Image:
        t = self.level.tile
        n = self.walls.shape[0]
        img = Image.new("RGB", (n * t, n * t), (235, 230, 220))
        draw = ImageDraw.Draw(img)
        for r in range(n):
            for c in range(n):
                x, y = c * t, r * t
                if self.walls[r, c]:
                    draw.rectangle((x, y, x + t - 1, y + t - 1), fill=(90, 70, 60))
                if (r, c) in self.targets:
                    draw.ellipse((x + 5, y + 5, x + t - 6, y + t - 6), outline=(200, 40, 40), width=3)
                if (r, c) in self.boxes:
                    fill = (60, 170, 80) if (r, c) in self.targets else (190, 130, 60)
                    draw.rectangle((x + 3, y + 3, x + t - 4, y + t - 4), fill=fill, outline=(70, 45, 20), width=2)
        pr, pc = self.player
        draw.ellipse((pc * t + 5, pr * t + 5, pc * t + t - 6, pr * t + t - 6), fill=(40, 90, 230))
        return img


def _connected(walls: np.ndarray) -> bool:
    floor = [tuple(int(v) for v in p) for p in np.argwhere(~walls)]
    if not floor:
        return False
    seen = {floor[0]}
    queue = deque([floor[0]])
    while queue:
        pos = queue.popleft()
        for move in MOVES:
            nxt = step_pos(pos, move)
            if not walls[nxt] and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen) == len(floor)


def _walk(walls: np.ndarray, boxes: set[Pos], start: Pos, goal: Pos) -> list[str]:
    """Shortest walk from ``start`` to ``goal`` around walls and boxes (BFS)."""
    came: dict[Pos, tuple[Pos, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if pos == goal:
            break
        for move in MOVES:
            nxt = step_pos(pos, move)
            if nxt not in came and not walls[nxt] and nxt not in boxes:
                came[nxt] = (pos, move)
                queue.append(nxt)
    moves: list[str] = []
    pos = goal
    while came.get(pos) is not None:
        prev, move = came[pos]  # type: ignore[misc]
        moves.append(move)
        pos = prev
    return moves[::-1]


def shorten(walls: np.ndarray, start: State, moves: list[str]) -> list[str]:
    """Replay a solution forwards, keeping every push and replacing the walking before each push
    by a shortest walk (the walk after the last push is dropped: the room is solved by then)."""
    player, boxes = start.player, set(start.boxes)
    walk_from = player
    out: list[str] = []
    for move in moves:
        nxt = step_pos(player, move)
        if nxt in boxes:
            out += _walk(walls, boxes, walk_from, player)
            out.append(move)
            boxes.remove(nxt)
            boxes.add(step_pos(nxt, move))
            walk_from = nxt
        player = nxt
    return out
