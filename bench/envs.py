"""Throughput of the shipped envs, media rendering included, and their share of a rollout.

    python bench/envs.py                 # prints a Markdown table (about a minute on 2 cores)
    python bench/envs.py --write         # and replaces "## Environments" in docs/benchmarks.md

For every shipped env (the grid games once per render) at one difficulty (default ``hard``,
the heaviest), over oracle episodes on fixed seeds:

* resets/s and steps/s -- the env alone, which includes drawing images, synthesising audio and
  rendering video frames with Pillow/numpy;
* encode -- ``format_observation(obs, "openai")`` per observation: PNG / WAV / H.264 encoding
  into data URLs, what a rollout sends to an inference server;
* env ms/episode -- reset + every step (rendering included) for a whole episode, and the same
  plus encoding every observation;
* share -- env time / (env time + turns x 20 ms): the env's part of an episode's wall time
  when the model needs 20 ms per turn, without and with the encoding. Below 50 % the model,
  not the env, sets the pace of a rollout -- and real models need far more than 20 ms a turn.

All figures are medians over the episodes, timed as CPU time of the calling thread
(``time.thread_time``): on a shared machine, time spent preempted by other jobs would otherwise
swamp millisecond-scale figures. Everything timed runs in this thread (x264 is set to one
thread), so CPU time is the work the env costs a rollout worker. The tool envs (family
``tools``) run their tools on worker threads (sync tools) and in an event loop, so they are
timed as CPU time of the whole process (``time.process_time``); an env with the ``python``
tool runs the code in the sandbox's own process, which no CPU clock of ours sees, so it is
timed by the wall clock (``time.perf_counter``), preemption included, with an untimed pause of
one model turn (20 ms) before each step, as a rollout would leave between tool calls.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from relax_gym.envs import SHIPPED

import relax_gym
from relax_gym.types import Observation

MODEL_S_PER_TURN = 0.020
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
SECTION = "## Environments"


def bench_env(
    env_id: str,
    kwargs: dict[str, Any],
    episodes: int,
    clock: Callable[[], float] = time.thread_time,
    pause_s: float = 0.0,
) -> dict[str, float]:
    """Two passes, so neither disturbs the other's timing: play every episode (reset and steps
    timed, observations kept), then encode the kept observations (timed). ``pause_s`` is slept,
    untimed, before each step: the model's turn, during which a rollout's sandbox pool refills."""
    env = relax_gym.make(env_id, **kwargs)
    env.format_observation(env.reset(seed=0)[0], "openai")  # warm caches outside the timing
    resets, steps, env_only, turns = [], [], [], []
    kept: list[list[Observation]] = []
    for seed in range(1, episodes + 1):
        t0 = clock()
        obs, _ = env.reset(seed=seed)
        resets.append(clock() - t0)
        episode_obs, rendering = [obs], resets[-1]
        for action in env.oracle():
            time.sleep(pause_s)
            t0 = clock()
            obs, _, terminated, truncated, _ = env.step(action)
            steps.append(clock() - t0)
            rendering += steps[-1]
            episode_obs.append(obs)
            if terminated or truncated:
                break
        env_only.append(rendering)
        turns.append(len(episode_obs) - 1)
        kept.append(episode_obs)
    encodes, with_encode = [], []
    for rendering, episode_obs in zip(env_only, kept, strict=True):
        encoding = 0.0
        for obs in episode_obs:
            if obs.messages:
                t0 = clock()
                env.format_observation(obs, "openai")
                encodes.append(clock() - t0)
                encoding += encodes[-1]
        with_encode.append(rendering + encoding)
    env.close()
    n_turns = statistics.median(turns)
    model_s = n_turns * MODEL_S_PER_TURN
    env_s, full_s = statistics.median(env_only), statistics.median(with_encode)
    return {
        "resets_per_s": 1 / statistics.median(resets),
        "steps_per_s": 1 / statistics.median(steps),
        "encode_ms": 1e3 * statistics.median(encodes),
        "turns": n_turns,
        "env_ms": 1e3 * env_s,
        "full_ms": 1e3 * full_s,
        "share": env_s / (env_s + model_s),
        "share_encoded": full_s / (full_s + model_s),
    }


def table(difficulty: str, episodes: int) -> str:
    lines = [
        "| env | render | clock | resets/s | steps/s | encode ms/obs | turns | env ms/episode (+ encode) "
        "| share vs 20 ms/turn model (+ encode) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    tool_envs = {e.id for e in SHIPPED if e.family == "tools"}
    clocks = {"thread CPU": time.thread_time, "process CPU": time.process_time, "wall": time.perf_counter}
    cases = [(e.id, "") for e in SHIPPED] + [(e.id, "image") for e in SHIPPED if e.vision_kwargs]
    shares = []
    for env_id, render in cases:
        kwargs: dict[str, Any] = {"difficulty": difficulty}
        if render:
            kwargs["render"] = render
        clock = _clock(env_id) if env_id in tool_envs else "thread CPU"
        r = bench_env(env_id, kwargs, episodes, clocks[clock], MODEL_S_PER_TURN if clock == "wall" else 0.0)
        name = env_id + (f" ({render})" if render else "")
        shares.append((r["share"], r["share_encoded"], name))
        lines.append(
            f"| `{env_id}` | {render or 'default'} | {clock} | "
            f"{r['resets_per_s']:,.0f} | {r['steps_per_s']:,.0f} | "
            f"{r['encode_ms']:.2f} | {r['turns']:g} | {r['env_ms']:.1f} ({r['full_ms']:.1f}) | "
            f"{100 * r['share']:.1f}% ({100 * r['share_encoded']:.1f}%) |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    worst, worst_enc = max(shares), max(shares, key=lambda x: x[1])
    verdict = (
        "every env stays below 50 %, so even a 20 ms/turn model, not the env, sets the pace of a rollout"
        if worst_enc[1] < 0.5
        else "at least one env takes more than half of an episode's time against a 20 ms/turn model"
    )
    lines += [
        "",
        f"Largest share: {100 * worst[0]:.1f}% ({worst[2]}); with encoding {100 * worst_enc[1]:.1f}% ({worst_enc[2]}): "
        f"{verdict}.",
    ]
    return "\n".join(lines)


def _clock(env_id: str) -> str:
    """How to time a tool env: process CPU for in-process tools, wall when code runs in the sandbox."""
    env = relax_gym.make(env_id)
    try:
        names = {t.name for t in env.env.registry}  # EpisodeGuard -> ToolEnv
    finally:
        env.close()
    return "wall" if "python" in names else "process CPU"


def section(difficulty: str, episodes: int, body: str, load: float) -> str:
    return "\n".join([
        SECTION,
        "",
        f"Measured by `python bench/envs.py --write` (difficulty `{difficulty}`, the heaviest level; "
        f"medians over {episodes} oracle episodes per env) on the shared 2-core CPU box, with other "
        f"jobs running (1-minute load average {load:.1f} at the start); times are CPU time of the "
        "calling thread (`time.thread_time`), so preemption by those jobs is not counted, but treat "
        "the figures as orders of magnitude. The tool envs run their tools on worker threads and in an "
        "event loop, so they are timed as CPU time of the whole process (clock *process CPU*, "
        "`time.process_time`); `relax/PyPuzzle-v0` runs code in the sandbox's own process, which no CPU "
        "clock of the bench sees, so it is timed by the wall clock (clock *wall*, `time.perf_counter`), "
        "with an untimed 20 ms pause before each step standing in for the model's turn (in which a "
        "rollout's sandbox pool refills; back-to-back calls measure the refill instead, see Tools): "
        "its row includes preemption by the other jobs and the oracle's puzzle programs themselves "
        "(a sieve below 3x10^5 takes about 20 ms), so it is pessimistic. A tool env's "
        "turns include its tool turns, and its steps include running the tools. "
        "resets/s and steps/s "
        "include all media rendering (Pillow/numpy); *encode* is `format_observation(obs, \"openai\")` "
        "per observation (PNG/WAV/H.264 data URLs); *env ms/episode* adds up the reset and every step "
        "of an episode (in brackets: plus encoding every observation); *share* is env time / (env "
        "time + turns x 20 ms), the env's part of an episode's wall time against a model that needs "
        "20 ms per turn (in brackets: with the encoding). The encoding is the core's media code, "
        "paid only by consumers that ship media as data URLs (OpenAI-style servers); in-process "
        "consumers take the `\"hf\"` style (PIL images and arrays) and skip it.",
        "",
        body,
        "",
    ])


def write_section(text: str, path: Path = DOC) -> None:
    """Replace (or append) this area's section, leaving every other section as it is."""
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(current):
        new = pattern.sub(lambda _: text + "\n", current, count=1)
    else:
        new = current.rstrip("\n") + "\n\n" + text
    path.write_text(new.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--difficulty", default="hard", choices=["easy", "medium", "hard"])
    parser.add_argument("--episodes", type=int, default=30, help="oracle episodes per env (default 30)")
    parser.add_argument("--write", action="store_true", help=f"replace '{SECTION}' in {DOC}")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    text = section(args.difficulty, args.episodes, table(args.difficulty, args.episodes), load)
    print(text)
    if args.write:
        write_section(text)
        print(f"wrote {SECTION!r} in {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
