"""examples/real_model_cpu.yaml, shortened (slow): the same config -- GRPO with LoRA through the
embedded engine -- on a tiny random Llama that went through the GGUF import like SmolLM2 does
(tests never download the real model). Checks the loop runs with LoRA on the Llama family, the
engine got merged weights (the policy's logprobs moved), and final_model is a plain HF folder.
The learning run itself is `python bench/quickstart.py --config examples/real_model_cpu.yaml`; its
figures are in docs/benchmarks.md, "Real models"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("peft")

from relax_gym.trainer.config import load_config  # noqa: E402
from relax_gym.trainer.models import build_tiny_model  # noqa: E402
from relax_gym.trainer.models.gguf_import import import_gguf  # noqa: E402
from relax_gym.trainer.models.gguf_write import write_gguf  # noqa: E402
from relax_gym.trainer.modes.colocate import train  # noqa: E402
from relax_gym.trainer.observability import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_real_model_example_runs_with_lora_on_an_imported_llama(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from relax_gym.trainer.models.tokenizer import train_tiny_bpe

    vocab = len(AutoTokenizer.from_pretrained(str(train_tiny_bpe(tmp_path / "bpe"))))
    src = build_tiny_model("llama", tmp_path / "src", tokenizer="tiny-bpe", vocab_size=vocab)
    model = tmp_path / "imported"
    import_gguf(str(write_gguf(src, tmp_path / "tiny.gguf", qtype="Q8_0")), model, chat_template="chatml-tools")
    config = load_config(ROOT / "examples" / "real_model_cpu.yaml", [
        f"model.path={model}", f"output_dir={tmp_path / 'run'}", "train.steps=2", "eval.episodes=4",
        "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "logging.progress=none", "logging.tensorboard=false", "checkpoint.every=0",
    ])
    assert config.model.lora is not None and config.model.lora.rank == 16
    assert config.data.envs[0].kwargs["answer_format"] == "last_number" and config.rollout.system_prompt
    assert config.eval.temperature == config.rollout.temperature > 0  # evals sample the policy being trained
    summary = train(config)
    records = read_metrics(summary.out_dir / "metrics.jsonl")
    assert not [r for r in records if r["phase"] == "warmup"], "pure GRPO from the base model: no warm-up"
    steps = [r for r in records if r["phase"] == "train"]
    assert len(steps) == 2 and all(0.0 <= r["rollout/reward_mean"] <= 1.0 for r in steps)
    final = summary.out_dir / "final_model"
    cfg = json.loads((final / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert not (final / "adapter_config.json").exists()  # merged weights, not a peft folder
