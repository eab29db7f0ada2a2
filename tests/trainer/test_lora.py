"""LoRA on the torch backend: exact at step 0, trains only adapters, and the engine / saved folder
get merged plain-HF weights."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("peft")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from relax_gym.trainer.algorithms import AlgorithmConfig  # noqa: E402
from relax_gym.trainer.backends.base import OptimizerSettings, PolicyObjective  # noqa: E402
from relax_gym.trainer.backends.lora import LoraError, LoraSettings  # noqa: E402
from relax_gym.trainer.backends.pytorch import TorchBackend  # noqa: E402
from relax_gym.trainer.config import ConfigError, config_from_dict  # noqa: E402
from relax_gym.trainer.engines.model_runner import ModelRunner  # noqa: E402

from .test_torch_backend import text_batch  # noqa: E402


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax_gym.trainer.models import build_tiny_model

    return build_tiny_model("llama", tmp_path_factory.mktemp("lora-llama"), seed=0, tokenizer="tiny-bpe")


@pytest.mark.parametrize("rank", [8, pytest.param(1, marks=pytest.mark.slow)])
def test_lora_loss_equals_full_finetuning_at_step_0(tiny_llama: Path, rank: int) -> None:
    batch = text_batch(6)
    objective = PolicyObjective(AlgorithmConfig())
    settings = OptimizerSettings(lr=1e-2, grad_clip=None)
    full = TorchBackend(tiny_llama, micro_batch_size=4, optimizer=settings)
    lora = TorchBackend(tiny_llama, micro_batch_size=4, optimizer=settings,
                        lora=LoraSettings(rank=rank, target_modules=["q_proj", "v_proj", "down_proj"]))
    ref_lp = full.compute_logprobs(batch).logprobs
    for a, b in zip(ref_lp, lora.compute_logprobs(batch).logprobs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    m_full, m_lora = full.train_step(batch, objective), lora.train_step(batch, objective)
    assert m_full["loss"] == pytest.approx(m_lora["loss"], abs=1e-6)
    # Only adapters were trainable: after the step, merged weights moved only where adapters sit.
    before = dict(TorchBackend(tiny_llama).named_weights())
    after = dict(lora.named_weights())
    assert set(after) == set(before)  # plain HF names, no peft prefixes, no lora_A/lora_B
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for n in changed)
    trainable = sum(p.numel() for p in lora.model.parameters() if p.requires_grad)
    assert trainable < sum(p.numel() for p in full.model.parameters() if p.requires_grad) / 4


@pytest.mark.slow  # about 15 s under load: two train steps, an engine runner, a saved folder, a reload
def test_merged_weights_reach_the_engine_and_the_saved_folder(tiny_llama: Path, tmp_path: Path) -> None:
    be = TorchBackend(tiny_llama, micro_batch_size=8, optimizer=OptimizerSettings(lr=5e-2),
                      lora=LoraSettings(rank=4, save_adapter=True))
    batch = text_batch(4)
    for _ in range(2):
        be.train_step(batch, PolicyObjective(AlgorithmConfig()))
    trained = be.compute_logprobs(batch).logprobs
    runner = ModelRunner(tiny_llama)
    assert runner.load_named_tensors(be.named_weights()) > 0  # what weight sync sends, as the engine takes it
    folder = be.save_pretrained(tmp_path / "merged")
    assert (folder / "adapter" / "adapter_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    for ids, lp, mask in zip(batch.input_ids, trained, batch.loss_mask, strict=True):
        with torch.no_grad():
            x = torch.tensor([ids])
            ref = torch.log_softmax(model(x).logits[0, :-1], -1).gather(1, x[0, 1:, None]).squeeze(1)
            eng = torch.log_softmax(runner.model(x).logits[0, :-1], -1).gather(1, x[0, 1:, None]).squeeze(1)
        m = torch.tensor(mask[1:], dtype=torch.bool)
        torch.testing.assert_close(ref[m], lp[1:][m], atol=1e-5, rtol=0)
        torch.testing.assert_close(eng[m], lp[1:][m], atol=1e-5, rtol=0)
    # The backend state round-trips with the adapters unmerged.
    be.save_state(tmp_path / "state")
    again = TorchBackend(tiny_llama, lora=LoraSettings(rank=4, save_adapter=True))
    again.load_state(tmp_path / "state")
    for a, b in zip(trained, again.compute_logprobs(batch).logprobs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_bad_lora_settings_are_clear(tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(LoraError, match="match no linear layer"):
        TorchBackend(tiny_llama, lora=LoraSettings(target_modules=["qkv_proj"]))
    with pytest.raises(ConfigError, match="rank"):
        config_from_dict({"model": {"path": "x", "lora": {"rank": 0}}})
