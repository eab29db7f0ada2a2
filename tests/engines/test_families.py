"""The imported real families (Llama / SmolLM2, Qwen2 / Qwen2.5) served by the embedded engine:
exact logprobs against a fresh forward pass, the chat template with tools, and Hermes tool-call
parsing; families the engine cannot serve are refused by name (engine and torch backend)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from relax_gym.trainer.engines.launch import EmbeddedEngineProcess
from relax_gym.trainer.models import build_tiny_model
from relax_gym.trainer.models.tiny import GEMMA3_SLIDING_WINDOW
from relax_gym.trainer.models.architectures import UnsupportedArchitecture, served_context
from relax_gym.trainer.models.chat_templates import CHATML_TOOLS_TEMPLATE
from transformers import AutoModelForCausalLM, AutoTokenizer

from relax_gym.protocol import ChatCompletionRequest, EngineClient, GenerateRequest, SamplingParams
from tests.scripted_model import teach_completions

from .conftest import ADD_TOOL, TOOL_ANSWER, TOOL_QUESTION, chat_prompt_ids, start_engine

# A served engine per family (teaching a tool call + start-up: about a minute each under load) is
# the slow step's; the default suite checks the same batched prefill/decode path in-process below.
FAMILIES = [pytest.param(k, id=k, marks=pytest.mark.slow) for k in ("llama", "qwen2")]


@pytest.fixture(scope="module", params=FAMILIES)
def family_engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[str, Path, EmbeddedEngineProcess]]:
    """A tiny model of the family, with the ChatML-tools template imported models get, taught
    to answer TOOL_QUESTION with one ``add`` call; served on 127.0.0.1."""
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    base = build_tiny_model(kind, root / "base", tokenizer="tiny-bpe", seed=0)
    tok = AutoTokenizer.from_pretrained(str(base))
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    tok.save_pretrained(str(base))
    prompt = chat_prompt_ids(tok, TOOL_QUESTION, [ADD_TOOL])
    answer = list(tok(TOOL_ANSWER, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids("<|im_end|>")]
    # Llama has no q/k norms: a gentler rate, with the embeddings, memorises the longer prompt
    model = teach_completions(base, root / "scripted", [(prompt, answer)], lr=1e-2, train_embeddings=True,
                              max_steps=1500)
    engine = start_engine(model)
    yield kind, model, engine
    engine.stop()


async def test_family_logprobs_match_a_fresh_forward(family_engine: tuple[str, Path, EmbeddedEngineProcess]) -> None:
    kind, model_dir, engine = family_engine
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    base = chat_prompt_ids(tok, [{"role": "user", "content": "How many red circles are there?"}])
    prompts = [base, base[:5], base + [100, 200, 300], base[2:]]  # different lengths: left padding in a batch
    temps = [1.0, 0.7, 1.0, 1.3]
    async with EngineClient(engine.url) as client:
        outs = await asyncio.gather(*(
            client.generate(GenerateRequest(input_ids=p, return_logprob=True, sampling_params=SamplingParams(
                max_new_tokens=20, temperature=t, ignore_eos=True, sampling_seed=i)))
            for i, (p, t) in enumerate(zip(prompts, temps, strict=True))
        ))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    assert model.config.model_type == kind
    worst = 0.0
    for p, t, out in zip(prompts, temps, outs, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([p + out.output_ids])).logits[0, len(p) - 1 : -1]
        ref = torch.log_softmax(logits / t, -1).gather(1, torch.tensor(out.output_ids)[:, None]).squeeze(1)
        worst = max(worst, float((ref - torch.tensor(out.token_logprobs())).abs().max()))
    assert worst < 1e-4, f"{kind}: max |engine - fresh forward| = {worst:.2e}"


async def test_family_tool_call_is_parsed(family_engine: tuple[str, Path, EmbeddedEngineProcess]) -> None:
    _, _, engine = family_engine
    async with EngineClient(engine.url) as client:
        out = await client.chat_completions(ChatCompletionRequest(
            messages=TOOL_QUESTION, tools=[ADD_TOOL], temperature=0.0, max_tokens=64))
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])
def test_family_batched_prefill_and_decode_match_a_fresh_forward(kind: str, tmp_path: Path) -> None:
    """The engine's model runner on the family: a left-padded batch of prompts of different
    lengths, prefilled together, then decoded greedily a few steps through the shared KV cache.
    For Gemma-3 the long row ends one token short of the sliding window, where its sliding
    layers still see every earlier token."""
    from relax_gym.trainer.engines.model_runner import ModelRunner, SeqInput

    folder = build_tiny_model(kind, tmp_path / kind, tokenizer="tiny-bpe", seed=1)
    runner = ModelRunner(folder)
    steps = 4
    prompts = [[5, 17, 42, 99, 7, 250, 31], [8, 300, 12]]
    if kind == "gemma3":
        assert runner.max_context == GEMMA3_SLIDING_WINDOW  # served within its window
        prompts[0] = [(7 * i) % 400 + 3 for i in range(GEMMA3_SLIDING_WINDOW - steps - 1)]
    out = runner.prefill([SeqInput(input_ids=p) for p in prompts])
    seqs = [list(p) for p in prompts]
    got: list[list[torch.Tensor]] = [[], []]
    logits, positions = out.last_logits, list(out.next_positions)
    for _ in range(steps):
        tokens = logits.argmax(-1).tolist()
        for i, t in enumerate(tokens):
            got[i].append(torch.log_softmax(logits[i], -1)[t])
            seqs[i].append(t)
        logits = runner.decode(out.kv, tokens, positions, out.rope_deltas)
        positions = [p + 1 for p in positions]
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    for p, seq, lps in zip(prompts, seqs, got, strict=True):
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([seq])).logits[0, len(p) - 1 : -1], -1)
        want = ref.gather(1, torch.tensor(seq[len(p):])[:, None]).squeeze(1)
        assert float((want - torch.stack(lps)).abs().max()) < 1e-4


def _mistral_folder(tmp: Path) -> Path:
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=16)
    MistralForCausalLM(cfg).save_pretrained(str(tmp / "mistral"))
    return tmp / "mistral"


def test_unsupported_family_is_refused_by_name(tmp_path: Path) -> None:
    from relax_gym.trainer.backends.pytorch import BackendError, TorchBackend
    from relax_gym.trainer.engines.model_runner import ModelRunner

    folder = _mistral_folder(tmp_path)
    with pytest.raises(UnsupportedArchitecture, match="'mistral'.*not supported by the embedded engine.*llama"):
        ModelRunner(folder)
    with pytest.raises(BackendError, match="'mistral'.*not supported by the torch backend"):
        TorchBackend(folder)


def test_sliding_window_family_is_served_within_its_window_and_not_trained(tmp_path: Path) -> None:
    """Gemma-3: the engine's context is the sliding window (not the 8k of its positions); the
    torch backend refuses to train it, with a line that says why."""
    from relax_gym.trainer.backends.pytorch import BackendError, TorchBackend
    from transformers import AutoConfig

    folder = build_tiny_model("gemma3", tmp_path / "g", tokenizer="tiny-bpe", seed=0)
    config = AutoConfig.from_pretrained(str(folder))
    assert config.max_position_embeddings > GEMMA3_SLIDING_WINDOW
    assert served_context(config) == GEMMA3_SLIDING_WINDOW
    assert served_context(AutoConfig.from_pretrained(str(build_tiny_model("llama", tmp_path / "l", tokenizer="tiny-bpe")))) == 8192
    with pytest.raises(BackendError, match="'gemma3_text'.*evaluation only.*torch backend does not train"):
        TorchBackend(folder)
