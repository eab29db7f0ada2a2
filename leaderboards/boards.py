"""The leaderboards relax-gym publishes: which suite each ranks, and how much evidence it asks for.

A board is a suite plus the episode budget every entry should use, so entries are measured
alike. ``relax-gym leaderboard --make-baselines --board core`` runs the random and oracle
baselines (and any extra agents given) with these settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Board:
    name: str
    suite: str
    episodes: int
    attempts: int
    title: str
    description: str


BOARDS: dict[str, Board] = {
    b.name: b
    for b in (
        Board(
            "core",
            "relax/core-v0",
            20,
            4,
            "relax-gym core",
            "one env of each family (text, game, image, audio, video, multimodal): a quick cross-section",
        ),
        Board("text", "relax/text-v0", 20, 4, "relax-gym text", "text-only tasks and games rendered as text"),
        Board("vision", "relax/vision-v0", 20, 4, "relax-gym vision", "image tasks and games rendered as images"),
        Board("audio", "relax/audio-v0", 20, 4, "relax-gym audio", "audio tasks"),
        Board("video", "relax/video-v0", 20, 4, "relax-gym video", "video tasks"),
    )
}


def get_board(name: str) -> Board:
    try:
        return BOARDS[name]
    except KeyError:
        raise KeyError(f"no leaderboard {name!r}; known: {', '.join(BOARDS)}") from None


def board_for_suite(suite: str | None) -> Board | None:
    return next((b for b in BOARDS.values() if b.suite == suite), None)


__all__ = ["BOARDS", "Board", "board_for_suite", "get_board"]
