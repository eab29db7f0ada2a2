"""The chat encoder (``relax_gym.chat``) with the real Qwen3 tokenizer, on hand-written Qwen3-style
outputs (``<think>`` blocks, several tool calls per turn), plus a made-up template to show the
rules are derived, not hard-coded. Episodes are built with :class:`ChatContext`, as the rollout
manager and the eval agents build them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image
from relax_gym.chat import ChatCodec, ChatContext, TemplateError, VisionSupport
from relax_gym.vision import image_token_count

TOOLS = [
    {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                     "required": ["expression"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
]
TURN1 = ('<think>\nI need two numbers first.\nLet me call both tools.\n</think>\n\n'
         '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "search", "arguments": {"q": "population of Lyon"}}\n</tool_call>')
TURN2 = ('<think>\n17*23 is 391; Lyon has 522k people.\n</think>\n\n'
         '<tool_call>\n{"name": "calculator", "arguments": {"expression": "391+522000"}}\n</tool_call>')
TURN3 = '<think>\nDone.\n</think>\n\nThe answer is 522391.'


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Any:
    pytest.importorskip("transformers")
    from relax_gym.trainer.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="module")
def codec(qwen3_tokenizer: Any) -> ChatCodec:
    return ChatCodec(qwen3_tokenizer)


class Builder:
    """A :class:`ChatContext` fed with hand-written "sampled" tokens, and the loss mask beside it."""

    def __init__(self, codec: ChatCodec, first: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
        self.codec = codec
        self.chat = ChatContext(codec, first, tools)
        self.ids, self.context = self.chat.ids, self.chat.messages
        self.mask = [0] * len(self.ids)
        self.eos = codec.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def sample(self, text: str, *, stopped: bool = True) -> None:
        seg = self.codec.encode(text) + ([self.eos] if stopped else [])
        glue = self.chat.add_reply(seg).glue
        self.mask += [1] * len(seg) + [0] * len(glue)

    def observe(self, msgs: list[dict[str, Any]]) -> None:
        self.mask += [0] * len(self.chat.add_observation(msgs).ids)


def test_compiled_render_matches_apply_chat_template(codec: ChatCodec, qwen3_tokenizer: Any) -> None:
    convs = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": TURN1},
         {"role": "tool", "content": "391"}, {"role": "tool", "content": "522000"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": TURN3}, {"role": "user", "content": "again"}],
    ]
    for conv in convs:
        for tools in (None, TOOLS):
            for gen in (False, True):
                assert codec.render(conv, tools=tools, add_generation_prompt=gen) == qwen3_tokenizer.apply_chat_template(
                    conv, tools=tools, tokenize=False, add_generation_prompt=gen)


def test_glue_is_derived_from_the_template(codec: ChatCodec, qwen3_tokenizer: Any) -> None:
    assert codec.closing_glue == codec.encode("<|im_end|>\n")
    eos, nl = codec.closing_glue
    assert codec.split_segment([5, 6, eos]) == (1, [nl])  # stopped on <|im_end|>: only "\n" is glue
    assert codec.split_segment([5, 6]) == (0, [eos, nl])  # stopped on length: the whole closing
    endoftext = qwen3_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert codec.split_segment([5, endoftext]) == (0, [eos, nl])
    custom = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}[/END]\n{% endfor %}"
              "{% if add_generation_prompt %}[assistant]{% endif %}")
    other = ChatCodec(qwen3_tokenizer, chat_template=custom)
    assert other.closing_glue == other.encode("[/END]\n")
    delta = other.observation_delta([{"role": "tool", "content": "42"}])
    assert delta.text == "[tool]42[/END]\n[assistant]"


def test_tool_episode_deltas_equal_the_full_render(codec: ChatCodec) -> None:
    first = [{"role": "system", "content": "You are careful."}, {"role": "user", "content": "17*23 + people in Lyon?"}]
    b = Builder(codec, first, TOOLS)
    prompt_len = len(b.ids)
    b.sample(TURN1)
    b.observe([{"role": "tool", "content": "391"}, {"role": "tool", "content": "522000"}])  # two results, one block
    b.sample(TURN2)
    b.observe([{"role": "tool", "content": "522391"}])
    before_last = len(b.ids)
    b.sample(TURN3)
    # canonical sampled tokens: the whole sequence is exactly the template's tokenization
    full = codec.render(b.context, tools=TOOLS) + ""
    assert b.ids == codec.encode(full)
    assert codec.check_drift(b.ids[:before_last], b.context[:-1], TOOLS, policy="keep").kind == "none"
    assert b.chat.check_drift().kind == "none"  # the same check, from the context's own bookkeeping
    # masks: 1 exactly on the sampled assistant tokens
    sampled = [t for t, m in zip(b.ids, b.mask) if m]
    eos = b.eos
    assert sampled == codec.encode(TURN1) + [eos] + codec.encode(TURN2) + [eos] + codec.encode(TURN3) + [eos]
    assert not any(b.mask[:prompt_len])
    text_of_masked = codec.decode([t for t, m in zip(b.ids, b.mask) if not m])
    assert "<tool_response>\n391\n</tool_response>\n<tool_response>\n522000\n</tool_response>" in text_of_masked
    assert text_of_masked.count("<|im_start|>assistant\n") == 3  # three generation prompts, all mask 0


def test_user_turn_makes_the_template_drop_earlier_thinking(codec: ChatCodec) -> None:
    first = [{"role": "user", "content": "17*23?"}]
    b = Builder(codec, first, TOOLS)
    b.sample(TURN1)
    b.observe([{"role": "tool", "content": "391"}, {"role": "tool", "content": "522000"}])
    assert not codec.template_drops_reasoning(b.context, TOOLS)  # tool results keep the reasoning
    b.sample(TURN3)
    new = [{"role": "user", "content": "Now divide by 7."}]
    assert b.chat.drops_reasoning(new)  # a new query drops it
    b.observe(new)
    keep = codec.check_drift(b.ids, b.context, TOOLS, policy="keep")
    assert (keep.kind, keep.expected, keep.drifted) == ("think_dropped", True, True)
    assert keep.first_mismatch_token is not None
    split = codec.check_drift(b.ids, b.context, TOOLS, policy="split")
    assert (split.kind, split.expected) == ("think_dropped", False)
    # the split policy's new sample: the template's own render, which agrees with itself
    fresh = codec.prompt(b.context, TOOLS)
    assert codec.check_drift(fresh.ids, b.context, TOOLS, policy="split").kind == "none"
    assert "I need two numbers" not in fresh.text


def test_length_stop_glue_and_unexpected_drift(codec: ChatCodec) -> None:
    b = Builder(codec, [{"role": "user", "content": "q"}], None)
    b.sample("<think>\nunfinished thought", stopped=False)  # length: the closing glue is all mask 0
    assert b.ids[-2:] == codec.closing_glue and b.mask[-2:] == [0, 0]
    b.observe([{"role": "tool", "content": "r"}])
    assert codec.check_drift(b.ids, b.context, None, policy="keep").kind == "none"
    broken = list(b.ids)
    broken[len(broken) // 2] = codec.encode("X")[0]  # corrupt a prompt token
    report = codec.check_drift(broken, b.context, None, policy="keep")
    assert report.kind == "template" and not report.expected and "first difference" in report.detail


def test_adapt_messages_and_empty_delta(codec: ChatCodec) -> None:
    img = Image.new("RGB", (10, 6))
    msgs, replaced = codec.adapt_messages([
        {"role": "user", "content": [{"type": "text", "text": "see "}, {"type": "image", "image": img}]},
        {"role": "tool", "content": "plain"},
    ])
    assert replaced == 1
    assert msgs[0]["content"] == "see [image: 10x6]" and msgs[1]["content"] == "plain"
    assert codec.observation_delta([], None).text == "<|im_start|>assistant\n"


def test_template_errors_are_typed(qwen3_tokenizer: Any) -> None:
    strict = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}" \
             "{{ m.content }}{% endfor %}"
    codec = ChatCodec(qwen3_tokenizer, chat_template=strict)
    with pytest.raises(TemplateError, match="no tools here"):
        codec.observation_delta([{"role": "tool", "content": "x"}])


def test_vision_codec_expands_pads_per_image(qwen3_tokenizer: Any) -> None:
    from relax_gym.trainer.models import build_image_processor
    from relax_gym.trainer.models.chat_templates import QWEN3_VL_CHAT_TEMPLATE

    pad = qwen3_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    codec = ChatCodec(qwen3_tokenizer, chat_template=QWEN3_VL_CHAT_TEMPLATE,
                      vision=VisionSupport(build_image_processor(), pad, 2))
    rng = np.random.default_rng(0)
    a = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    b = Image.fromarray(rng.integers(0, 255, (64, 32, 3), dtype=np.uint8))
    first = [{"role": "user", "content": [{"type": "text", "text": "Count."}, {"type": "image", "image": a}]}]
    prompt = codec.prompt(first)
    assert prompt.images == [a] and len(prompt.grids) == 1
    assert prompt.ids.count(pad) == image_token_count(prompt.grids[0], 2) > 1
    delta = codec.observation_delta([{"role": "user", "content": [{"type": "image", "image": b}, {"type": "text", "text": "?"}]}])
    assert delta.images == [b] and delta.ids.count(pad) == image_token_count(delta.grids[0], 2)
    assert delta.grids[0] != prompt.grids[0]
    # a context keeps both images in placeholder order, each once, for the engine's image_data
    chat = ChatContext(codec, first)
    chat.add_reply(codec.encode("2") + codec.closing_glue[:1])
    chat.add_observation([{"role": "user", "content": [{"type": "image", "image": b}]}])
    assert [p.image.size for p in chat.images] == [(64, 48), (32, 64)] and len(chat.payloads) == 2
    assert chat.ids.count(pad) == sum(image_token_count(g, 2) for g in chat.grids)


def test_non_canonical_think_whitespace_is_neither_dropped_reasoning_nor_a_split(codec: ChatCodec) -> None:
    """A model that writes ``<think>x</think>y`` (no newlines) or pads the tags with spaces: the
    Qwen3 template re-spaces the block, but drops nothing, so it is labelled think_whitespace,
    accepted under every policy, and the split policy does not start a new sample."""
    first = [{"role": "user", "content": "17*23?"}]
    for turn in ('<think>I need the product.</think><tool_call>\n{"name": "calculator", "arguments": '
                 '{"expression": "17*23"}}\n</tool_call>',
                 '<think>  I need the product.  </think>  <tool_call>\n{"name": "calculator", "arguments": '
                 '{"expression": "17*23"}}\n</tool_call>'):
        b = Builder(codec, first, TOOLS)
        b.sample(turn)
        b.observe([{"role": "tool", "content": "391"}])
        assert not codec.template_drops_reasoning(b.context, TOOLS)
        assert not b.chat.drops_reasoning([{"role": "tool", "content": "again"}])
        for policy in ("keep", "split"):
            report = codec.check_drift(b.ids, b.context, TOOLS, policy=policy)  # type: ignore[arg-type]
            assert (report.kind, report.expected) == ("think_whitespace", True), report
        # a new user query still drops the reasoning: that stays think_dropped
        b.sample("<think>Done.</think>391")
        new = [{"role": "user", "content": "Now divide by 7."}]
        assert b.chat.drops_reasoning(new)
        b.observe(new)
        assert codec.check_drift(b.ids, b.context, TOOLS, policy="split").kind == "think_dropped"
        # text that differs beyond whitespace is still template drift
        other = [*b.context[:-1], {"role": "user", "content": "Now divide by 8."}]
        assert codec.check_drift(b.ids, other, TOOLS, policy="keep").kind == "template"

def test_tool_call_tags_survive_when_the_tokenizer_marks_them_special(tmp_path: Any) -> None:
    """A GGUF-converted Qwen2.5 vocabulary can mark ``<tool_call>`` special; the env's text must
    still hold the tags (other special tokens are dropped as before)."""
    pytest.importorskip("transformers")
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from relax_gym.trainer.models import train_tiny_bpe

    tok = AutoTokenizer.from_pretrained(str(train_tiny_bpe(tmp_path / "bpe")))
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    plain = ChatCodec(tok)
    assert plain.action_text(plain.encode(call + "<|endoftext|>")) == call
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True, normalized=False)
                                                          for t in ("<tool_call>", "</tool_call>")]},
                           replace_extra_special_tokens=False)
    codec = ChatCodec(tok)
    ids = codec.encode(call) + [tok.convert_tokens_to_ids("<|endoftext|>")]
    assert tok.decode(ids, skip_special_tokens=True).strip().startswith("{")  # what used to reach the env
    chat = ChatContext(codec, [{"role": "user", "content": "1+?"}])
    assert chat.add_reply(ids + codec.closing_glue[:1]).action_text == call


def test_chat_completions_parse_tool_calls_whose_tags_the_tokenizer_marks_special(tmp_path: Any) -> None:
    """The engine's /v1/chat/completions decodes without special tokens; with a vocabulary that
    marks ``<tool_call>`` special that erased the call, so the parser reads a re-decoded text that
    keeps the tags (and is cut at a stop string as the plain text was)."""
    pytest.importorskip("transformers")
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from relax_gym.trainer.engines.chat_completions import structured_text
    from relax_gym.trainer.engines.tool_calls import parse_tool_calls
    from relax_gym.trainer.models import train_tiny_bpe

    tok = AutoTokenizer.from_pretrained(str(train_tiny_bpe(tmp_path / "bpe")))
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    ids = list(tok.encode(call, add_special_tokens=False))
    plain = tok.decode(ids, skip_special_tokens=True)
    assert structured_text(tok, ids, plain, None) == plain  # tags not special: nothing to redo
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True, normalized=False)
                                                          for t in ("<tool_call>", "</tool_call>")]},
                           replace_extra_special_tokens=False)
    ids = list(tok.encode(call + " STOP more", add_special_tokens=False)) + [tok.convert_tokens_to_ids("<|endoftext|>")]
    lost = tok.decode(ids, skip_special_tokens=True)
    assert "<tool_call>" not in lost
    text = structured_text(tok, ids, lost, ["STOP"])
    assert text.strip() == call and "<|endoftext|>" not in text
    calls, _ = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1})]
