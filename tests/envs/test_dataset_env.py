"""Dataset envs (relax/Dataset-v0, from_dataset): files read through `datasets`, column mapping
with media, rewards by name or path, splits, deterministic order, filters and bad input."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("datasets", reason="dataset envs need the `datasets` package (relax-gym[data], in dev)")

import datasets  # noqa: E402

import relax_gym  # noqa: E402
from relax_gym.checker import check_env  # noqa: E402
from relax_gym.envs.dataset_order import EpochOrder, KeyedPermutation  # noqa: E402
from relax_gym.envs.dataset_source import DatasetConfigError  # noqa: E402
from relax_gym.media import encode_audio, encode_image  # noqa: E402
from relax_gym.types import AudioPart, ImagePart  # noqa: E402

ID = "relax/Dataset-v0"


def math_rows(n: int = 12) -> list[dict]:
    return [{"question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3), "id": i} for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def png(color: tuple[int, int, int], size: int = 8) -> Image.Image:
    return Image.new("RGB", (size, size), color)


# -- order -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000, 4099])
def test_keyed_permutation_is_a_bijection(n: int) -> None:
    perm = KeyedPermutation(n, key=12345)
    assert sorted(perm(i) for i in range(n)) == list(range(n))


def test_epochs_visit_every_row_once_and_reshuffle() -> None:
    order = EpochOrder(50, shuffle=True, shuffle_seed=3)
    first = [order(s) for s in range(50)]
    second = [order(s) for s in range(50, 100)]
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second and first != list(range(50))
    assert [order(s) for s in range(50)] == first  # deterministic per seed
    assert [EpochOrder(50, shuffle=True, shuffle_seed=4)(s) for s in range(50)] != first
    assert [EpochOrder(50, shuffle=False)(s) for s in range(60)] == list(range(50)) + list(range(10))


# -- text datasets -----------------------------------------------------------------------------
def test_jsonl_math_env_oracle_rewards_and_determinism(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "math.jsonl", math_rows())
    env = relax_gym.make(ID, path=str(f), prompt="question", reward="math_equiv",
                         instruction="Answer as \\boxed{N}.")
    obs, info = env.reset(seed=5)
    row = info["row"]
    assert obs.messages[0].role == "user" and f"What is {row} + {row + 3}?" in obs.text
    assert "\\boxed{N}" in obs.text and info["source"] == f"{f} row {row}"
    _, reward, term, _, step_info = env.step(next(env.oracle()))
    assert (reward, term, step_info["success"]) == (1.0, True, True)
    env.reset(seed=5)
    _, reward, _, _, step_info = env.step(f"\\boxed{{{2 * row + 4}}}")
    assert reward == 0.0 and not step_info["success"]
    # the same seed gives the same row, a fresh env included; epochs cover every row
    assert relax_gym.make(ID, path=str(f), prompt="question").reset(seed=5)[1]["row"] == row
    rows = [env.reset(seed=s)[1]["row"] for s in range(12)]
    assert sorted(rows) == list(range(12))
    report = check_env(relax_gym.make(ID, path=str(f), prompt="question", reward="math_equiv"), raise_on_failure=False)
    assert report.passed, report


def test_reset_without_seed_continues_the_epoch(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "m.jsonl", math_rows(6))
    env = relax_gym.make(ID, path=str(f), prompt="question")
    first = env.reset(seed=0)[1]["row"]
    rest = [env.reset()[1]["row"] for _ in range(5)]
    assert sorted([first, *rest]) == list(range(6))


def test_formats_and_in_memory_dataset_give_the_same_rows(tmp_path: Path) -> None:
    rows = math_rows(9)
    ds = datasets.Dataset.from_list(rows)
    write_jsonl(tmp_path / "d.jsonl", rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.to_csv(str(tmp_path / "d.csv"), index=False)
    (tmp_path / "d.json").write_text(json.dumps(rows), encoding="utf-8")
    folder = tmp_path / "shards"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows[:4])
    write_jsonl(folder / "b.jsonl", rows[4:])
    sources = [str(tmp_path / "d.jsonl"), str(tmp_path / "d.parquet"), str(tmp_path / "d.csv"),
               str(tmp_path / "d.json"), str(folder), ds]
    texts = []
    for src in sources:
        env = relax_gym.make(ID, path=src, prompt="question")
        texts.append([env.reset(seed=s)[0].text for s in range(9)])
        env.reset(seed=7)
        assert env.step(next(env.oracle()))[4]["success"]
    assert all(t == texts[0] for t in texts)
    # the folder's rows name their own file
    env = relax_gym.make(ID, path=str(folder), prompt="question", shuffle=False)
    assert env.reset(seed=5)[1]["source"] == f"{folder / 'b.jsonl'} row 1"


def test_chat_prompt_system_prompt_and_label_lists(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}],
             "answer": ["Paris", "paris, france"]}]
    f = write_jsonl(tmp_path / "chat.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), prompt="messages", reward="normalized_match")
    obs, _ = env.reset(seed=0)
    assert [m.role for m in obs.messages] == ["system", "user"] and obs.messages[1].text == "Capital of France?"
    assert env.step("\\boxed{Paris, France}")[4]["success"]
    env2 = relax_gym.make(ID, path=str(write_jsonl(tmp_path / "p.jsonl", math_rows(2))), prompt="question",
                          system_prompt="You add numbers.")
    assert [m.role for m in env2.reset(seed=0)[0].messages] == ["system", "user"]


def test_user_reward_function_per_row_kwargs_and_metadata(tmp_path: Path) -> None:
    rows = [{"q": "Say hi", "answer": "hi", "rk": {"bonus": 0.5}, "lang": "en"},
            {"q": "Say yo", "answer": "yo", "rk": None, "lang": "fr"}]
    f = write_jsonl(tmp_path / "r.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), prompt="q", reward="tests.envs.dataset_rewards:starts_with",
                         reward_kwargs_column="rk", extra_columns=["lang"], shuffle=False, success_threshold=1.0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("hi there")
    assert reward == pytest.approx(1.5) and info["success"]
    env.reset(seed=1)
    _, reward, _, _, info = env.step("hi there")
    assert reward == 0.0 and not info["success"]
    env.reset(seed=1)
    assert env.step("yo")[1] == pytest.approx(1.0)  # no per-row bonus; metadata lang == fr
    assert info["reward_components"]["starts_with"] == 0.0


# -- media -------------------------------------------------------------------------------------
def test_image_paths_relative_to_the_file_bytes_and_hf_features(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    for i, c in enumerate(colors):
        png(c).save(tmp_path / "img" / f"{i}.png")
    rows = [{"q": f"Colour {i}?", "image": f"img/{i}.png", "answer": str(i)} for i in range(3)]
    f = write_jsonl(tmp_path / "sub.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), prompt="q", image="image", shuffle=False)
    assert env.modalities == ("text", "image")
    obs, _ = env.reset(seed=1)
    parts = obs.parts(ImagePart)
    assert len(parts) == 1 and parts[0].image.getpixel((0, 0)) == colors[1]
    for style in ("openai", "hf", "text"):
        rendered = env.format_observation(obs, style)
        assert rendered and rendered[0]["role"] == "user"
    assert any(p.get("type") == "image_url" for p in env.format_observation(obs, "openai")[0]["content"])
    # the same images as base64 text and as an HF Image feature (a list per row), via Parquet
    b64 = [{"q": r["q"], "image": base64.b64encode(encode_image(png(colors[i]))).decode(), "answer": r["answer"]}
           for i, r in enumerate(rows)]
    env_b64 = relax_gym.make(ID, path=str(write_jsonl(tmp_path / "b64.jsonl", b64)), prompt="q", image="image",
                             shuffle=False)
    hf = datasets.Dataset.from_dict(
        {"q": [r["q"] for r in rows], "answer": [r["answer"] for r in rows],
         "images": [[png(c), png(c)] for c in colors]},
        features=datasets.Features({"q": datasets.Value("string"), "answer": datasets.Value("string"),
                                    "images": datasets.List(datasets.Image())}))
    hf.to_parquet(str(tmp_path / "hf.parquet"))
    env_hf = relax_gym.make(ID, path=str(tmp_path / "hf.parquet"), prompt="q", image="images", shuffle=False)
    assert env_b64.reset(seed=1)[0].parts(ImagePart) == parts
    hf_parts = env_hf.reset(seed=1)[0].parts(ImagePart)
    assert len(hf_parts) == 2 and hf_parts[0] == parts[0]
    env_mem = relax_gym.make(ID, path=hf, prompt="q", image="images", shuffle=False)  # in memory, decoded features
    assert env_mem.reset(seed=1)[0].parts(ImagePart) == hf_parts


def test_audio_column_and_placeholders(tmp_path: Path) -> None:
    wave = (0.5 * np.sin(np.linspace(0, 200, 1600))).astype(np.float32)
    (tmp_path / "a.wav").write_bytes(encode_audio(wave, 8000))
    png((9, 9, 9)).save(tmp_path / "x.png")
    rows = [{"prompt": [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "and"},
                                                     {"type": "image"}]}],
             "audio": "a.wav", "image": "x.png", "answer": "ok"}]
    f = write_jsonl(tmp_path / "av.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), image="image", audio="audio")
    obs, _ = env.reset(seed=0)
    content = obs.messages[0].content
    assert isinstance(content[0], AudioPart) and content[0].sample_rate == 8000
    assert isinstance(content[2], ImagePart)
    assert env.format_observation(obs, "hf")[0]["content"]


def test_missing_media_rows_are_dropped_and_counted(tmp_path: Path) -> None:
    png((1, 2, 3)).save(tmp_path / "ok.png")
    rows = [{"q": f"q{i}", "image": "ok.png" if i % 3 else f"gone{i}.png", "answer": "a"} for i in range(9)]
    f = write_jsonl(tmp_path / "mm.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), prompt="q", image="image")
    _, info = env.reset(seed=0)
    assert info["dataset"]["rows_total"] == 9 and info["dataset"]["rows_used"] == 6
    assert info["dataset"]["dropped"] == {"missing media": 3}
    assert {env.reset(seed=s)[1]["row"] for s in range(6)} == {1, 2, 4, 5, 7, 8}
    with pytest.raises(DatasetConfigError, match="no such file"):
        relax_gym.make(ID, path=str(f), prompt="q", image="image", drop_missing_media=False, shuffle=False)


def test_prompt_token_filter_uses_the_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    rows = [{"q": " ".join(["w"] * n), "answer": "x"} for n in (3, 10, 5, 30)]
    f = write_jsonl(tmp_path / "t.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), prompt="q", max_prompt_tokens=6, tokenizer=str(tmp_path))
    _, info = env.reset(seed=0)
    assert info["dataset"]["dropped"] == {"over 6 prompt tokens": 2} and info["dataset"]["rows_used"] == 2
    with pytest.raises(DatasetConfigError, match="tokenizer"):
        relax_gym.make(ID, path=str(f), prompt="q", max_prompt_tokens=6)


# -- splits ------------------------------------------------------------------------------------
def test_seeded_and_column_splits(tmp_path: Path) -> None:
    rows = [{**r, "part": "test" if r["id"] % 4 == 0 else "train"} for r in math_rows(40)]
    f = write_jsonl(tmp_path / "s.jsonl", rows)

    def rows_of(**kw: object) -> set[int]:
        env = relax_gym.make(ID, path=str(f), prompt="question", **kw)
        n = env.reset(seed=0)[1]["dataset"]["rows_used"]
        return {env.reset(seed=s)[1]["row"] for s in range(n)}

    train = rows_of(split="train", test_fraction=0.25, split_seed=1)
    test = rows_of(split="test", test_fraction=0.25, split_seed=1)
    assert len(test) == 10 and not train & test and train | test == set(range(40))
    assert rows_of(split="test", test_fraction=0.25, split_seed=2) != test
    assert rows_of(split="test", split_column="part") == set(range(0, 40, 4))
    with pytest.raises(DatasetConfigError, match="split_column"):
        relax_gym.make(ID, path=str(f), prompt="question", split="test")


# -- tools -------------------------------------------------------------------------------------
def test_tools_make_a_multi_turn_tool_env(tmp_path: Path) -> None:
    rows = [{"q": "What is 123456 * 654321?", "answer": str(123456 * 654321), "tools": ["calculator"]}]
    f = write_jsonl(tmp_path / "tools.jsonl", rows)
    for kwargs in ({"tools": ["calculator"]}, {"tools_column": "tools"}):
        env = relax_gym.make(ID, path=str(f), prompt="q", reward="math_equiv", **kwargs)
        assert env.max_turns > 1 and "tools" in env.tags
        obs, _ = env.reset(seed=0)
        assert [t.name for t in obs.tools] == ["calculator"]
        call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123456 * 654321"}}</tool_call>'
        obs, reward, term, _, info = env.step(call)
        assert not term and str(123456 * 654321) in obs.text
        _, reward, term, _, info = env.step(f"\\boxed{{{123456 * 654321}}}")
        assert term and info["success"] and reward == 1.0
    with pytest.raises(DatasetConfigError, match="unknown tool"):
        relax_gym.make(ID, path=str(f), prompt="q", tools=["calculatr"])


# -- registration, suites, eval ----------------------------------------------------------------
def test_from_dataset_registers_an_id_that_suites_and_eval_use(tmp_path: Path) -> None:
    from relax_gym.cli.main import main

    f = write_jsonl(tmp_path / "m.jsonl", math_rows())
    spec = relax_gym.envs.from_dataset("test-data/Math-v0", path=str(f), prompt="question", reward="math_equiv",
                                       override=True)
    assert spec.summary()["oracle"] and relax_gym.make("test-data/Math-v0").reset(seed=0)[0].text
    relax_gym.register_suite("test-data/mixed-v0", ["test-data/Math-v0", "relax/ArithmeticWord-v0"], 3,
                             override=True)
    (tmp_path / "datasets.yaml").write_text(
        f"envs:\n  - id: test-data/File-v0\n    kwargs: {{path: m.jsonl, prompt: question, reward: math_equiv}}\n")
    out = tmp_path / "eval"
    code = main(["eval", "--datasets", str(tmp_path / "datasets.yaml"), "--env", "test-data/File-v0",
                 "--env", "relax/ArithmeticWord-v0", "--agent", "oracle", "--episodes", "3", "--out", str(out),
                 "--no-progress", "--json"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["envs"]["test-data/File-v0"]["success"]["value"] == 1.0
    code = main(["eval", "--suite", "test-data/mixed-v0", "--agent", "oracle", "--out", str(tmp_path / "e2"),
                 "--no-progress", "--json"])
    assert code == 0
    page = tmp_path / "board.md"
    assert main(["leaderboard", "--no-db", "--format", "md", "--out", str(page), str(out), str(tmp_path / "e2")]) == 0
    assert "test-data/File-v0" in page.read_text() and "test-data/Math-v0" in page.read_text()


# -- bad input ---------------------------------------------------------------------------------
def test_bad_input_gets_clear_errors(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "m.jsonl", math_rows(3))
    with pytest.raises(DatasetConfigError, match="no such file or folder"):
        relax_gym.make(ID, path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetConfigError, match=r"no column 'questoin' \(mapped as prompt\).*did you mean 'question'"):
        relax_gym.make(ID, path=str(f), prompt="questoin")
    with pytest.raises(DatasetConfigError, match=r"unknown reward 'math_equivalence'"):
        relax_gym.make(ID, path=str(f), prompt="question", reward="math_equivalence")
    with pytest.raises(DatasetConfigError, match=r"prompt_column: Extra inputs"):
        relax_gym.make(ID, path=str(f), prompt_column="question")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{"question": "b", "answer": 2,\n', encoding="utf-8")
    with pytest.raises(DatasetConfigError, match=r"bad.jsonl line 2 \(row 1\): invalid JSON"):
        relax_gym.make(ID, path=str(bad), prompt="question")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    rows = [{"q": "x", "image": "broken.png", "answer": "a"}]
    with pytest.raises(DatasetConfigError, match=r"img.jsonl row 0 column 'image': unreadable image"):
        relax_gym.make(ID, path=str(write_jsonl(tmp_path / "img.jsonl", rows)), prompt="q", image="image")
    with pytest.raises(DatasetConfigError, match="needs path"):
        relax_gym.make(ID)


def test_a_row_that_fails_during_a_run_is_counted_and_skipped(tmp_path: Path) -> None:
    png((5, 5, 5)).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    rows = [{"q": f"q{i}", "image": "broken.png" if i == 3 else "ok.png", "answer": "a"} for i in range(6)]
    f = write_jsonl(tmp_path / "late.jsonl", rows)
    env = relax_gym.make(ID, path=str(f), prompt="q", image="image", shuffle=False, validate_rows=0)
    _, info = env.reset(seed=3)
    assert info["row"] == 4 and info["dataset"]["bad_rows"] == 1
    assert env.reset(seed=3)[1]["row"] == 4  # still deterministic
    strict = relax_gym.make(ID, path=str(f), prompt="q", image="image", shuffle=False, validate_rows=0,
                            max_bad_rows=0)
    with pytest.raises(DatasetConfigError, match="over max_bad_rows=0"):
        strict.reset(seed=3)


# -- training order ----------------------------------------------------------------------------
def test_training_sampler_walks_dataset_rows_in_epochs_and_resumes(tmp_path: Path) -> None:
    """The trainer's sampler gives a dataset env consecutive seeds (seed_order auto), so one
    epoch of draws trains every row once; a procedural env keeps uniform random seeds."""
    from relax_gym.trainer.config import EnvEntry
    from relax_gym.trainer.rollout.sampler import EpisodeSampler, is_dataset_env

    f = write_jsonl(tmp_path / "m.jsonl", math_rows(10))
    relax_gym.envs.from_dataset("test-data/Order-v0", path=str(f), prompt="question", override=True)
    assert is_dataset_env("test-data/Order-v0") and is_dataset_env(ID)
    assert not is_dataset_env("relax/ArithmeticWord-v0") and not is_dataset_env("no/Such-v0")
    entries = [EnvEntry(id="test-data/Order-v0"), EnvEntry(id="relax/ArithmeticWord-v0")]
    sampler = EpisodeSampler(entries, seed=1, seed_start=100, seed_count=1000, seed_order="auto")
    first = sampler.next(40)
    data_seeds = [s.seed for s in first if s.env_id == "test-data/Order-v0"]
    assert data_seeds == list(range(100, 100 + len(data_seeds))) and len(data_seeds) >= 10
    env = relax_gym.make("test-data/Order-v0")
    rows = [env.reset(seed=s)[1]["row"] for s in data_seeds[:10]]
    assert sorted(rows) == list(range(10))  # one epoch: every row once, no repeats
    procedural = [s.seed for s in first if s.env_id == "relax/ArithmeticWord-v0"]
    assert procedural != sorted(procedural)  # still drawn at random
    # resuming from a checkpoint continues both the counters and the generator
    state = sampler.state_dict()
    after = [(s.env_id, s.seed) for s in sampler.next(12)]
    resumed = EpisodeSampler(entries, seed=1, seed_start=100, seed_count=1000, seed_order="auto")
    resumed.load_state_dict(state)
    assert [(s.env_id, s.seed) for s in resumed.next(12)] == after
    # explicit orders override auto; sequential wraps inside the pool
    random_order = EpisodeSampler(entries[:1], seed=1, seed_count=1000, seed_order="random").next(20)
    assert [s.seed for s in random_order] != list(range(20))
    wrap = EpisodeSampler(entries[1:], seed=1, seed_start=7, seed_count=3, seed_order="sequential").next(5)
    assert [s.seed for s in wrap] == [7, 8, 9, 7, 8]
