"""The runner: outputs, scores, determinism, resume, per-episode errors and fatal stops."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from relax_gym.leaderboards import AgentOptions, ModalityRejected, RunError, make_agent, plan, run_eval
from relax_gym.leaderboards.agents import Agent, AgentSession, EpisodeInfo, TurnResult
from relax_gym.leaderboards.records import read_records
from relax_gym.leaderboards.eval_runner import EvalRunner

from relax_gym import Action, Message, ToolSpec


def _run(spec: str, out: Path, **kw: Any):
    kw.setdefault("progress", False)
    return asyncio.run(run_eval(spec, out, **kw))


def test_oracle_scores_one_everywhere_with_complete_outputs(tmp_path: Path, baselines_file: Path) -> None:
    res = _run("oracle", tmp_path / "o", suite="lbtest/mini-v0", attempts=2, baselines_file=baselines_file)
    s = res.summary
    assert s["complete"] and res.ran == 36 and res.fatal is None
    for env_id, e in s["results"]["envs"].items():
        assert e["success"]["value"] == 1.0, env_id
        assert e["normalised"]["value"] == pytest.approx(1.0), env_id
        assert e["pass_at_k"]["2"]["value"] == 1.0 and e["pass_hat_k"]["2"]["value"] == 1.0
    assert s["results"]["suite"]["normalised"]["value"] == pytest.approx(1.0)
    assert set(s["results"]["modalities"]) == {"text", "image"}
    assert s["results"]["tool_use"]["envs"] == ["lbtest/Lookup-v0"]
    assert s["results"]["tool_use"]["tool_calls"] == 12  # one call in each of the 12 Lookup episodes
    # summary: config, its hash, versions
    assert s["config_hash"] == json.loads((tmp_path / "o" / "config.json").read_text())["config_hash"]
    assert s["versions"]["relax-gym"] and s["versions"]["env:lbtest/Pick-v0"] == "v0"
    # rows: one per (env, seed, attempt), transcripts on disk, media as files not base64
    rows = read_records(tmp_path / "o" / "episodes.jsonl")
    assert len({r.key for r in rows}) == 36
    picture = next(r for r in rows if r.env_id == "lbtest/Picture-v0")
    assert picture.media_sent == {}  # the oracle sends the model nothing
    doc = json.loads((tmp_path / "o" / picture.transcript).read_text())
    image_parts = [p for m in doc["messages"] for p in m["content"] if p["type"] == "image"]
    assert (
        image_parts
        and (tmp_path / "o" / "transcripts" / "lbtest_Picture-v0" / doc["media_dir"] / image_parts[0]["path"]).is_file()
    )
    assert "base64" not in (tmp_path / "o" / picture.transcript).read_text()
    lookup = next(r for r in rows if r.env_id == "lbtest/Lookup-v0")
    assert lookup.turns == 2 and lookup.tool_calls == 1


def test_shipped_core_suite_oracle_scores_one_and_random_matches_its_baseline(tmp_path: Path) -> None:
    oracle = _run("oracle", tmp_path / "o", suite="relax/core-v0", concurrency=4).summary
    envs = oracle["results"]["envs"]
    assert len(envs) >= 5
    for env_id, e in envs.items():
        assert e["success"]["value"] == 1.0, env_id
    rand = _run("random", tmp_path / "r", suite="relax/core-v0", concurrency=4).summary
    for env_id, e in rand["results"]["envs"].items():
        if e["baseline"] is None:
            pytest.fail(f"{env_id} has no stored baseline (python -m relax_gym.envs.baselines --write)")
        assert e["success"]["low"] <= e["baseline"]["random"] <= e["success"]["high"], env_id
        assert e["normalised"]["low"] <= 0.0 <= e["normalised"]["high"], env_id
    suite = rand["results"]["suite"]["normalised"]
    assert suite["low"] <= 0.0 <= suite["high"]


def test_random_agent_scores_near_chance_on_a_known_env(tmp_path: Path, baselines_file: Path) -> None:
    s = _run(
        "random", tmp_path / "r", env_ids=["lbtest/Pick-v0"], episodes=60, attempts=2, baselines_file=baselines_file
    ).summary
    e = s["results"]["envs"]["lbtest/Pick-v0"]
    assert e["success"]["low"] <= 0.25 <= e["success"]["high"]
    assert e["normalised"]["low"] <= 0.0 <= e["normalised"]["high"]
    assert 0.12 < e["success"]["value"] < 0.4


def test_resumed_run_gives_the_same_summary(tmp_path: Path, baselines_file: Path) -> None:
    full = _run(
        "random", tmp_path / "full", suite="lbtest/mini-v0", attempts=3, concurrency=3, baselines_file=baselines_file
    ).summary

    # the same run, killed after 10 episodes
    class Killed(Exception):
        pass

    seen = []

    def stop_after_ten(rec: Any) -> None:
        seen.append(rec)
        if len(seen) == 10:
            raise Killed

    async def interrupted() -> None:
        agent = make_agent("random", AgentOptions())
        cfg = plan(agent=agent.describe(), sampling={"seed": 0}, suite="lbtest/mini-v0", attempts=3)
        await EvalRunner(
            cfg,
            agent,
            tmp_path / "part",
            concurrency=3,
            progress=False,
            baselines_file=baselines_file,
            on_record=stop_after_ten,
        ).run()

    with pytest.raises(Killed):
        asyncio.run(interrupted())
    episodes = tmp_path / "part" / "episodes.jsonl"
    assert 10 <= len(read_records(episodes)) < 54
    with episodes.open("a") as f:  # and the kill tore the line being written
        f.write('{"env_id": "lbtest/Pick-v0", "seed": 1')
    with pytest.raises(RunError, match="--resume"):
        _run("random", tmp_path / "part", suite="lbtest/mini-v0", attempts=3, baselines_file=baselines_file)
    resumed = _run(
        "random", tmp_path / "part", suite="lbtest/mini-v0", attempts=3, resume=True, baselines_file=baselines_file
    )
    assert resumed.skipped >= 10 and resumed.ran == 54 - resumed.skipped
    assert any("unreadable row" in p for p in resumed.problems)
    s = resumed.summary
    for field in ("results", "config", "config_hash", "comparability_key", "complete"):
        assert s[field] == full[field], field
    assert (tmp_path / "part" / "unreadable_rows.txt").read_text().startswith('{"env_id": "lbtest/Pick-v0"')
    # resuming a finished run runs nothing and changes nothing
    again = _run(
        "random", tmp_path / "part", suite="lbtest/mini-v0", attempts=3, resume=True, baselines_file=baselines_file
    )
    assert again.ran == 0 and again.summary["results"] == full["results"]


def test_modality_groups_follow_what_the_instance_shows(tmp_path: Path) -> None:
    s = _run(
        "oracle",
        tmp_path / "o",
        env_ids=["lbtest/Picture-v0", "lbtest/Pick-v0"],
        episodes=2,
        env_kwargs={"lbtest/Picture-v0": {"image": False}},
    ).summary
    assert s["results"]["envs"]["lbtest/Picture-v0"]["modalities"] == ["text"]
    assert set(s["results"]["modalities"]) == {"text"}
    assert s["results"]["modalities"]["text"]["envs"] == ["lbtest/Pick-v0", "lbtest/Picture-v0"]


def test_resume_refuses_another_config(tmp_path: Path) -> None:
    _run("oracle", tmp_path / "o", env_ids=["lbtest/Pick-v0"], episodes=2)
    with pytest.raises(RunError, match="config"):
        _run("oracle", tmp_path / "o", env_ids=["lbtest/Pick-v0"], episodes=3, resume=True)


def test_results_do_not_depend_on_concurrency(tmp_path: Path) -> None:
    one = _run("random", tmp_path / "c1", suite="lbtest/mini-v0", attempts=2, concurrency=1).summary
    many = _run("random", tmp_path / "c8", suite="lbtest/mini-v0", attempts=2, concurrency=8).summary
    assert one["results"] == many["results"]
    rows1 = {r.key: (r.success, r.return_) for r in read_records(tmp_path / "c1" / "episodes.jsonl")}
    rows8 = {r.key: (r.success, r.return_) for r in read_records(tmp_path / "c8" / "episodes.jsonl")}
    assert rows1 == rows8


def test_episode_errors_are_recorded_counted_and_retried_on_resume(tmp_path: Path) -> None:
    res = _run("oracle", tmp_path / "f", suite="lbtest/flaky-v0")
    rows = read_records(tmp_path / "f" / "episodes.jsonl")
    broken = [r for r in rows if r.error]
    assert broken and all(r.env_id == "lbtest/Flaky-v0" and r.error_type == "env" for r in broken)
    assert all(r.seed % 3 == 0 and not r.success for r in broken)
    counts = res.summary["results"]["counts"]
    assert counts["errors"] == len(broken) and counts["finished"] == 18 - len(broken) and res.summary["complete"]
    flaky = res.summary["results"]["envs"]["lbtest/Flaky-v0"]
    assert flaky["errors"] == len(broken) and flaky["success"]["value"] == pytest.approx(1 - len(broken) / 9)
    assert res.summary["results"]["envs"]["lbtest/Pick-v0"]["success"]["value"] == 1.0
    # --resume runs the errored episodes again and keeps the old rows aside
    again = _run("oracle", tmp_path / "f", suite="lbtest/flaky-v0", resume=True)
    assert again.ran == len(broken)
    assert len(read_records(tmp_path / "f" / "retried_errors.jsonl")) == len(broken)
    assert again.summary["results"] == res.summary["results"]


class _RejectsImages(Agent):
    """A custom agent (python:...) standing for a text-only model: refuses image observations."""

    spec = "python:tests.leaderboards.test_eval_runner:_RejectsImages"

    def __init__(self, options: AgentOptions) -> None:
        self.options = options

    def session(self, env: Any, episode: EpisodeInfo) -> AgentSession:
        oracle = make_agent("oracle").session(env, episode)

        class S(AgentSession):
            async def act(self, observation: Any) -> TurnResult:
                if "image" in observation.modalities:
                    raise ModalityRejected("image", "test model", "text only")
                return await oracle.act(observation)

        return S()


def test_modality_rejection_stops_the_run_and_keeps_finished_rows(tmp_path: Path) -> None:
    res = _run(
        "python:tests.leaderboards.test_eval_runner:_RejectsImages",
        tmp_path / "m",
        env_ids=["lbtest/Pick-v0", "lbtest/Picture-v0"],
        episodes=4,
        concurrency=1,
    )
    assert res.fatal is not None and "does not accept image input" in res.fatal
    assert not res.summary["complete"]
    rows = read_records(tmp_path / "m" / "episodes.jsonl")
    assert rows and all(r.env_id == "lbtest/Pick-v0" and r.success for r in rows)
    assert res.summary["results"]["counts"]["missing"] == 8 - len(rows)


def echo_policy(messages: list[Message], tools: list[ToolSpec]) -> str:
    """A python: policy -- answers the letter the prompt names."""
    return messages[-1].text.rstrip(".").split()[-1]


def test_python_policy_agent(tmp_path: Path) -> None:
    res = _run(
        "python:tests.leaderboards.test_eval_runner:echo_policy", tmp_path / "p", env_ids=["lbtest/Pick-v0"], episodes=5
    )
    assert res.summary["results"]["envs"]["lbtest/Pick-v0"]["success"]["value"] == 1.0
    assert res.summary["config"]["agent"]["spec"].startswith("python:")


def test_unknown_agents_and_bad_python_targets_fail_clearly() -> None:
    from relax_gym.leaderboards import FatalAgentError

    with pytest.raises(FatalAgentError, match="unknown agent"):
        make_agent("gpt:foo")
    with pytest.raises(FatalAgentError, match="cannot import"):
        make_agent("python:no_such_module_xyz:f")
    with pytest.raises(FatalAgentError, match="no attribute"):
        make_agent("python:tests.leaderboards.test_eval_runner:nope")


def test_split_thinking() -> None:
    from relax_gym.leaderboards.agents import split_thinking

    assert split_thinking("<think>hmm</think>\nThe answer") == ("The answer", "hmm")
    assert split_thinking("plan it</think>B") == ("B", "plan it")
    assert split_thinking("A <think>unfinished") == ("A", "unfinished")
    assert split_thinking("plain") == ("plain", None)


def test_action_parse_errors_are_counted(tmp_path: Path) -> None:
    res = _run(
        "python:tests.leaderboards.test_eval_runner:bad_tool_policy",
        tmp_path / "b",
        env_ids=["lbtest/Lookup-v0"],
        episodes=2,
    )
    rows = read_records(tmp_path / "b" / "episodes.jsonl")
    assert all(r.parse_errors == 3 and r.invalid_actions == 3 and r.truncated for r in rows)
    assert res.summary["results"]["envs"]["lbtest/Lookup-v0"]["parse_errors"] == 6


def bad_tool_policy(messages: list[Message], tools: list[ToolSpec]) -> Action:
    return Action(text="", parse_errors=["tool call 0: arguments are not valid JSON"])


def test_a_killed_cli_run_resumes_to_the_uninterrupted_summary(tmp_path: Path) -> None:
    """SIGKILL a real `relax-gym eval` process mid-run, then `--resume` it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = [
        "eval",
        "--suite",
        "relax/core-v0",
        "--agent",
        "random",
        "--attempts",
        "2",
        "--concurrency",
        "1",
        "--no-progress",
        "--out",
    ]
    full = _run("random", tmp_path / "full", suite="relax/core-v0", attempts=2, concurrency=4).summary
    total = len(read_records(tmp_path / "full" / "episodes.jsonl"))  # envs x episodes x attempts
    out = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "relax_gym.cli.main", *args, str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    episodes = out / "episodes.jsonl"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if episodes.exists() and episodes.read_text().count("\n") >= 40:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    done = len(read_records(episodes))
    assert proc.returncode == -signal.SIGKILL and 40 <= done < total, (proc.returncode, done, total)
    assert not (out / "summary.json").exists()
    from relax_gym.cli.main import main

    assert main([*args, str(out), "--resume"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["run"]["episodes_resumed"] >= done - 1 and resumed["run"]["episodes_run"] <= total - done + 1
    for field in ("results", "config", "config_hash", "comparability_key", "complete"):
        assert resumed[field] == full[field], field


def test_a_server_agents_address_is_not_part_of_the_run_hash() -> None:
    """`--resume` against a restarted engine on another port is the same run; another model (or
    another agent kind) is not."""
    base = plan(agent={"spec": "sglang:http://127.0.0.1:30001", "server_model_path": "/m/a"},
                sampling={"seed": 0}, env_ids=["lbtest/Pick-v0"], episodes=2)

    def with_agent(agent: dict[str, Any]) -> str:
        return plan(agent=agent, sampling={"seed": 0}, env_ids=["lbtest/Pick-v0"], episodes=2).hash()

    assert with_agent({"spec": "sglang:http://127.0.0.1:41234", "server_model_path": "/m/a"}) == base.hash()
    assert with_agent({"spec": "sglang:http://127.0.0.1:41234", "server_model_path": "/m/b"}) != base.hash()
    assert with_agent({"spec": "openai:http://127.0.0.1:30001", "model": "x"}) != base.hash()
    assert with_agent({"spec": "openai:http://[::1]:9", "model": "x"}) == with_agent(
        {"spec": "openai:http://127.0.0.1:30001/v1", "model": "x"})
    assert base.agent["spec"] == "sglang:http://127.0.0.1:30001"  # the record still names the address
