"""Write a small HF Llama / Qwen2 / Qwen3 folder as a GGUF file, the way llama.cpp lays one out.

Why: tests of the GGUF importer must not download a checkpoint, so they build a tiny random model
from a config, write it here as GGUF (F32, F16 or a block quantisation that ``gguf`` can encode,
e.g. Q8_0 / Q4_0 / Q4_1) and import it back. It follows llama.cpp's conventions that readers
rely on: ``blk.N.*`` tensor names, Llama's rotary permutation of the q/k rows, norms kept F32,
no ``output.weight`` when the head is tied, and the byte-level BPE vocabulary, merges, token types
and chat template under ``tokenizer.ggml.*``. Only what the importer reads is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.errors import RelaxGymError

# HF model_type -> (GGUF architecture, tokenizer.ggml.pre)
_ARCHS: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_LAYER_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


class GGUFWriteError(RelaxGymError, ValueError):
    """The folder cannot be written as GGUF by this small writer."""


def _gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 3:
        rest = ".".join(parts[3:])
        if rest in _LAYER_NAMES:
            return f"blk.{parts[2]}.{_LAYER_NAMES[rest]}"
    raise GGUFWriteError(f"no GGUF name for tensor {hf_name!r}")


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for Llama (the importer's reader undoes it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _byte_level_vocab(tokenizer_json: dict[str, Any]) -> tuple[list[str], list[int], list[str]]:
    """Tokens (byte-level spelling), llama.cpp token types and merges from a tokenizer.json."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise GGUFWriteError(f"only byte-level BPE tokenizers are written, not {model.get('type')!r}")
    vocab: dict[str, int] = dict(model["vocab"])
    types: dict[int, int] = {}
    for added in tokenizer_json.get("added_tokens", []):
        vocab[added["content"]] = int(added["id"])
        types[int(added["id"])] = 3 if added.get("special") else 4  # CONTROL / USER_DEFINED
    size = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    for tok, idx in vocab.items():
        tokens[idx] = tok
    token_types = [types.get(i, 1) for i in range(size)]  # 1 = NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, token_types, merges


def write_gguf(model_dir: str | Path, out_file: str | Path, *, qtype: str = "F32", pre: str | None = None) -> Path:
    """Write the HF folder ``model_dir`` (Llama, Qwen2 or Qwen3, byte-level BPE tokenizer) as GGUF.

    ``qtype`` names a ``gguf.GGMLQuantizationType`` (F32, F16, Q8_0, Q4_0, Q4_1...) used for the
    2-D weights; norms and biases stay F32, as llama.cpp keeps them. ``pre`` is the
    ``tokenizer.ggml.pre`` name (default: ``qwen2`` for Qwen, ``gpt2`` otherwise).
    """
    import gguf
    from safetensors.numpy import load_file

    src = Path(model_dir)
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type")
    if model_type not in _ARCHS:
        raise GGUFWriteError(f"cannot write model_type {model_type!r} as GGUF (known: {sorted(_ARCHS)})")
    arch = _ARCHS[model_type]
    try:
        quant = gguf.GGMLQuantizationType[qtype.upper()]
    except KeyError:
        raise GGUFWriteError(f"unknown GGUF type {qtype!r}") from None
    tensors = load_file(str(src / "model.safetensors"))
    tok_json = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = tok_cfg.get("chat_template")
    if template is None and (src / "chat_template.jinja").is_file():
        template = (src / "chat_template.jinja").read_text(encoding="utf-8")
    tokens, token_types, merges = _byte_level_vocab(tok_json)
    n_head, n_kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // n_head)

    out = Path(out_file)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(str(config.get("_name_or_path") or src.name))
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(int(quant) if quant != gguf.GGMLQuantizationType.F32 else 0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre or ("qwen2" if model_type.startswith("qwen") else "gpt2"))
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    ids = {t: i for i, t in enumerate(tokens)}
    for key, setter in (("eos_token", writer.add_eos_token_id), ("pad_token", writer.add_pad_token_id),
                        ("bos_token", writer.add_bos_token_id)):
        value = tok_cfg.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value in ids:
            setter(ids[value])
    writer.add_add_bos_token(False)
    if template:
        writer.add_chat_template(template)

    tied = bool(config.get("tie_word_embeddings")) or "lm_head.weight" not in tensors
    for name in sorted(tensors, key=_tensor_order):
        if name == "lm_head.weight" and tied:
            continue
        data = tensors[name].astype(np.float32)
        gname = _gguf_name(name)
        if arch == "llama" and gname.endswith("attn_q.weight"):
            data = _llama_permute(data, n_head)
        elif arch == "llama" and gname.endswith("attn_k.weight"):
            data = _llama_permute(data, n_kv)
        if data.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            packed = gguf.quants.quantize(data, quant)
            writer.add_tensor(gname, packed, raw_dtype=quant)
        else:
            writer.add_tensor(gname, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _tensor_order(name: str) -> tuple[int, int, str]:
    """llama.cpp's order: embeddings, then layers by index, then the final norm and head."""
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        return (1, int(parts[2]), name)
    return (0 if "embed" in name else 2, 0, name)


__all__ = ["GGUFWriteError", "write_gguf"]
