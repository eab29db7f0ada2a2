"""Attacks on the training config boundary (``relax-gym train`` / ``relax-gym sft``).

* a config file that is binary, not UTF-8, not YAML, not a mapping, a YAML alias bomb or an alias
  that contains itself: one line naming the file (and line:column of a syntax error), exit 2, no
  traceback -- never a hang, a memory blow-up or a RecursionError;
* non-finite numbers (``.inf``, ``nan``, ``1e999``) in any float field of any section, free-form
  ones included, from the file or from an override; integers beyond int64; out-of-range betas;
* a broken env config -- an unknown id, a misspelt kwarg, a bad kwarg value, in the training set,
  the evaluation set, a suite or a mixture -- fails before any model loads, naming the field and
  the close matches;
* during a run, more than ``rollout.max_env_error_rate`` of a step's episodes failing in the env
  stops the run with exit 3 and a message naming the count, the rate and the first error
  (colocate and the asynchronous producer).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ValidationError

import relax_gym
from relax_gym import Action, Message, Observation
from relax_gym.cli.main import main
from relax_gym.trainer.config import ConfigError, TrainConfig, config_from_dict

ROOT = Path(__file__).resolve().parents[2]
GOOD_ENV = "relax/SceneQuery-v0"
# model.path that does not exist: code that skipped validation fails on it at once (no hang)
MISSING_MODEL = "/nonexistent/relax-gym-model"


def base(**sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"model": {"path": MISSING_MODEL}, "data": {"envs": [{"id": GOOD_ENV}]}}
    data.update(sections)
    return data


# ------------------------------------------------------------------------------------------------
# test envs: one whose reset raises (fails without an engine), one whose step raises
# ------------------------------------------------------------------------------------------------
class ResetRaises(relax_gym.Env):
    """Builds fine; every reset raises."""

    max_turns = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        raise RuntimeError("the env is broken (reset)")

    def step(self, action: Action | str):  # pragma: no cover - never reached
        raise AssertionError


BROKEN_ID = "sectest/ResetRaises-v0"
if BROKEN_ID not in relax_gym.registry:
    relax_gym.register(BROKEN_ID, entry_point=ResetRaises)

STEP_RAISES_FILE = '''\
import relax_gym
from relax_gym import Message, Observation


class StepRaises(relax_gym.Env):
    """Resets fine; every step raises."""

    max_turns = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return Observation([Message.user("Say something.")]), {}

    def step(self, action):
        raise RuntimeError("the env is broken (step)")
'''


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------------------------------------
# broken YAML files
# ------------------------------------------------------------------------------------------------
def _bomb(levels: int) -> str:
    """A YAML alias bomb under a free-form section: 10**levels values from a few hundred bytes."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    body = "\n".join("  " + line for line in lines)
    return f"model: {{path: {MISSING_MODEL}}}\ndata: {{envs: [{{id: {GOOD_ENV}}}]}}\nmegatron:\n{body}\n"


BAD_FILES: dict[str, tuple[bytes, str]] = {
    # name: (content, what the message says)
    "binary": (bytes(range(256)) * 4, "binary data"),
    "random-binary-no-nul": (bytes(range(1, 256)) * 4, "not UTF-8"),
    "latin1": ("run_name: café\n".encode("latin-1"), "not UTF-8"),
    "utf16": ("run_name: x\n".encode("utf-16"), "UTF-16"),
    "syntax": (b"model:\n  build: {kind: qwen3\ndata: 1\n", "3:5: not valid YAML"),
    "tab-indent": (b"model:\n\tbuild: {kind: qwen3}\n", "2:1: not valid YAML"),
    "two-documents": (b"a: 1\n---\nb: 2\n", "not valid YAML"),
    "unknown-tag": (b"model: !!python/object:os.system {}\n", "not valid YAML"),
    "duplicate-key": (b"train:\n  lr: 1.0e-3\n  lr: 5.0\n", "3:3: not valid YAML: duplicate key 'lr'"),
    "list": (b"- a\n- b\n", "top level must be a mapping"),
    "scalar": (b"42\n", "top level must be a mapping"),
    "self-alias": (b"megatron: &a {x: *a}\n", "nested more than"),
    "deep-nesting": (b"megatron: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nest"),
    "alias-bomb": (_bomb(5).encode(), "more than 100000 values"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["train", "sft"])
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_broken_config_file_is_one_line_naming_the_file(
        case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, expected = BAD_FILES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(content)
    code, err = run_cli([command, str(path), "--print-config"] if command == "train" else [command, str(path)], capsys)
    line = one_line(err)
    assert code == 2, err
    assert str(path) in line and expected in line, line


def test_a_folder_or_a_fifo_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_cli(["train", str(tmp_path)], capsys)
    assert code == 2 and "is not a regular file" in one_line(err)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    code, err = run_cli(["train", str(fifo)], capsys)
    assert code == 2 and "is not a regular file" in one_line(err)


def test_an_oversized_config_file_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.yaml"
    path.write_bytes(b"# " + b"x" * (5 << 20) + b"\n")
    code, err = run_cli(["train", str(path)], capsys)
    assert code == 2 and "too large" in one_line(err)


def test_a_bad_override_value_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(base()), encoding="utf-8")
    for override in ("train.lr=[1, 2", "megatron.x=" + "[" * 3000, "megatron.x={a: 1, a: 2}"):
        code, err = run_cli(["train", str(path), override, "--print-config"], capsys)
        assert code == 2, override
        assert "Traceback" not in err and "override" in err, err


@pytest.mark.slow  # two interpreters importing torch: ~10 s on a loaded 2-core box
@pytest.mark.timeout(120)
def test_the_real_entry_point_refuses_broken_files_without_a_traceback(tmp_path: Path) -> None:
    """Through ``python -m relax_gym.cli.main`` (what the ``relax-gym`` script runs): train and
    sft on a binary file and a syntax error, run side by side."""
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(os.urandom(512) + b"\0")
    syntax = tmp_path / "syntax.yaml"
    syntax.write_bytes(b"model: {build: {kind: qwen3}\n")
    procs = [subprocess.Popen([sys.executable, "-m", "relax_gym.cli.main", cmd, str(path)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, path in (("train", binary), ("sft", syntax))]
    try:
        results = [p.communicate(timeout=100) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err), path in zip(procs, results, (binary, syntax), strict=True):
        assert p.returncode == 2, err
        assert str(path) in one_line(err)
    assert "binary data" in results[0][1]
    assert "syntax.yaml:2:1: not valid YAML" in results[1][1]


# ------------------------------------------------------------------------------------------------
# non-finite and out-of-range numbers
# ------------------------------------------------------------------------------------------------
def _float_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, annotation) of every float-bearing field of ``model`` and its sections
    (sections inside lists -- data.envs -- are not reachable by an override; tested from YAML)."""
    out: list[tuple[str, Any]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = field.annotation
        args = [ann, *typing.get_args(ann)]
        for arg in list(args):
            args.extend(typing.get_args(arg))
        in_list = any(typing.get_origin(a) is list for a in args)
        nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        for sub in dict.fromkeys(nested):
            if not in_list:
                out.extend(_float_fields(sub, f"{path}."))
        if float in args:
            out.append((path, ann))
    return out


FLOAT_FIELDS = _float_fields(TrainConfig)
NON_FINITE = [".inf", "-.inf", ".nan", "inf", "-Infinity", "nan", "NaN", "1e999", "-1e999", "1.0e+999"]


def _non_finite_override(path: str, ann: Any, raw: str) -> str:
    origin = typing.get_origin(ann)
    if origin is tuple:
        return f"{path}=[{raw}, 0.5]"
    if origin is dict:
        return f"{path}={{k: {raw}}}"
    return f"{path}={raw}"


def test_every_float_field_is_found() -> None:
    paths = {p for p, _ in FLOAT_FIELDS}
    assert {"train.lr", "train.betas", "rollout.temperature", "algorithm.kl_loss_coef", "warmup.lr",
            "async_rl.step_timeout_s", "async_rl.ray.trainer.num_cpus", "async_rl.ray.trainer.resources",
            "rollout.max_env_error_rate", "engine.startup_timeout_s"} <= paths
    assert len(paths) > 30


@pytest.mark.parametrize("raw", NON_FINITE)
def test_non_finite_numbers_are_refused_in_every_float_field(raw: str) -> None:
    accepted = []
    for path, ann in FLOAT_FIELDS:
        override = _non_finite_override(path, ann, raw)
        try:
            config_from_dict(base(), [override])
        except ConfigError as exc:
            assert path in str(exc), (override, str(exc))
        else:
            accepted.append(override)
    assert not accepted, f"non-finite values accepted: {accepted}"


@pytest.mark.parametrize("raw", [".inf", ".nan", "-.inf", "1e999"])
def test_non_finite_numbers_are_refused_in_free_form_sections_and_lists(raw: str, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = base()
    cases = {
        "data.envs.0.kwargs.difficulty": {"data": {"envs": [{"id": GOOD_ENV, "kwargs": {"difficulty": "@"}}]}},
        "data.envs.0.weight": {"data": {"envs": [{"id": GOOD_ENV, "weight": "@"}]}},
        "model.template_kwargs.t": {"model": {"path": MISSING_MODEL, "template_kwargs": {"t": "@"}}},
        "megatron.lr": {"megatron": {"lr": "@"}},
        "rewards.entries.0.weight": {"rewards": {"entries": [{"name": "env", "weight": "@"}]}},
        "async_rl.ray.runtime_env.x": {"async_rl": {"ray": {"runtime_env": {"x": ["@"]}}}},
    }
    for where, section in cases.items():
        text = yaml.safe_dump({**data, **section}).replace("'@'", raw)
        path = tmp_path / "c.yaml"
        path.write_text(text, encoding="utf-8")
        code, err = run_cli(["train", str(path), "--print-config"], capsys)
        assert code == 2, (where, err)
        assert where in err and "finite" in err and "Traceback" not in err, (where, err)


def test_config_models_refuse_non_finite_values_when_built_directly() -> None:
    from relax_gym.trainer.algorithms import AlgorithmConfig
    from relax_gym.trainer.config import OptimConfig, RolloutConfig
    from relax_gym.trainer.modes.async_config import AsyncConfig, RoleResources

    for build in (lambda: OptimConfig(lr=float("inf")), lambda: OptimConfig(betas=(float("nan"), 0.9)),
                  lambda: RolloutConfig(temperature=float("nan")), lambda: AlgorithmConfig(kl_loss_coef=float("inf")),
                  lambda: AlgorithmConfig(entropy_coef=float("nan")), lambda: AsyncConfig(step_timeout_s=float("inf")),
                  lambda: RoleResources(resources={"x": float("inf")})):
        with pytest.raises(ValidationError, match="finite"):
            build()


@pytest.mark.parametrize(("override", "field"), [
    ("seed=-1", "seed"),
    ("seed=99999999999999999999999", "seed"),
    ("model.build.seed=-3", "model.build.seed"),
    ("megatron.tp=123456789012345678901234567890", "megatron.tp"),
    ("train.betas=[1.0, 0.999]", "train.betas"),
    ("train.betas=[0.9, -0.1]", "train.betas"),
    ("rollout.max_env_error_rate=1.5", "rollout.max_env_error_rate"),
    ("rollout.max_env_error_rate=-0.1", "rollout.max_env_error_rate"),
])
def test_out_of_range_numbers_are_refused(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(base(model={"build": {"kind": "qwen3"}}), [override])
    assert field in str(info.value)


# ------------------------------------------------------------------------------------------------
# envs built once before any model loads
# ------------------------------------------------------------------------------------------------
ENV_CASES: list[tuple[dict[str, Any], list[str]]] = [
    ({"data": {"envs": [{"id": "relax/SceneQury-v0"}]}},
     ["data.envs.0.id", "'relax/SceneQury-v0' is not registered", "did you mean 'relax/SceneQuery-v0'"]),
    ({"data": {"envs": [{"id": GOOD_ENV, "kwargs": {"levle": "easy"}}]}},
     ["data.envs.0.kwargs", "does not accept kwarg 'levle'", "accepted: difficulty"]),
    ({"data": {"envs": [{"id": GOOD_ENV, "kwargs": {"dificulty": "easy"}}]}},
     ["does not accept kwarg 'dificulty'; did you mean 'difficulty'?"]),
    ({"data": {"envs": [{"id": GOOD_ENV, "kwargs": {"difficulty": "ultra"}}]}},
     ["data.envs.0", GOOD_ENV, "'ultra'"]),
    ({"data": {"envs": [{"id": GOOD_ENV}, {"id": "relax/SenseCount-v0", "kwargs": {"sizee": 3}}]}},
     ["data.envs.1.kwargs", "'sizee'"]),  # a mixture: the second env is checked too
    ({"data": {"envs": [{"id": "relax/SceneQuery-v7"}]}}, ["data.envs.0.id", "relax/SceneQuery-v0"]),
    ({"data": {"envs": [{"id": "not an id!"}]}}, ["data.envs.0.id", "malformed"]),
    ({"eval": {"envs": [{"id": "relax/SenseCont-v0"}]}}, ["eval.envs.0.id", "did you mean 'relax/SenseCount-v0'"]),
    ({"eval": {"suite": "relax/cor-v0"}}, ["eval.suite", "did you mean 'relax/core-v0'"]),
    ({"data": {"envs": [], "suite": "relax/coer-v0"}}, ["data.suite", "relax/core-v0"]),
    ({"rewards": {"per_env": {"relax/SceneQuery-v1": [{"name": "env"}]}}},
     ["rewards.per_env", "'relax/SceneQuery-v1' is not an env of this run", "did you mean 'relax/SceneQuery-v0'"]),
    ({"data": {"envs": [{"id": "my/Env-v0", "entry_point": "missing_file.py:Env"}]}},
     ["data.envs.0.entry_point", "missing_file.py"]),
    ({"data": {"envs": [{"id": "my/Env-v0", "entry_point": "relax_gym.envs:NoSuchEnv"}]}},
     ["data.envs.0.entry_point", "NoSuchEnv"]),
    ({"mode": "fully_async", "data": {"envs": [{"id": "relax/SceneQury-v0"}]}}, ["data.envs.0.id", "not registered"]),
    ({"mode": "hybrid", "async_rl": {"imports": ["no_such_module_for_envs"]}},
     ["async_rl.imports.0", "no_such_module_for_envs"]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("sections", "expected"), ENV_CASES, ids=[e[0] for _, e in ENV_CASES])
def test_a_broken_env_config_fails_before_any_model_loads(
        sections: dict[str, Any], expected: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    path = tmp_path / "bad-env.yaml"
    path.write_text(yaml.safe_dump(base(output_dir=str(out), **sections)), encoding="utf-8")
    start = time.perf_counter()
    code, err = run_cli(["train", str(path)], capsys)
    assert code == 2, err
    line = one_line(err)
    for text in expected:
        assert text in line, (text, line)
    assert time.perf_counter() - start < 10
    assert not out.exists()  # nothing was written, no model built


def test_sft_checks_the_envs_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad-env.yaml"
    path.write_text(yaml.safe_dump(base(data={"envs": [{"id": "relax/SceneQury-v0"}]})), encoding="utf-8")
    code, err = run_cli(["sft", str(path)], capsys)
    assert code == 2 and "'relax/SceneQury-v0' is not registered" in one_line(err)


def test_the_library_entry_checks_the_envs_before_building_the_model(tmp_path: Path) -> None:
    from relax_gym.trainer.modes.colocate import train

    cfg = config_from_dict(base(output_dir=str(tmp_path / "run"),
                                data={"envs": [{"id": GOOD_ENV, "kwargs": {"levle": 1}}]}))
    with pytest.raises(ConfigError, match="does not accept kwarg 'levle'"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_a_good_env_config_passes_the_check() -> None:
    from relax_gym.trainer.config import check_envs

    check_envs(config_from_dict(base(data={"envs": [{"id": GOOD_ENV, "kwargs": {"difficulty": "hard"}},
                                                    {"id": "relax/SenseCount-v0"}]},
                                     eval={"suite": "relax/core-v0"},
                                     rewards={"per_env": {GOOD_ENV: [{"name": "env"}]}})))


# ------------------------------------------------------------------------------------------------
# the env error rate stops a run
# ------------------------------------------------------------------------------------------------
def _traj(stop: str = "env_done", error: str | None = None, part: int = 0) -> Any:
    return types.SimpleNamespace(stop_reason=stop, error=error, env_id="e/E-v0", part=part)


def test_the_error_rate_bound() -> None:
    from relax_gym.trainer.env_errors import EnvErrorRateExceeded, check_env_errors

    half = [_traj("env_error", "boom")] * 4 + [_traj()] * 4
    check_env_errors(half, 0.5, "step 1")  # exactly half: not above the bound
    with pytest.raises(EnvErrorRateExceeded) as info:
        check_env_errors([*half, _traj("env_error", "later\nerror")], 0.5, "step 2")
    assert str(info.value).startswith("step 2: 5 of 9 episodes (56%) failed in the env")
    assert "max_env_error_rate = 0.5" in str(info.value) and "first error: e/E-v0: boom" in str(info.value)
    check_env_errors([_traj("env_error", "x")] * 8, 1.0, "never")  # 1 = never stop
    with pytest.raises(EnvErrorRateExceeded):
        check_env_errors([_traj("env_error", "x")] + [_traj()] * 99, 0.0, "any")
    # aborted episodes and the later parts of a split episode do not count
    check_env_errors([_traj("env_error", "x"), _traj(), _traj("aborted"), _traj("aborted"), _traj(part=1)], 0.5, "s")


class _StubRouter:
    """No engine is reached: every episode fails at env.reset."""

    def end_session(self, _episode_id: str) -> None:
        return None

    async def abort_all(self) -> None:
        return None


def _stub_codec() -> Any:
    """A text-only codec: no vision markers, so nothing is reserved (episodes fail in the env)."""
    return types.SimpleNamespace(vision=None, audio=None, reserved_ids=frozenset())


def test_colocate_stops_when_most_of_a_step_fails_in_the_env(tmp_path: Path) -> None:
    from relax_gym.rewards import RewardComposer
    from relax_gym.trainer.env_errors import EnvErrorRateExceeded
    from relax_gym.trainer.modes.colocate import Trainer
    from relax_gym.trainer.rollout.sampler import EpisodeSampler

    def trainer_for(rate: float) -> Any:
        cfg = config_from_dict(base(output_dir=str(tmp_path), data={"envs": [{"id": BROKEN_ID}]},
                                    rollout={"group_size": 2, "prompts_per_step": 2, "max_env_error_rate": rate}))
        t = Trainer(cfg)
        t.sampler = EpisodeSampler(list(cfg.data.envs), seed=0)
        t.router, t.codec = _StubRouter(), _stub_codec()
        t.composer = RewardComposer(cfg.rewards.entries)
        return t

    with pytest.raises(EnvErrorRateExceeded) as info:
        asyncio.run(trainer_for(0.5).rl_step(1))
    msg = str(info.value)
    assert msg.startswith("RL step 1: 4 of 4 episodes (100%) failed in the env"), msg
    assert "the env is broken (reset)" in msg and BROKEN_ID in msg
    # the bound is configurable: 1 never stops (the step is skipped, as before)
    metrics = asyncio.run(trainer_for(1.0).rl_step(1))
    assert metrics["train/skipped_step"] == 1.0


def test_the_async_producer_stops_when_most_episodes_fail_in_the_env(tmp_path: Path) -> None:
    from relax_gym.trainer.env_errors import EnvErrorRateExceeded
    from relax_gym.trainer.modes.producer import RolloutProducer

    cfg = config_from_dict(base(mode="fully_async", output_dir=str(tmp_path), data={"envs": [{"id": BROKEN_ID}]},
                                rollout={"group_size": 2, "prompts_per_step": 1}))
    producer = RolloutProducer(cfg, _stub_codec(), _StubRouter(), queue=None, rewards=[])  # type: ignore[arg-type]
    spec = producer.sampler.next(1, tag="a:")[0]
    producer.pending[spec.group] = spec
    asyncio.run(producer._run_group(spec))  # noqa: SLF001 - one group, as the producer's loop runs it
    with pytest.raises(EnvErrorRateExceeded, match=r"2 of 2 episodes \(100%\) failed in the env"):
        producer.check()
    assert spec.group in producer.pending  # not lost: a resume regenerates it


def test_the_cli_exits_3_with_one_line_when_the_run_stops_for_env_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from relax_gym.trainer import train_cli as cli
    from relax_gym.trainer.env_errors import EnvErrorRateExceeded

    def failing_train(config: Any, *, resume: bool = False) -> Any:
        try:
            raise EnvErrorRateExceeded("RL step 1: 4 of 4 episodes (100%) failed in the env")
        except EnvErrorRateExceeded as exc:  # as a Ray actor's failure arrives: wrapped
            raise RuntimeError("actor died") from exc

    monkeypatch.setattr(cli, "train", failing_train)
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(base()), encoding="utf-8")
    code, err = run_cli(["train", str(path)], capsys)
    assert code == 3
    assert one_line(err) == "relax-gym train: stopped: RL step 1: 4 of 4 episodes (100%) failed in the env"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["colocate", "fully_async"])
def test_a_run_on_an_env_whose_step_raises_exits_3(mode: str, tmp_path: Path) -> None:
    """End to end: ``relax-gym train`` with a tiny model and a real engine, on a user env (from an
    ``entry_point`` file) whose every step raises."""
    (tmp_path / "broken_env.py").write_text(STEP_RAISES_FILE, encoding="utf-8")
    out = tmp_path / "run"
    cfg = {
        "mode": mode, "output_dir": str(out), "threads": 1,
        "model": {"build": {"kind": "qwen3", "tokenizer": "tiny-bpe"}},
        "engine": {"threads": 1},
        "data": {"envs": [{"id": "user/StepRaises-v0", "entry_point": "broken_env.py:StepRaises"}]},
        "rollout": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 4},
        "train": {"steps": 2},
        "eval": {"at_start": False, "every": 0, "episodes": 1},
        "logging": {"progress": "none", "tensorboard": False, "plot": False},
        "async_rl": {"step_timeout_s": 120},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "relax_gym.cli.main", "train", str(path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 3, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("relax-gym train: stopped: "), done.stderr[-3000:]
    assert "episodes (100%) failed in the env" in last and "the env is broken (step)" in last
    assert not (out / "summary.json").exists()
