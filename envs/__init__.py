"""The environments shipped with relax-gym, registered under the ``relax/`` namespace.

``register_envs`` is the ``relax_gym.envs`` entry point: the registry calls it lazily the first
time an id is looked up, and it records only entry-point strings, so importing this package
does not import any env module.

Every shipped env is one row of :data:`SHIPPED`. Its ``family`` decides which suites it joins:

* ``relax/core-v0`` -- the first env of each family, a quick cross-section;
* ``relax/text-v0`` -- ``text`` and ``game`` envs (games with ``render="text"``);
* ``relax/vision-v0`` -- ``image`` envs and the games with ``render="image"``;
* ``relax/audio-v0`` / ``relax/video-v0`` -- ``audio`` / ``video`` envs;
* ``relax/tools-v0`` -- ``tools`` envs: a ``ToolEnv`` around a task, with the tools it needs
  (calculator, python sandbox, BM25 search, a full-resolution zoom, a shop database).

Adding an env is adding a row; the suites, the baselines command
(``python -m relax_gym.envs.baselines``) and the docs table (``python -m relax_gym.envs.docs``)
pick it up from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax_gym.registration import register, register_suite, registry, shipped_registration, suites

DATASET_ENV_ID = "relax/Dataset-v0"  # not in SHIPPED: it has no data of its own (docs/datasets.md)
FAMILIES: tuple[str, ...] = ("text", "game", "image", "audio", "video", "multimodal", "tools")
SUITE_EPISODES = 20


@dataclass(frozen=True)
class ShippedEnv:
    """One shipped env: its registration and the family that places it in suites."""

    id: str
    entry_point: str
    family: str
    modalities: tuple[str, ...]
    tags: tuple[str, ...]
    max_turns: int
    description: str
    # kwargs the text / vision suites pass (games render as text or as images)
    text_kwargs: dict[str, Any] = field(default_factory=dict)
    vision_kwargs: dict[str, Any] = field(default_factory=dict)


SHIPPED: tuple[ShippedEnv, ...] = (
    ShippedEnv(
        "relax/ArithmeticWord-v0", "relax_gym.envs.arithmetic:ArithmeticWordEnv", "text",
        ("text",), ("math", "text"), 1,
        "solve an arithmetic word problem directly, without tools",
    ),
    ShippedEnv(
        "relax/Mastermind-v0", "relax_gym.envs.mastermind:MastermindEnv", "text",
        ("text",), ("multi-turn", "game", "logic"), 12,
        "crack a hidden digit code from exact/misplaced feedback",
    ),
    ShippedEnv(
        "relax/GridMaze-v0", "relax_gym.envs.grid_maze:GridMazeEnv", "game",
        ("text", "image"), ("multi-turn", "game", "navigation"), 24,
        "walk a maze to the goal, a few moves per turn (render=text|image)",
        text_kwargs={"render": "text"}, vision_kwargs={"render": "image"},
    ),
    ShippedEnv(
        "relax/Sokoban-v0", "relax_gym.envs.sokoban:SokobanEnv", "game",
        ("text", "image"), ("multi-turn", "game", "planning"), 24,
        "push every box onto a target, a few moves per turn (render=text|image)",
        text_kwargs={"render": "text"}, vision_kwargs={"render": "image"},
    ),
    ShippedEnv(
        "relax/SenseCount-v0", "relax_gym.envs.sense_count:SenseCountEnv", "multimodal",
        ("text", "image", "audio", "video"), ("counting", "multimodal"), 1,
        "count dots (image) + beeps (audio) + flashes (video)",
    ),
    ShippedEnv(
        "relax/ShapeCount-v0", "relax_gym.envs.shape_count:ShapeCountEnv", "image",
        ("text", "image"), ("counting", "vision"), 1,
        "count the shapes matching a description (e.g. red triangles)",
    ),
    ShippedEnv(
        "relax/ClockReading-v0", "relax_gym.envs.clock:ClockReadingEnv", "image",
        ("text", "image"), ("vision", "clock"), 1,
        "read the time on an analog clock",
    ),
    ShippedEnv(
        "relax/GridRules-v0", "relax_gym.envs.grid_rules:GridRulesEnv", "image",
        ("text", "image"), ("vision", "reasoning", "arc"), 1,
        "infer an ARC-style grid rule from example pairs, give the test output",
    ),
    ShippedEnv(
        "relax/SceneQuery-v0", "relax_gym.envs.scene_query:SceneQueryEnv", "image",
        ("text", "image"), ("vision", "spatial"), 1,
        "answer a colour / shape / position question about a synthetic scene",
    ),
    ShippedEnv(
        "relax/DTMFDecode-v0", "relax_gym.envs.dtmf:DTMFDecodeEnv", "audio",
        ("text", "audio"), ("audio", "decoding"), 1,
        "name the telephone keys pressed in a clip of DTMF tones",
    ),
    ShippedEnv(
        "relax/ToneCompare-v0", "relax_gym.envs.tone_compare:ToneCompareEnv", "audio",
        ("text", "audio"), ("audio", "comparison"), 1,
        "which tone is the highest / lowest / longest / shortest",
    ),
    ShippedEnv(
        "relax/MorseDecode-v0", "relax_gym.envs.morse:MorseDecodeEnv", "audio",
        ("text", "audio"), ("audio", "decoding"), 1,
        "decode a word sent as Morse-code beeps",
    ),
    ShippedEnv(
        "relax/MotionTrack-v0", "relax_gym.envs.motion_track:MotionTrackEnv", "video",
        ("text", "video"), ("video", "tracking"), 1,
        "follow a bouncing ball: direction, bounces or final quadrant",
    ),
    ShippedEnv(
        "relax/FrameOrder-v0", "relax_gym.envs.frame_order:FrameOrderEnv", "video",
        ("text", "video"), ("video", "ordering", "temporal"), 1,
        "put the lettered, shuffled shots of a process in time order",
    ),
    ShippedEnv(
        "relax/CalcArithmetic-v0", "relax_gym.envs.calc_arithmetic:CalcArithmeticEnv", "tools",
        ("text",), ("tools", "multi-turn", "math"), 8,
        "a chain of large-number arithmetic steps, with a calculator tool",
    ),
    ShippedEnv(
        "relax/ShopDB-v0", "relax_gym.envs.shop_db:ShopDBEnv", "tools",
        ("text",), ("tools", "multi-turn", "stateful", "agent"), 16,
        "serve a shop customer with database tools; graded on the final state",
    ),
    ShippedEnv(
        "relax/PyPuzzle-v0", "relax_gym.envs.py_puzzle:PyPuzzleEnv", "tools",
        ("text",), ("tools", "multi-turn", "code", "math"), 6,
        "compute a loop / simulation / DP answer with the sandboxed python tool",
    ),
    ShippedEnv(
        "relax/ChartZoom-v0", "relax_gym.envs.chart_zoom:ChartZoomEnv", "tools",
        ("text", "image"), ("tools", "multi-turn", "vision", "charts", "zoom"), 8,
        "read tiny bar-chart labels through a zoom tool that returns full-resolution crops",
    ),
    ShippedEnv(
        "relax/DocSearch-v0", "relax_gym.envs.doc_search:DocSearchEnv", "tools",
        ("text",), ("tools", "multi-turn", "retrieval", "multi-hop"), 8,
        "multi-hop questions over a generated encyclopedia, with a BM25 search tool",
    ),
)


def shipped(family: str | None = None) -> list[ShippedEnv]:
    """The shipped envs in registration order, optionally of one family."""
    return [e for e in SHIPPED if family is None or e.family == family]


def register_envs() -> None:
    """Register every shipped env and the suites built from them (idempotent)."""
    if all(e.id in registry for e in SHIPPED) and DATASET_ENV_ID in registry:
        return
    with shipped_registration():  # the reserved relax/ namespace; an id already there is kept
        for e in SHIPPED:
            if e.id not in registry:
                register(
                    e.id, e.entry_point, modalities=e.modalities, tags=e.tags,
                    max_turns=e.max_turns, description=e.description,
                )
        if DATASET_ENV_ID not in registry:
            register(
                DATASET_ENV_ID, "relax_gym.envs.dataset:make_dataset_env",
                description="one row of your dataset per episode (path=, prompt=, answer=, reward=...)",
            )
        _register_suites()


def _register_suites() -> None:
    def suite(name: str, envs: list[ShippedEnv], description: str, kwargs_attr: str | None = None) -> None:
        if not envs or name in suites:  # no empty suites; a suite already there is kept
            return
        env_kwargs = {e.id: dict(getattr(e, kwargs_attr)) for e in envs if kwargs_attr and getattr(e, kwargs_attr)}
        register_suite(
            name, [e.id for e in envs], SUITE_EPISODES, seed=0, description=description, env_kwargs=env_kwargs,
        )

    core = [envs[0] for family in FAMILIES if (envs := shipped(family))]
    suite("relax/core-v0", core, "one env of each family: a quick cross-section")
    suite("relax/text-v0", shipped("text") + shipped("game"), "text-only tasks and games rendered as text", "text_kwargs")
    suite("relax/vision-v0", shipped("image") + shipped("game"), "image tasks and games rendered as images", "vision_kwargs")
    suite("relax/audio-v0", shipped("audio"), "audio tasks")
    suite("relax/video-v0", shipped("video"), "video tasks")
    suite("relax/tools-v0", shipped("tools"), "tasks solved with tool calls")


_LAZY = {"from_dataset": "dataset", "register_datasets": "dataset", "DatasetEnv": "dataset",
         "make_dataset_env": "dataset", "export_env": "export"}


def __getattr__(name: str) -> Any:
    """``from_dataset`` and friends load on first use: they import the rewards and tools."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
