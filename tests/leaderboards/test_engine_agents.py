"""Model agents against real models: ``openai:`` and ``sglang:`` through the embedded engine on
127.0.0.1, and ``hf:`` in-process, all with tiny random Qwen3-VL / Qwen3 models built from configs.

The ``openai:`` and ``sglang:`` tests run by default (about 30 s with the engine's start); the
``hf:`` test is slow-marked. A random tiny model answers nonsense, so these tests check the
plumbing, not the scores: every
episode completes without error, images reach the model (the prompt the engine counted is
longer than the text alone by the image's tokens), and a modality the model cannot take stops
the run with a clear error before any episode is scored.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from relax_gym.leaderboards import AgentOptions, run_eval
from relax_gym.leaderboards.records import read_records

ENVS = ["lbtest/Picture-v0", "relax/ShapeCount-v0", "lbtest/Pick-v0"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model folders built on first use: ``vl`` (Qwen3-VL) for everything, ``text`` (Qwen3) for hf:."""
    from relax_gym.trainer.models import build_tiny_model

    root = tmp_path_factory.mktemp("models")

    class Lazy(dict[str, Path]):
        def __missing__(self, kind: str) -> Path:
            self[kind] = build_tiny_model({"vl": "qwen3_vl", "text": "qwen3"}[kind], root / kind)
            return self[kind]

    return Lazy()


@pytest.fixture(scope="module")
def engine(models: dict[str, Path]) -> Any:
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess

    with EmbeddedEngineProcess(models["vl"], threads=1) as proc:
        yield proc


def _run(spec: str, out: Path, options: AgentOptions, **kw: Any):
    kw.setdefault("progress", False)
    return asyncio.run(run_eval(spec, out, options=options, **kw))


def _text_tokens(model: Path, rows: list[Any], out: Path) -> dict[tuple[str, int, int], int]:
    """Prompt length of each episode's first turn rendered with its images removed."""
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    lengths = {}
    for r in rows:
        doc = json.loads((out / r.transcript).read_text())
        text = "".join(p["text"] for p in doc["messages"][0]["content"] if p["type"] == "text")
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        lengths[r.key] = len(tok(rendered, add_special_tokens=False)["input_ids"])
    return lengths


def _check_images_reached_the_model(model: Path, out: Path, episodes: int) -> None:
    rows = read_records(out / "episodes.jsonl")
    assert len(rows) == episodes and not [r.error for r in rows if r.error]
    image_rows = [r for r in rows if r.env_id in ("lbtest/Picture-v0", "relax/ShapeCount-v0")]
    assert all(r.media_sent == {"image": 1} and r.completion_tokens > 0 for r in image_rows)
    text_only = _text_tokens(model, image_rows, out)
    # <|vision_start|> + at least one <|image_pad|> + <|vision_end|> beyond the text
    assert all(r.prompt_tokens >= text_only[r.key] + 3 for r in image_rows), [
        (r.prompt_tokens, text_only[r.key]) for r in image_rows
    ]


def test_openai_agent_on_the_embedded_engine(engine: Any, models: dict[str, Path], tmp_path: Path) -> None:
    opts = AgentOptions(max_tokens=8, temperature=1.0, thinking=False)
    envs = [*ENVS, "lbtest/Lookup-v0"]  # the last one offers a tool (declared with tools=)
    res = _run(f"openai:{engine.url}/v1", tmp_path / "oa", opts, env_ids=envs, episodes=2, concurrency=4)
    assert res.fatal is None and res.summary["complete"]
    _check_images_reached_the_model(models["vl"], tmp_path / "oa", episodes=8)
    stopped = _run(f"openai:{engine.url}/v1", tmp_path / "oa-audio", opts, env_ids=["relax/SenseCount-v0"], episodes=1)
    assert stopped.fatal is not None and "does not accept audio input" in stopped.fatal


def test_sglang_agent_on_the_embedded_engine(engine: Any, models: dict[str, Path], tmp_path: Path) -> None:
    opts = AgentOptions(model=str(models["vl"]), max_tokens=8, temperature=1.0, thinking=False)
    envs = [*ENVS, "lbtest/Lookup-v0"]  # tool calls, if any, parsed by the hermes parser
    res = _run(f"sglang:{engine.url}", tmp_path / "sg", opts, env_ids=envs, episodes=2, concurrency=4)
    assert res.fatal is None and res.summary["complete"]
    assert res.summary["config"]["agent"]["chat_template_sha256"]
    _check_images_reached_the_model(models["vl"], tmp_path / "sg", episodes=8)
    # without --model the template is found through the server's /get_model_info; the encoder has no audio tokens
    stopped = _run(
        f"sglang:{engine.url}",
        tmp_path / "sg-audio",
        AgentOptions(max_tokens=4),
        env_ids=["relax/SenseCount-v0"],
        episodes=1,
    )
    assert stopped.fatal is not None and "does not accept audio input" in stopped.fatal
    assert "chat encoder of " + str(models["vl"]) in stopped.fatal


@pytest.mark.slow
def test_hf_agent_runs_local_models(models: dict[str, Path], tmp_path: Path) -> None:
    opts = AgentOptions(max_tokens=6, temperature=1.0, thinking=False)
    vl = _run(f"hf:{models['vl']}", tmp_path / "hf-vl", opts, env_ids=ENVS, episodes=2, concurrency=2)
    assert vl.fatal is None and vl.summary["complete"]
    _check_images_reached_the_model(models["vl"], tmp_path / "hf-vl", episodes=6)
    text = _run(f"hf:{models['text']}", tmp_path / "hf-text", opts, env_ids=["lbtest/Pick-v0"], episodes=2)
    assert text.fatal is None and text.summary["results"]["counts"]["finished"] == 2
    # a text-only model is never handed an image silently
    stopped = _run(f"hf:{models['text']}", tmp_path / "hf-img", opts, env_ids=["lbtest/Picture-v0"], episodes=1)
    assert stopped.fatal is not None and "does not accept image input" in stopped.fatal
    # video: sent to Qwen3-VL as pixel_values_videos, refused for a text model
    video = _run(f"hf:{models['vl']}", tmp_path / "hf-video", opts, env_ids=["relax/MotionTrack-v0"], episodes=1)
    assert video.fatal is None and video.summary["complete"]
    assert [r.media_sent for r in read_records(tmp_path / "hf-video" / "episodes.jsonl")] == [{"video": 1}]
    no_video = _run(f"hf:{models['text']}", tmp_path / "hf-novideo", opts, env_ids=["relax/MotionTrack-v0"],
                    episodes=1)
    assert no_video.fatal is not None and "does not accept video input" in no_video.fatal
    # same seeds, same text: sampling is seeded from the episode key
    again = _run(f"hf:{models['text']}", tmp_path / "hf-text2", opts, env_ids=["lbtest/Pick-v0"], episodes=2)
    first, second = _answers(tmp_path / "hf-text"), _answers(tmp_path / "hf-text2")
    assert len(first) == 2 and first == second and again.summary["results"] == text.summary["results"]


def _answers(out: Path) -> dict[tuple[str, int, int], str]:
    import json

    answers = {}
    for r in read_records(out / "episodes.jsonl"):
        doc = json.loads((out / r.transcript).read_text())
        answers[r.key] = next(m for m in doc["messages"] if m["role"] == "assistant")["content"][0]["text"]
    return answers


def test_local_template_tool_round_trip(models: dict[str, Path]) -> None:
    """sglang:/hf: conversations: hermes tool calls parsed from the generated text, answered by the
    env; the reply's tokens stay in the context as generated and the tool response follows."""
    from relax_gym.leaderboards.agents.local_chat import Conversation, ToolCallParser, load_codec

    import relax_gym

    env = relax_gym.make("lbtest/Lookup-v0")
    obs, _ = env.reset(seed=3)
    options = AgentOptions(thinking=False)
    conv = Conversation(load_codec(str(models["vl"]), options), env, options)
    conv.add_observation(obs)
    codec = conv.codec
    first = list(conv.ids)
    assert '"name": "lookup"' in codec.decode(first)  # tools rendered into the template's system block
    reply = codec.encode('<tool_call>\n{"name": "lookup", "arguments": {"key": "secret"}}\n</tool_call>')
    reply += codec.closing_glue[:1]  # the engine stops on <|im_end|>
    action, reasoning, calls = conv.add_reply(reply, ToolCallParser("hermes"), turn=0)
    assert [(c.name, c.arguments, c.id) for c in calls] == [("lookup", {"key": "secret"}, "call_0_0")]
    assert reasoning is None and not action.parse_errors
    obs, _, terminated, _, _ = env.step(action)
    assert not terminated and obs.messages[0].role == "tool"
    conv.add_observation(obs)
    second = conv.ids
    assert second[: len(first) + len(reply)] == first + reply  # append-only: the reply as generated
    text = codec.decode(second)
    assert text.count("<tool_call>") == codec.decode(first).count("<tool_call>") + 1  # the call, once
    assert f"<tool_response>\n{env.unwrapped.secret}\n</tool_response>" in text
    bad, _, _ = conv.add_reply(codec.encode("<tool_call>{oops</tool_call>"), ToolCallParser("hermes"), turn=1)
    assert not bad.tool_calls and bad.parse_errors and "malformed JSON" in bad.parse_errors[0]


@pytest.mark.slow  # about 20 s under load: two video episodes through the engine
def test_sglang_agent_sends_video_to_qwen3_vl(engine: Any, models: dict[str, Path], tmp_path: Path) -> None:
    opts = AgentOptions(model=str(models["vl"]), max_tokens=4, temperature=1.0, thinking=False)
    out = tmp_path / "sg-video"
    res = _run(f"sglang:{engine.url}", out, opts, env_ids=["relax/MotionTrack-v0"], episodes=2)
    assert res.fatal is None and res.summary["complete"]
    rows = read_records(out / "episodes.jsonl")
    assert len(rows) == 2 and all(r.media_sent == {"video": 1} and not r.error for r in rows)
    text_only = _text_tokens(models["vl"], rows, out)
    # 2 s at 2 fps = 4 frames = 2 temporal patches, each <T seconds> + start + 4 pads + end
    assert all(r.prompt_tokens >= text_only[r.key] + 2 * 6 for r in rows), [(r.prompt_tokens, text_only[r.key])
                                                                            for r in rows]


def test_a_clip_over_budget_reaches_the_model_as_an_error_text_and_is_counted(
        engine: Any, models: dict[str, Path], tmp_path: Path) -> None:
    """As in training: the refused clip becomes a text the model reads, the good clip beside it
    is sent, the episode runs, and the record and summary count it."""
    opts = AgentOptions(model=str(models["vl"]), max_tokens=4, temperature=1.0, thinking=False)
    out = tmp_path / "sg-long"
    res = _run(f"sglang:{engine.url}", out, opts, env_ids=["lbtest/LongClip-v0"], episodes=2)
    assert res.fatal is None and res.summary["complete"]
    rows = read_records(out / "episodes.jsonl")
    assert len(rows) == 2 and all(not r.error and r.media_errors == 1 and r.completion_tokens > 0 for r in rows)
    assert '"media_errors": 2' in json.dumps(res.summary)
    transcript = (out / rows[0].transcript).read_text()
    assert '"media_errors"' in transcript and '"duration"' in transcript  # the turn says why



def _check_context_filled(out: Path, episodes: int) -> list[Any]:
    """Every episode ran until the conversation filled the context and ended as truncated, with
    no error: no request passed the limit (the engine refuses one with an error)."""
    rows = read_records(out / "episodes.jsonl")
    assert len(rows) == episodes and not [r.error for r in rows if r.error]
    assert all(r.truncated and r.context_exhausted and not r.success for r in rows)
    assert all(1 < r.turns < 60 for r in rows)  # filled well before the env's own end
    for r in rows:
        doc = json.loads((out / r.transcript).read_text())
        assert len([m for m in doc["messages"] if m["role"] == "assistant"]) == r.turns
    summary = json.loads((out / "summary.json").read_text())
    env_stats = summary["results"]["envs"]["lbtest/Chatter-v0"]
    assert env_stats["context_exhausted"] == episodes and env_stats["errors"] == 0
    return rows


def test_a_conversation_that_fills_the_context_ends_as_truncated(models: dict[str, Path], tmp_path: Path) -> None:
    """sglang: on a 256-token model: each turn's max tokens is cut to the room the context has
    left (the server refuses a prompt plus max_new_tokens past it), and the episode ends as
    truncated with ``context_exhausted`` instead of an engine error; ``--max-context`` lowers
    the limit the server reports."""
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model

    small = build_tiny_model("qwen3", tmp_path / "small", max_position_embeddings=256)
    opts = AgentOptions(model=str(small), max_tokens=24, temperature=1.0, thinking=False)
    with EmbeddedEngineProcess(small, threads=1) as proc:
        res = _run(f"sglang:{proc.url}", tmp_path / "sg", opts, env_ids=["lbtest/Chatter-v0"], episodes=2)
        assert res.fatal is None and res.summary["complete"]
        rows = _check_context_filled(tmp_path / "sg", episodes=2)
        lower = AgentOptions(model=str(small), max_tokens=24, temperature=1.0, thinking=False, max_context=128)
        res = _run(f"sglang:{proc.url}", tmp_path / "sg128", lower, env_ids=["lbtest/Chatter-v0"], episodes=2)
        assert res.fatal is None and res.summary["complete"]
        fewer = _check_context_filled(tmp_path / "sg128", episodes=2)
    assert sum(r.turns for r in fewer) < sum(r.turns for r in rows)


def test_hf_agent_cuts_its_replies_to_the_context_left(tmp_path: Path) -> None:
    from relax_gym.trainer.models import build_tiny_model

    small = build_tiny_model("qwen3", tmp_path / "small", max_position_embeddings=192)
    opts = AgentOptions(max_tokens=24, temperature=1.0, thinking=False)
    res = _run(f"hf:{small}", tmp_path / "hf", opts, env_ids=["lbtest/Chatter-v0"], episodes=1)
    assert res.fatal is None and res.summary["complete"]
    _check_context_filled(tmp_path / "hf", episodes=1)
