"""The multi-turn games: rules, error observations for bad moves (counted, never raised), the
turn budget, both renders, and the oracles playing from feedback."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import relax_gym
from relax_gym.envs import grid_maze, mastermind, sokoban
from relax_gym.envs._grid_game import parse_moves
from relax_gym.types import ImagePart


# -- GridMaze ------------------------------------------------------------------------------------
def test_maze_is_perfect_and_the_board_shows_agent_and_goal() -> None:
    env = grid_maze.GridMazeEnv("medium")
    env.reset(seed=3)
    grid = env.grid
    floor = int((grid == grid_maze.FLOOR).sum())
    cells = env.level.cells**2
    assert floor == 2 * cells - 1  # n cells joined by n - 1 openings: a spanning tree
    assert len(grid_maze.bfs(grid, env.start)) == floor  # and connected
    board = env.board_text()
    assert board.count("A") == 1 and board.count("G") == 1
    assert len(board.splitlines()) == grid.shape[0]


def test_maze_wall_bump_is_an_error_observation_and_counted() -> None:
    env = relax_gym.make("relax/GridMaze-v0", difficulty="easy")
    env.reset(seed=1)
    inner = env.unwrapped
    start = inner.pos
    blocked = next(m for m in "UDLR" if inner.grid[grid_maze.step_pos(start, m)] == grid_maze.WALL)
    obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{blocked}R}}")
    assert "not possible: there is a wall" in obs.text and "remaining moves were skipped" in obs.text
    assert inner.pos == start and info["invalid_moves"] == 1 and info["moves_made"] == 0
    assert not terminated and reward == 0.0
    obs, *_, info = env.step("let me think")
    assert "no moves found" in obs.text and info["invalid_actions"] == 1


def test_maze_turn_budget_ends_the_game_as_a_failure() -> None:
    env = relax_gym.make("relax/GridMaze-v0", difficulty="easy")
    env.reset(seed=0)
    budget = env.unwrapped.turn_budget
    for turn in range(1, budget + 1):
        obs, reward, terminated, truncated, info = env.step("nothing")
        assert terminated == (turn == budget)
    assert "Out of turns" in obs.text and not info["success"] and info["invalid_actions"] == budget
    with pytest.raises(relax_gym.EpisodeEndedError):
        env.step("\\boxed{R}")


def test_maze_image_render_and_extra_moves_are_capped() -> None:
    env = relax_gym.make("relax/GridMaze-v0", difficulty="hard", render="image")
    obs, _ = env.reset(seed=2)
    image = obs.parts(ImagePart)[0].image
    n = env.unwrapped.grid.shape[0]
    assert image.size == (n * env.unwrapped.level.tile,) * 2
    obs, *_ = env.step("\\boxed{" + "UDUDUDUDUDUD" + "}")
    assert "Only the first 8 of your 12 moves were used" in obs.text
    assert obs.parts(ImagePart)


def test_maze_hard_start_and_goal_are_the_longest_path() -> None:
    env = grid_maze.GridMazeEnv("hard")
    env.reset(seed=5)
    cells = [(2 * r + 1, 2 * c + 1) for r in range(8) for c in range(8)]
    longest = max(grid_maze.bfs(env.grid, a)[b][2] for a in cells[::7] for b in cells)
    assert len(env.plan()) >= longest  # no sampled pair of cells is farther apart


# -- Sokoban -------------------------------------------------------------------------------------
def _room(text: str) -> tuple[np.ndarray, set, set, tuple[int, int]]:
    rows = text.strip().splitlines()
    walls = np.array([[ch == "#" for ch in row] for row in rows])
    boxes = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "$*"}
    targets = {(r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in ".*+"}
    player = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "@+")
    return walls, boxes, targets, player


def test_sokoban_push_rules() -> None:
    env = sokoban.SokobanEnv("easy")
    env.reset(seed=0)
    env.walls, env.boxes, env.targets, env.player = _room(
        """
#######
#@$$-.#
#-$---#
#-#---#
#######
"""
    )
    env.targets = frozenset(env.targets)
    assert env.try_move("R") == "the box would hit another box"
    assert env.try_move("U") == "there is a wall"
    assert env.try_move("D") is None and env.player == (2, 1)
    assert env.try_move("R") is None and (2, 3) in env.boxes  # pushed
    assert env.board_text().splitlines()[2] == "#-@$--#"
    env.player, env.boxes = (1, 3), {(1, 4)}
    env.targets = frozenset({(1, 5)})
    assert not env.solved() and env.try_move("R") is None and env.solved()
    assert env.board_text().splitlines()[1] == "#---@*#"


def test_sokoban_levels_start_unsolved_and_the_plan_solves_them() -> None:
    for difficulty in ("easy", "medium", "hard"):
        env = sokoban.SokobanEnv(difficulty)
        for seed in range(15):
            env.reset(seed=seed)
            assert not (env.boxes & set(env.targets)), (difficulty, seed)  # every box starts off target
            assert len(env.boxes) == env.level.boxes == len(env.targets)
            for move in env.plan():
                assert env.try_move(move) is None
            assert env.solved(), (difficulty, seed)


def test_sokoban_shorten_keeps_pushes_and_drops_detours() -> None:
    walls, boxes, _, player = _room(
        """
######
#@---#
#-$--#
#----#
######
"""
    )
    start = sokoban.State(player, frozenset(boxes))
    wander = list("RLRRLL")  # ends where it started, at (1, 1)
    moves = wander + ["R", "D"] + list("LURR")  # then the only push, (2, 2) -> (3, 2), then a walk
    assert sokoban.shorten(walls, start, moves) == ["R", "D"]


# -- Mastermind ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("secret", "guess", "exact", "misplaced"),
    [("1122", "1212", 2, 2), ("1234", "4321", 0, 4), ("1111", "1122", 2, 0), ("1234", "5656", 0, 0), ("3214", "3214", 4, 0)],
)
def test_mastermind_feedback(secret: str, guess: str, exact: int, misplaced: int) -> None:
    s = np.array([[int(d) for d in secret]], dtype=np.int8)
    g = np.array([int(d) for d in guess], dtype=np.int8)
    assert int(mastermind.score(s, g, 6)[0]) == exact * 16 + misplaced


def test_mastermind_score_matches_brute_force() -> None:
    codes = mastermind.all_codes(3, 4)
    for guess in codes[::5]:
        fast = mastermind.score(codes, guess, 4)
        for code, fb in zip(codes, fast, strict=True):
            exact = int((code == guess).sum())
            common = sum(min(list(code).count(c), list(guess).count(c)) for c in range(1, 5))
            assert fb == exact * 16 + common - exact


def test_mastermind_bad_guesses_are_errors_that_use_the_turn() -> None:
    env = relax_gym.make("relax/Mastermind-v0", difficulty="medium")
    env.reset(seed=4)
    for bad in ("\\boxed{123}", "\\boxed{1237}", "\\boxed{abcd}", "1234 without a box"):
        obs, reward, terminated, _, info = env.step(bad)
        assert "not a valid guess" in obs.text and reward == 0.0 and not terminated
    assert info["invalid_actions"] == 4 and info["guesses"] == 0
    obs, *_ = env.step("\\boxed{1, 2, 3, 4}")
    assert obs.text.startswith("Guess 1234:")


def test_mastermind_loss_reveals_the_code() -> None:
    env = relax_gym.make("relax/Mastermind-v0", difficulty="easy")
    env.reset(seed=2)
    secret = "".join(str(int(d)) for d in env.unwrapped.secret)
    wrong = next("".join(p) for p in itertools.product("1234", repeat=3) if "".join(p) != secret)
    for _ in range(env.unwrapped.turn_budget):
        obs, reward, terminated, _, info = env.step(f"\\boxed{{{wrong}}}")
    assert terminated and not info["success"] and f"the code was {secret}" in obs.text


def test_mastermind_oracle_uses_only_feedback() -> None:
    """The oracle's guesses stay consistent with all earlier feedback, and it wins within the
    budget on every 13th secret of the medium game (100 secrets)."""
    env = mastermind.MastermindEnv("medium")
    for secret in mastermind.all_codes(4, 6)[::13]:
        env.reset(seed=0)
        env.secret = secret.copy()
        oracle = env.oracle()
        for _turn in range(env.turn_budget):
            guess = next(oracle)
            code = np.array([int(d) for d in guess[7:-1]], dtype=np.int8)
            for past, e, m in env.history:
                past_arr = np.array([int(d) for d in past], dtype=np.int8)
                assert int(mastermind.score(code[None], past_arr, 6)[0]) == e * 16 + m
            _, _, terminated, _, info = env.step(guess)
            if terminated:
                break
        assert info["success"], secret


# -- move parsing --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "moves"),
    [
        ("RRD", ["R", "R", "D"]),
        ("r r d", ["R", "R", "D"]),
        ("right, up; LEFT", ["R", "U", "L"]),
        ("", None),
        ("RX", None),
        ("go", None),
    ],
)
def test_parse_moves(raw: str, moves: list[str] | None) -> None:
    assert parse_moves(raw) == moves
