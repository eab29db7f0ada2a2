"""``relax-gym eval`` sends audio to a model that hears: the ``sglang:`` agent (through the
embedded engine, ``audio_data`` plus one ``<|audio_pad|>`` per clip) and the ``hf:`` agent
(in-process, ``input_features``) on a tiny random Qwen3-Omni thinker. A random model answers
nonsense: these check the plumbing (every episode completes, the clip's tokens are in the prompt
the engine counted). Refusing audio for a model that cannot hear is tested with the other agents
(tests/leaderboards/test_engine_agents.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from relax_gym.leaderboards import AgentOptions, run_eval
from relax_gym.leaderboards.records import read_records


def _run(spec: str, out: Path, options: AgentOptions, **kw: Any) -> Any:
    return asyncio.run(run_eval(spec, out, options=options, progress=False, **kw))


def _text_tokens(model: Path, rows: list[Any], out: Path) -> dict[Any, int]:
    """Prompt length of each episode's first turn with its audio removed."""
    import json

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    lengths = {}
    for r in rows:
        doc = json.loads((out / r.transcript).read_text())
        text = "".join(p["text"] for p in doc["messages"][0]["content"] if p["type"] == "text")
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False, enable_thinking=False)
        lengths[r.key] = len(tok(rendered, add_special_tokens=False)["input_ids"])
    return lengths


@pytest.mark.slow  # about 30 s: a tiny thinker, an engine process, 3 episodes
def test_sglang_and_hf_agents_send_audio_to_the_omni_thinker(tmp_path: Path) -> None:
    from relax_gym.audio import audio_token_count
    from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
    from relax_gym.trainer.models import build_tiny_model

    model = build_tiny_model("qwen3_omni", tmp_path / "omni", tokenizer="tiny-bpe")
    opts = AgentOptions(model=str(model), max_tokens=4, temperature=1.0, thinking=False)
    with EmbeddedEngineProcess(model, threads=1) as engine:
        res = _run(f"sglang:{engine.url}", tmp_path / "sg", opts, env_ids=["relax/ToneCompare-v0"], episodes=2)
    assert res.fatal is None and res.summary["complete"]
    rows = read_records(tmp_path / "sg" / "episodes.jsonl")
    assert len(rows) == 2 and all(r.media_sent == {"audio": 1} and not r.error for r in rows)
    # the engine expanded the one pad it was sent: start + end + >= 13 audio tokens (a clip of >= 1 s)
    text_only = _text_tokens(model, rows, tmp_path / "sg")
    assert all(r.prompt_tokens >= text_only[r.key] + 2 + audio_token_count(100) for r in rows), [
        (r.prompt_tokens, text_only[r.key]) for r in rows]
    hf = _run(f"hf:{model}", tmp_path / "hf", AgentOptions(max_tokens=4, temperature=1.0, thinking=False),
              env_ids=["relax/ToneCompare-v0"], episodes=1)
    assert hf.fatal is None and hf.summary["complete"]
    assert [r.media_sent for r in read_records(tmp_path / "hf" / "episodes.jsonl")] == [{"audio": 1}]
