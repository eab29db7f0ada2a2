"""GridMaze: walk through a maze to the goal, a few moves per turn, with feedback each turn.

* **Task** -- a perfect maze (exactly one path between any two cells) drawn from the seed;
  move the agent ``A`` to the goal ``G``.
* **Observation** -- each turn, a user message with feedback (errors, turns left) and the
  board: a text grid (``#`` wall, ``.`` floor) with ``render="text"``, or a Pillow image (dark
  walls, blue agent, green goal) with ``render="image"``.
* **Action** -- up to 8 moves per turn as ``\\boxed{...}`` with ``U``/``D``/``L``/``R``.
  A move into a wall is rejected with an error message, and the rest of that turn's moves
  are skipped; unreadable answers are reported the same way. Both are counted in ``info``.
* **Reward** -- 1.0 on the turn the agent reaches the goal, else 0; ``success`` means it
  reached the goal within the turn budget.
* **Difficulty** -- ``easy``: 3x3 cells (a 7x7 grid), 10 turns. ``medium``: 6x6 cells
  (13x13), 16 turns. ``hard``: 8x8 cells (17x17), 24 turns, start and goal at the two ends of
  the maze's longest path.

The oracle walks the shortest path found by breadth-first search on the visible board.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from ._grid_game import MOVES, GridGameEnv, Pos, step_pos

WALL, FLOOR = 1, 0


@dataclass(frozen=True)
class Level:
    cells: int
    turns: int
    farthest: bool   # goal at the far end of the longest path (else a random distant cell)
    tile: int        # image px per grid square


LEVELS = {
    "easy": Level(3, 10, False, 28),
    "medium": Level(6, 16, False, 18),
    "hard": Level(8, 24, True, 14),
}


def carve_maze(rng: np.random.Generator, cells: int) -> np.ndarray:
    """A perfect maze by randomised depth-first search; returns a (2n+1)^2 grid of WALL/FLOOR."""
    size = 2 * cells + 1
    grid = np.full((size, size), WALL, dtype=np.int8)
    start = (0, 0)
    seen = {start}
    stack = [start]
    grid[1, 1] = FLOOR
    while stack:
        r, c = stack[-1]
        options = [(r + dr, c + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
                   if 0 <= r + dr < cells and 0 <= c + dc < cells and (r + dr, c + dc) not in seen]
        if not options:
            stack.pop()
            continue
        nr, nc = options[int(rng.integers(0, len(options)))]
        grid[2 * nr + 1, 2 * nc + 1] = FLOOR
        grid[r + nr + 1, c + nc + 1] = FLOOR  # the wall between the two cells
        seen.add((nr, nc))
        stack.append((nr, nc))
    return grid


def bfs(grid: np.ndarray, start: Pos) -> dict[Pos, tuple[Pos | None, str, int]]:
    """Breadth-first search over floor squares: each reached square -> (previous, move, depth)."""
    came: dict[Pos, tuple[Pos | None, str, int]] = {start: (None, "", 0)}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        depth = came[pos][2]
        for move in MOVES:
            nxt = step_pos(pos, move)
            if nxt not in came and grid[nxt] == FLOOR:
                came[nxt] = (pos, move, depth + 1)
                queue.append(nxt)
    return came


def path_moves(came: dict[Pos, tuple[Pos | None, str, int]], goal: Pos) -> list[str]:
    moves: list[str] = []
    pos: Pos | None = goal
    while pos is not None and came[pos][0] is not None:
        prev, move, _ = came[pos]
        moves.append(move)
        pos = prev
    return moves[::-1]


class GridMazeEnv(GridGameEnv):
    """Walk a maze to the goal over several turns (text or image board)."""

    levels = LEVELS
    max_turns = max(level.turns for level in LEVELS.values())

    def new_game(self, level: Level) -> None:
        rng = self.np_random
        self.grid = carve_maze(rng, level.cells)
        cells = [(2 * r + 1, 2 * c + 1) for r in range(level.cells) for c in range(level.cells)]
        if level.farthest:
            # the ends of the longest path: the cell farthest from any cell, then the farthest from it
            first = bfs(self.grid, cells[0])
            end_a = max(cells, key=lambda p: (first[p][2], p))
            from_a = bfs(self.grid, end_a)
            end_b = max(cells, key=lambda p: (from_a[p][2], p))
            self.start, self.goal = (end_a, end_b) if rng.random() < 0.5 else (end_b, end_a)
        else:  # a random start, and a goal at least half the longest distance from it
            start = cells[int(rng.integers(0, len(cells)))]
            dist = bfs(self.grid, start)
            longest = max(dist[p][2] for p in cells)
            far_enough = [p for p in cells if dist[p][2] >= longest // 2 and p != start]
            self.start, self.goal = start, far_enough[int(rng.integers(0, len(far_enough)))]
        self.pos = self.start

    def try_move(self, move: str) -> str | None:
        nxt = step_pos(self.pos, move)
        if self.grid[nxt] == WALL:
            return "there is a wall"
        self.pos = nxt
        return None

    def solved(self) -> bool:
        return self.pos == self.goal

    def plan(self) -> list[str]:
        return path_moves(bfs(self.grid, self.start), self.goal)

    def rules_text(self) -> str:
        legend = "# is a wall, . is floor, A is you, G is the goal" if self.render_kind == "text" else (
            "dark squares are walls, the blue circle is you, the green square is the goal"
        )
        return f"Walk through the maze to the goal ({legend}). Each move goes one square."

    def board_text(self) -> str:
        chars = np.where(self.grid == WALL, "#", ".").astype("<U1")
        chars[self.goal] = "G"
        chars[self.pos] = "A"
        return "\n".join("".join(row) for row in chars)

    def board_image(self) -> Image.Image:
        t = self.level.tile
        n = self.grid.shape[0]
        img = Image.new("RGB", (n * t, n * t), (240, 240, 235))
        draw = ImageDraw.Draw(img)
        for (r, c), v in np.ndenumerate(self.grid):
            if v == WALL:
                draw.rectangle((c * t, r * t, c * t + t - 1, r * t + t - 1), fill=(45, 45, 55))
        gr, gc = self.goal
        draw.rectangle((gc * t + 2, gr * t + 2, gc * t + t - 3, gr * t + t - 3), fill=(40, 170, 70))
        pr, pc = self.pos
        draw.ellipse((pc * t + 2, pr * t + 2, pc * t + t - 3, pr * t + t - 3), fill=(40, 90, 230))
        return img
