"""The training config: YAML + dotted overrides, validation before any work, readable errors."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from relax_gym.cli.main import main
from relax_gym.trainer.config import (
    EVAL_SEED_FLOOR,
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    load_config,
    parse_override,
)
from relax_gym.trainer.rollout.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": {"build": {"kind": "qwen3"}}, "data": {"envs": [{"id": "test/Letters-v0"}]}}


def errors_of(overrides: list[str], data: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data or BASE, overrides)
    return str(info.value)


def test_defaults_and_overrides() -> None:
    cfg = config_from_dict(BASE, ["train.lr=3e-4", "algorithm.policy_loss=gspo", "rollout.group_size=4",
                                  "eval.every=0", "run_name=abc", "logging.wandb.enabled=false"])
    assert isinstance(cfg, TrainConfig)
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.algorithm.policy_loss == "gspo"
    assert cfg.rollout.group_size == 4 and cfg.rollout.batch_size == 4 * cfg.rollout.prompts_per_step
    assert cfg.out_dir == Path("runs/abc")
    # paper defaults come from the algorithm module
    assert (cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (0.2, 0.28)


def test_one_rollout_model_for_training_and_the_manager() -> None:
    """The ``rollout:`` section is the rollout manager's own settings model: the modes hand it over
    as it is, and evaluation changes only what evaluation means."""
    defaults = RolloutConfig()  # the values docs/training.md gives and explains
    assert (defaults.group_size, defaults.prompts_per_step, defaults.concurrency) == (8, 8, 64)
    assert (defaults.max_new_tokens, defaults.max_total_tokens, defaults.temperature) == (512, 4096, 1.0)
    cfg = config_from_dict(BASE, ["seed=7", "rollout.top_k=20", "rollout.env_in_thread=false",
                                  "eval.temperature=0", "eval.max_new_tokens=5"])
    assert type(cfg.rollout) is RolloutConfig
    assert (cfg.rollout.top_k, cfg.rollout.env_in_thread) == (20, False)  # manager knobs come from YAML too
    assert cfg.rollout.sampling_seed == 7  # reproducible sampling: the run's seed unless set
    assert config_from_dict(BASE, ["seed=7", "rollout.sampling_seed=3"]).rollout.sampling_seed == 3
    ev = cfg.eval_rollout()
    assert (ev.group_size, ev.temperature, ev.max_new_tokens, ev.top_p, ev.top_k) == (1, 0.0, 5, 1.0, -1)
    assert (ev.concurrency, ev.sampling_seed, ev.env_in_thread) == (64, 7, False)
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.group_size == 8  # the copy left the section alone
    assert config_from_dict(BASE).eval_rollout().max_new_tokens == 512  # eval.max_new_tokens unset: rollout's
    assert "rollout.temperature must be > 0" in errors_of(["rollout.temperature=0"])


def test_parse_override_values() -> None:
    assert parse_override("a.b=1e-3") == (["a", "b"], 1e-3)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override("a.b=null") == (["a", "b"], None)
    assert parse_override("a.b=hello world") == (["a", "b"], "hello world")
    for bad in ("noequals", "=3", "a..b=1", "a.b=[unclosed"):
        with pytest.raises(ConfigError):
            parse_override(bad)


def test_override_into_a_value_is_an_error() -> None:
    with pytest.raises(ConfigError, match="is a value"):
        apply_overrides({"train": {"lr": 1.0}}, ["train.lr.x=3"])


def test_bad_literal_names_field_and_allowed_values() -> None:
    msg = errors_of(["algorithm.policy_loss=ppx"])
    assert "algorithm.policy_loss" in msg and "'gspo'" in msg and "'ppx'" in msg


def test_unknown_field_suggests_the_closest() -> None:
    msg = errors_of(["train.lrr=0.1"])
    assert "train.lrr" in msg and "did you mean 'lr'" in msg


def test_cross_field_rules() -> None:
    assert "group_size >= 2" in errors_of(["rollout.group_size=1"])
    assert "mini_batches" in errors_of(["train.mini_batches=64"])
    assert "exactly one of model.path" in errors_of([], {"model": {}, "data": BASE["data"]})
    assert "data.envs" in errors_of([], {"model": BASE["model"], "data": {}})
    assert "teacher.url" in errors_of(["algorithm.distill_coef=0.5"])
    assert "dual_clip" in errors_of(["algorithm.dual_clip=1.1"])


def test_unknown_reward_is_rejected_up_front() -> None:
    msg = errors_of(["rewards.entries=[{name: no_such_reward}]"])
    assert "no_such_reward" in msg and "registered" in msg


def test_eval_seeds_are_held_out() -> None:
    assert "held-out" in errors_of(["data.seed_start=999999999", "data.seed_count=10"])
    msg = errors_of([f"eval.seed_start={EVAL_SEED_FLOOR - 1}"])
    assert "eval.seed_start" in msg


def test_several_problems_are_all_reported() -> None:
    msg = errors_of(["model.dtype=fp16", "train.steps=-1"])
    assert "model.dtype" in msg and "train.steps" in msg


@pytest.mark.parametrize("name", ["quickstart.yaml", "qwen3vl_tooluse_grpo.yaml", "video_cpu.yaml"])
def test_shipped_examples_validate(name: str) -> None:
    cfg = load_config(ROOT / "examples" / name)
    assert cfg.train.steps > 0


def test_cli_bad_config_fails_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model: {build: {kind: qwen3}}\ndata: {envs: [{id: test/Letters-v0}]}\n"
                    "algorithm: {policy_loss: grpo_typo}\n", encoding="utf-8")
    start = time.perf_counter()
    code = main(["train", str(path), "train.steps=3"])
    assert code == 2
    assert time.perf_counter() - start < 5.0  # nothing was built or started
    err = capsys.readouterr().err
    assert "algorithm.policy_loss" in err and "'cispo'" in err
    assert not (tmp_path / "runs").exists()


def test_cli_missing_file_and_not_a_mapping(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "list.yaml").write_text("- a\n- b\n", encoding="utf-8")
    assert main(["train", str(tmp_path / "list.yaml")]) == 2
    assert "mapping" in capsys.readouterr().err


def test_cli_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(ROOT / "examples" / "quickstart.yaml"), "train.steps=7", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "steps: 7" in out


ASYNC_YAML = """\
mode: fully_async
model: {build: {kind: qwen3}}
engine: {sync: distributed, distributed: {backend: nccl, master_port: 29600, ranks_per_engine: 2}}
data: {envs: [{id: test/Letters-v0}]}
rollout: {prompts_per_step: 4}
algorithm: {rollout_correction: tis}
async_rl:
  max_staleness: 2
  stale_policy: correct
  queue_capacity: 8
  runtime: ray
  ray: {num_cpus: 2, trainer: {num_cpus: 1}}
  imports: [tests.trainer.envs]
"""


def test_async_mode_and_section_validate_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "async.yaml"
    path.write_text(ASYNC_YAML, encoding="utf-8")
    cfg = load_config(path)
    assert cfg.mode == "fully_async" and cfg.is_async
    a = cfg.async_rl
    assert (a.max_staleness, a.stale_policy, a.capacity(4)) == (2, "correct", 8)
    d = cfg.engine.distributed
    assert (cfg.engine.sync, d.backend, d.master_port, d.ranks_per_engine) == ("distributed", "nccl", 29600, 2)
    assert (a.runtime, a.ray.num_cpus, a.ray.trainer.num_cpus, a.imports) == ("ray", 2, 1.0, ["tests.trainer.envs"])
    assert not load_config(path, ["mode=colocate", "async_rl.runtime=embedded"]).is_async
    assert load_config(path, ["mode=hybrid"]).is_async


def test_weight_sync_is_chosen_under_engine_for_every_mode() -> None:
    """The transport is one setting (engine.sync) for colocate and the async modes alike; the
    async section's former keys say where they went."""
    assert config_from_dict(BASE, ["engine.sync=distributed"]).engine.sync == "distributed"  # colocate too
    msg = errors_of(["mode=fully_async", "async_rl.weight_sync=distributed", "async_rl.master_port=1234"])
    assert "async_rl.weight_sync is now engine.sync (distributed)" in msg
    assert "async_rl.master_port is now engine.distributed.master_port" in msg
    assert "engine.sync: must be one of" in errors_of(["engine.sync=nccl"])


def test_bad_mode_names_the_field_and_the_three_modes() -> None:
    msg = errors_of(["mode=async"])
    assert "mode: must be one of 'colocate', 'fully_async' or 'hybrid' (got 'async')" in msg


def test_async_settings_are_checked_against_the_rest_of_the_config() -> None:
    assert "set algorithm.rollout_correction" in errors_of(["mode=fully_async", "async_rl.stale_policy=correct"])
    assert "must hold one batch" in errors_of(["mode=hybrid", "async_rl.queue_capacity=2", "rollout.prompts_per_step=4"])
    # the Ray runtime runs the asynchronous modes only: with colocate it would be silently ignored
    assert "colocate runs embedded" in errors_of(["async_rl.runtime=ray"])
    assert "not a module name" in errors_of(["mode=hybrid", "async_rl.imports=['a b']"])
    assert "async_rl.max_staleness" in errors_of(["mode=fully_async", "async_rl.max_staleness=-1"])


def test_cli_print_config_round_trips_the_async_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "async.yaml"
    path.write_text(ASYNC_YAML, encoding="utf-8")
    assert main(["train", str(path), "async_rl.max_staleness=3", "--print-config"]) == 0
    printed = capsys.readouterr().out
    again = tmp_path / "printed.yaml"
    again.write_text(printed, encoding="utf-8")
    original = load_config(path, ["async_rl.max_staleness=3"])
    assert load_config(again) == original
    section = yaml.safe_load(printed)["async_rl"]
    assert section["max_staleness"] == 3 and section["runtime"] == "ray" and section["ray"]["num_cpus"] == 2


def test_config_import_pulls_no_ray_and_the_async_section_no_torch() -> None:
    """The async section is plain pydantic: embedding it adds neither ray nor torch to the config's imports."""
    code = ("import sys; import relax_gym.trainer.modes.async_config as s; "
            "assert not {'torch', 'ray', 'relax_gym.trainer.config'} & set(sys.modules), sorted(sys.modules); "
            "import relax_gym.trainer.config; assert 'ray' not in sys.modules; "
            "print(sorted(m for m in sys.modules if m.startswith('relax_gym.trainer.modes')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['relax_gym.trainer.modes', 'relax_gym.trainer.modes.async_config']"


def test_a_token_budget_past_the_models_context_fails_at_validation(tmp_path: Path) -> None:
    """rollout.max_total_tokens over the context in the model folder's config.json: refused before
    anything loads (the engine would refuse every turn past it), the model and the bound named."""
    import json

    from relax_gym.trainer.config import ConfigError, check_envs, config_from_dict

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 2048}))
    data = {"output_dir": str(tmp_path / "out"), "model": {"path": str(folder)},
            "data": {"envs": [{"id": "relax/ArithmeticWord-v0"}]}}
    with pytest.raises(ConfigError, match=r"rollout\.max_total_tokens is 4096, but the model .* 2048 tokens.*at most 2048"):
        check_envs(config_from_dict(data, []))
    check_envs(config_from_dict(data, ["rollout.max_total_tokens=2048"]))
    vl = {"model_type": "qwen3_vl", "text_config": {"max_position_embeddings": 1024}}  # the text model's context
    (folder / "config.json").write_text(json.dumps(vl))
    with pytest.raises(ConfigError, match="serves a context of 1024 tokens"):
        check_envs(config_from_dict(data, ["rollout.max_total_tokens=2048"]))
    tiny = {"output_dir": str(tmp_path / "out"), "data": {"envs": [{"id": "relax/ArithmeticWord-v0"}]},
            "model": {"build": {"kind": "qwen3", "text": {"max_position_embeddings": 512}}}}
    with pytest.raises(ConfigError, match=r"model\.build \(tiny qwen3\) serves a context of 512 tokens"):
        check_envs(config_from_dict(tiny, []))
    check_envs(config_from_dict(tiny, ["rollout.max_total_tokens=512"]))
