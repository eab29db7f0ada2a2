"""Run an agent on the planned episodes of an :class:`EvalConfig`, concurrently, resumably.

Output folder::

    config.json           the config (and its hash); --resume checks it
    episodes.jsonl        one row per episode, appended and flushed as each one ends
    summary.json          scores, config, versions (rewritten at the end of every invocation)
    transcripts/ENV/sSEED-aATTEMPT.json   the conversation, steps and reasoning of each episode
    media/                every image / audio clip / video once, named by content hash
    retried_errors.jsonl  rows of errored episodes that a --resume ran again (kept, not lost)
    unreadable_rows.txt   lines of episodes.jsonl a --resume could not parse (e.g. torn by a kill)

Each episode is keyed ``(env_id, seed, attempt)``; its task comes from the seed and the agent's
randomness from the whole key, so an episode replays identically whenever and wherever it runs,
and ``--resume`` can skip finished keys and run the rest. An episode that fails -- the agent
times out, the env raises -- becomes a row with ``error`` set and counts as a failure; the run
goes on. A :class:`FatalAgentError` (a modality the model cannot take, a wrong URL) stops the
run: what finished is kept and a later ``--resume`` continues.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Unpack

from relax_gym.core import EpisodeGuard
from relax_gym.errors import RelaxGymError
from relax_gym.registration import make
from relax_gym.transcript import MediaWriter, message_to_record
from relax_gym.types import Message, Observation

from . import baselines as baselines_mod
from .agents import Agent, AgentError, AgentSession, ContextExhausted, EpisodeInfo, FatalAgentError, TurnResult
from .config import EvalConfig, EvalTarget
from .records import (
    EpisodeKeyTuple,
    EpisodeRecord,
    RecordWriter,
    key_slug,
    latest_by_key,
    read_records,
    write_records_atomic,
)
from .scoring import Baseline
from .summary import build_summary


class RunError(RelaxGymError):
    """The output folder cannot be used as asked (exists without --resume, other config...)."""


@dataclass
class RunResult:
    out: Path
    summary: dict[str, Any]
    ran: int
    skipped: int
    fatal: str | None = None
    problems: list[str] = field(default_factory=list)


class _EnvPool:
    """Idle envs per id, so concurrent episodes reuse built envs instead of rebuilding them."""

    def __init__(self, config: EvalConfig) -> None:
        self.config = config
        self.idle: dict[str, list[EpisodeGuard]] = {}

    async def acquire(self, env_id: str) -> EpisodeGuard:
        free = self.idle.get(env_id)
        if free:
            return free.pop()
        info = self.config.env(env_id)
        return await asyncio.to_thread(make, env_id, max_turns=self.config.max_turns, **info.kwargs)

    def release(self, env_id: str, env: EpisodeGuard, healthy: bool) -> None:
        if healthy:
            self.idle.setdefault(env_id, []).append(env)
        else:
            env.close()

    def close(self) -> None:
        for envs in self.idle.values():
            for env in envs:
                env.close()
        self.idle.clear()


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: repr(o)[:200]))


def _invalid_in_step(info: dict[str, Any]) -> int:
    if info.get("invalid_action"):
        return 1
    return 1 if info.get("well_formed") is False else 0


@dataclass
class _EpisodeLog:
    """What an episode gathers besides its record's counters: transcript, steps, sums."""

    transcript: list[tuple[Message, dict[str, Any]]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    media_sent: Counter[str] = field(default_factory=Counter)
    components: Counter[str] = field(default_factory=Counter)
    invalid_steps: int = 0

    def observe(self, obs: Observation) -> None:
        self.transcript += [(m, {}) for m in obs.messages]

    def add_turn(self, rec: EpisodeRecord, turn: TurnResult) -> None:
        """The agent's turn: usage and call counts on the record, its message in the transcript."""
        rec.prompt_tokens += turn.prompt_tokens
        rec.completion_tokens += turn.completion_tokens
        self.media_sent.update(turn.media_sent)
        rec.tool_calls += len(turn.action.tool_calls)
        rec.parse_errors += len(turn.action.parse_errors)
        extra: dict[str, Any] = {"reasoning": turn.reasoning} if turn.reasoning else {}
        if turn.action.parse_errors:
            extra["parse_errors"] = list(turn.action.parse_errors)
        rec.media_errors += len(turn.media_errors)
        if turn.media_errors:
            extra["media_errors"] = list(turn.media_errors)
        self.transcript.append((turn.message, extra))

    def add_step(
        self, rec: EpisodeRecord, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        """The env's step: turn count and return on the record, the step's info in the log."""
        rec.turns += 1
        rec.return_ += float(reward)
        self.components.update(info.get("reward_components", {}))
        self.invalid_steps += _invalid_in_step(info)
        self.steps.append(
            {
                "turn": rec.turns,
                "reward": float(reward),
                "terminated": terminated,
                "truncated": truncated,
                "info": _jsonable(info),
            }
        )


async def _play(
    env: EpisodeGuard, session: AgentSession, obs: Observation, rec: EpisodeRecord, log: _EpisodeLog
) -> None:
    """Alternate agent turns and env steps until the episode ends; success and invalid actions
    come from the last step's info."""
    info: dict[str, Any] = {}
    for _ in range(env.max_turns):
        try:
            turn = await session.act(obs)
        except ContextExhausted:  # the model's context is full: truncated, as a rollout at its budget
            rec.truncated = rec.context_exhausted = True
            info = {}
            break
        log.add_turn(rec, turn)
        obs, reward, terminated, truncated, info = await env.astep(turn.action)
        log.add_step(rec, reward, terminated, truncated, info)
        log.observe(obs)
        if terminated or truncated:
            rec.terminated, rec.truncated = terminated, truncated
            break
    else:  # EpisodeGuard truncates at max_turns, so this means a broken guard
        raise RelaxGymError(f"{rec.env_id}: the episode did not end within {env.max_turns} turns")
    rec.success = bool(info.get("success", False))
    counted = info.get("invalid_actions")
    if isinstance(counted, int) and not isinstance(counted, bool):  # the env's own count
        rec.invalid_actions = int(counted)
    else:
        rec.invalid_actions = log.invalid_steps


class EvalRunner:
    """Runs one config with one agent into one output folder."""

    def __init__(
        self,
        config: EvalConfig,
        agent: Agent,
        out: str | Path,
        *,
        concurrency: int = 8,
        resume: bool = False,
        progress: bool = True,
        baselines_file: str | Path | None = None,
        on_record: Callable[[EpisodeRecord], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.config = config
        self.agent = agent
        self.out = Path(out)
        self.concurrency = concurrency
        self.resume = resume
        self.progress = progress
        self.baselines_file = baselines_file
        self.on_record = on_record
        self._media_lock = threading.Lock()
        self.problems: list[str] = []

    # -- the output folder ------------------------------------------------------------------------
    def _prepare_folder(self) -> dict[EpisodeKeyTuple, EpisodeRecord]:
        """Check the folder against --resume and the config; return the finished rows to keep."""
        cfg_file = self.out / "config.json"
        episodes = self.out / "episodes.jsonl"
        if cfg_file.exists() or episodes.exists():
            if not self.resume:
                raise RunError(f"{self.out} already holds a run; pass --resume to continue it or choose another --out")
            try:
                old = json.loads(cfg_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise RunError(f"cannot resume {self.out}: config.json unreadable ({exc})") from None
            if old.get("config_hash") != self.config.hash():
                raise RunError(
                    f"cannot resume {self.out}: it was run with config {old.get('config_hash')}, this one is "
                    f"{self.config.hash()} (agent, sampling, envs, episodes, attempts, seed or turn limit differ)"
                )
        self.out.mkdir(parents=True, exist_ok=True)
        bad: list[str] = []
        rows = read_records(episodes, problems=self.problems, bad_lines=bad)
        if bad:  # e.g. the line being written when the process was killed: keep it aside
            with (self.out / "unreadable_rows.txt").open("a", encoding="utf-8") as f:
                f.write("\n".join(bad) + "\n")
        planned = {k for k, _ in self.config.keys()}
        latest = latest_by_key(r for r in rows if r.key in planned)
        keep = {k: r for k, r in latest.items() if r.finished}
        retried = [r for r in rows if r.key in planned and not r.finished]
        if retried:
            with (self.out / "retried_errors.jsonl").open("a", encoding="utf-8") as f:
                for r in retried:
                    f.write(r.to_json() + "\n")
        if bad or len(keep) != len(rows):  # rewrite: only the kept rows, every line complete
            write_records_atomic(episodes, sorted(keep.values(), key=lambda r: r.key))
        cfg = {"config": self.config.to_dict(), "config_hash": self.config.hash()}
        cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return keep

    # -- one episode ------------------------------------------------------------------------------
    async def _episode(self, pool: _EnvPool, media: MediaWriter, key: EpisodeKeyTuple, index: int) -> EpisodeRecord:
        """Play one episode; an agent or env failure ends it with an error on its record."""
        env_id, seed, attempt = key
        rec = self._new_record(key, index)
        log = _EpisodeLog()
        t0 = time.perf_counter()
        healthy = True
        session = None
        env = await pool.acquire(env_id)
        try:
            obs, _ = await env.areset(seed=seed)
            log.observe(obs)
            episode = EpisodeInfo.create(env_id, seed, attempt, int(self.config.sampling.get("seed", 0)))
            session = self.agent.session(env, episode)
            await _play(env, session, obs, rec, log)
        except FatalAgentError:
            healthy = False
            raise
        except AgentError as exc:
            rec.error, rec.error_type = str(exc), "agent"
        except RelaxGymError as exc:
            rec.error, rec.error_type = str(exc), "env"
            healthy = False
        except Exception as exc:  # noqa: BLE001 -- one broken episode must not end the run
            rec.error, rec.error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
            healthy = False
        finally:
            if session is not None:
                await session.aclose()
            pool.release(env_id, env, healthy)
        rec.success = rec.success and rec.error is None
        rec.reward_components = {k: float(v) for k, v in sorted(log.components.items())}
        rec.media_sent = dict(sorted(log.media_sent.items()))
        rec.wall_s = round(time.perf_counter() - t0, 4)
        rec.transcript = await asyncio.to_thread(self._write_transcript, media, rec, log.transcript, log.steps)
        return rec

    def _new_record(self, key: EpisodeKeyTuple, index: int) -> EpisodeRecord:
        env_id, seed, attempt = key
        info_env = self.config.env(env_id)
        return EpisodeRecord(  # type: ignore[call-arg]  # mypy sees only the alias "return"; it defaults to 0
            env_id=env_id,
            env_version=info_env.version,
            env_kwargs=info_env.kwargs,
            seed=seed,
            index=index,
            attempt=attempt,
            agent=str(self.config.agent.get("spec", "")),
        )

    def _write_transcript(
        self,
        media: MediaWriter,
        rec: EpisodeRecord,
        messages: list[tuple[Message, dict[str, Any]]],
        steps: list[dict[str, Any]],
    ) -> str | None:
        rel = Path("transcripts") / (key_slug(rec.key) + ".json")
        path = self.out / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._media_lock:
                records = [message_to_record(m, media) | extra for m, extra in messages]
            doc = {
                "env_id": rec.env_id,
                "seed": rec.seed,
                "attempt": rec.attempt,
                "index": rec.index,
                "media_dir": "../../media",
                "messages": records,
                "steps": steps,
                "success": rec.success,
                "error": rec.error,
            }
            path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        except (OSError, TypeError, ValueError) as exc:
            self.problems.append(f"{rec.key}: transcript not written ({type(exc).__name__}: {exc})")
            return None
        return rel.as_posix()

    # -- the run ----------------------------------------------------------------------------------
    async def run(self) -> RunResult:
        started = datetime.now(timezone.utc)
        t0 = time.perf_counter()
        done = self._prepare_folder()
        todo = deque((k, i) for k, i in self.config.keys() if k not in done)
        skipped = len(done)
        pool = _EnvPool(self.config)
        media = MediaWriter(self.out / "media")
        bar = _progress(len(self.config.keys()), skipped, self.progress)
        stats = Counter(success=sum(r.success for r in done.values()), finished=skipped)
        fatal: list[BaseException] = []
        ran = 0

        async def worker() -> None:
            nonlocal ran
            while todo and not fatal:
                key, index = todo.popleft()
                try:
                    rec = await self._episode(pool, media, key, index)
                except FatalAgentError as exc:
                    fatal.append(exc)
                    return
                writer.write(rec)
                ran += 1
                stats["finished"] += 1
                stats["success"] += int(rec.success)
                stats["errors"] += int(rec.error is not None)
                if self.on_record is not None:
                    self.on_record(rec)
                bar.update(stats)

        with RecordWriter(self.out / "episodes.jsonl") as writer:
            tasks = [asyncio.create_task(worker()) for _ in range(min(self.concurrency, max(len(todo), 1)))]
            try:
                while tasks:
                    finished, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for t in finished:
                        if t.exception() is not None:
                            fatal.append(t.exception())  # type: ignore[arg-type]
                    tasks = list(pending)
                    if fatal:  # stop the episodes still in flight: a later --resume redoes them
                        for t in tasks:
                            t.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)
                        tasks = []
            finally:
                bar.close()
                pool.close()
        message = None
        if fatal:
            exc = fatal[0]
            message = str(exc) if isinstance(exc, FatalAgentError) else f"{type(exc).__name__}: {exc}"
        summary = self.write_summary(started=started, wall_s=time.perf_counter() - t0, ran=ran, skipped=skipped,
                                     stop_reason=message)
        if fatal and not isinstance(fatal[0], FatalAgentError):
            raise fatal[0]
        return RunResult(self.out, summary, ran, skipped, message, self.problems)

    def write_summary(
        self, *, started: datetime | None = None, wall_s: float = 0.0, ran: int = 0, skipped: int = 0,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        """summary.json; ``run.stop_reason`` says why a run stopped early (None: it was not stopped)
        and ``run.missing_episodes`` lists the episode keys with no record (what --resume redoes)."""
        rows = read_records(self.out / "episodes.jsonl", problems=self.problems)
        latest = latest_by_key(rows)
        missing = [{"env_id": k[0], "seed": k[1], "attempt": k[2]} for k, _ in self.config.keys() if k not in latest]
        summary = build_summary(
            self.config,
            latest.values(),
            self.baselines(),
            versions={**self.agent.versions(), **{f"env:{e.env_id}": f"v{e.version}" for e in self.config.envs}},
            run={
                "started_at": started.isoformat(timespec="seconds") if started else None,
                "wall_s": round(wall_s, 3),
                "episodes_run": ran,
                "episodes_resumed": skipped,
                "concurrency": self.concurrency,
                "episode_wall_s_mean": round(sum(r.wall_s for r in rows) / len(rows), 4) if rows else None,
                "stop_reason": stop_reason,
                "missing_episodes": missing,
            },
        )
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.out / "summary.json")
        return summary

    def baselines(self) -> dict[str, Baseline]:
        return baselines_mod.resolve({e.env_id: e.difficulty for e in self.config.envs}, self.baselines_file)


class _progress:
    """A tqdm bar on stderr (or nothing when disabled or tqdm is missing)."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.bar: Any = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(
            total=total, initial=initial, desc="eval", unit="ep", file=sys.stderr, dynamic_ncols=True, leave=True
        )

    def update(self, stats: Counter[str]) -> None:
        if self.bar is None:
            return
        done = max(stats["finished"], 1)
        self.bar.set_postfix(success=f"{stats['success'] / done:.3f}", errors=stats["errors"], refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


async def evaluate(config: EvalConfig, agent: Agent, out: str | Path, **kwargs: Any) -> RunResult:
    """Run ``config`` with an already started ``agent`` (see :func:`run_eval` for the full flow)."""
    return await EvalRunner(config, agent, out, **kwargs).run()


async def run_eval(
    agent_spec: str,
    out: str | Path,
    *,
    options: Any = None,
    concurrency: int = 8,
    resume: bool = False,
    progress: bool = True,
    baselines_file: str | Path | None = None,
    label: str | None = None,
    **target: Unpack[EvalTarget],
) -> RunResult:
    """The whole ``relax-gym eval`` flow: build and start the agent, plan, run, score.

    ``options`` is an :class:`~relax_gym.leaderboards.agents.AgentOptions` (defaults when None);
    ``target`` (suite or env_ids, episodes, attempts...) goes to :func:`~.config.plan`.
    """
    from .agents import AgentOptions, make_agent
    from .config import plan

    options = options or AgentOptions()
    agent = make_agent(agent_spec, options)
    try:
        await agent.start()
        sampling = options.sampling_config() if agent.uses_sampling else {"seed": options.seed}
        config = await asyncio.to_thread(plan, agent=agent.describe(), sampling=sampling, **target)
        if label:
            config.extra["label"] = label
        return await EvalRunner(
            config, agent, out, concurrency=concurrency, resume=resume, progress=progress, baselines_file=baselines_file
        ).run()
    finally:
        await agent.aclose()


__all__ = ["EvalRunner", "RunError", "RunResult", "evaluate", "run_eval"]
