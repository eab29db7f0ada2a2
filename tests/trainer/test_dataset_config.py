"""`relax-gym train` takes dataset envs like any other: the shipped example config validates
and its envs build before any model loads; a bad column fails as a ConfigError naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("datasets", reason="dataset envs need the `datasets` package (relax-gym[data], in dev)")

from relax_gym.trainer.config import ConfigError, check_envs, load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_dataset_math_example_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root, like the quickstart's
    config = load_config(ROOT / "examples/dataset_math.yaml")
    assert config.data.envs[0].id == "relax/Dataset-v0"
    check_envs(config)


def test_a_bad_dataset_column_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    bad = "data.envs=[{id: relax/Dataset-v0, kwargs: {config: examples/data/math.yaml, prompt: questoin}}]"
    config = load_config(ROOT / "examples/dataset_math.yaml", [bad])
    with pytest.raises(ConfigError, match=r"data\.envs\.0.*no column 'questoin' \(mapped as prompt\)"):
        check_envs(config)


def test_prompt_token_filter_takes_the_runs_tokenizer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`max_prompt_tokens` without `tokenizer` validates (the model may not be built yet) and the
    run then gives the filter its own tokenizer folder, so it counts the policy's tokens."""
    import relax_gym
    from relax_gym.trainer.config import bind_run_tokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers

    monkeypatch.chdir(ROOT)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # one token per word or punctuation mark
    tok.save(str(tmp_path / "tokenizer.json"))
    entry = "data.envs=[{id: relax/Dataset-v0, kwargs: {config: examples/data/math.yaml, max_prompt_tokens: 12}}]"
    config = load_config(ROOT / "examples/dataset_math.yaml", [entry])
    check_envs(config)  # no tokenizer yet: not an error
    bind_run_tokenizer(config, tmp_path)
    kwargs = config.data.envs[0].kwargs
    assert kwargs["tokenizer"] == str(tmp_path)
    env = relax_gym.make("relax/Dataset-v0", **kwargs)
    report = env.reset(seed=0)[1]["dataset"]
    assert report["dropped"].get("over 12 prompt tokens", 0) > 0, report
    # an entry with its own tokenizer, or without the filter, is left alone
    own = load_config(ROOT / "examples/dataset_math.yaml")
    before = dict(own.data.envs[0].kwargs)
    bind_run_tokenizer(own, tmp_path)
    assert own.data.envs[0].kwargs == before
