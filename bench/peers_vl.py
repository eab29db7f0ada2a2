"""The image workload's pieces that both sides of bench/peers.py share (``--workload vl``).

Imported by bench/peers.py (relax-gym's venv) and by bench/peers_trl.py (TRL's venv), so it
imports only the standard library at module level and never imports relax_gym:

* :func:`build_processor` -- transformers' ``Qwen3VLProcessor`` without torchvision: the PIL
  image processor (``Qwen2VLImageProcessorPil``, the one relax-gym's own codec uses), no video
  processor, and the processor's class check skipped while it is built (that check looks the
  video processor up in an auto mapping that is a placeholder without torchvision; it checks
  only types). Placeholder expansion, tokenization and ``mm_token_type_ids`` are the
  processor's own.
* :func:`last_boxed` and :func:`scene_score` -- relax/SceneQuery-v0's grading rewritten from its
  rules (``relax_gym.answers`` and ``envs/scene_query.py``) for the TRL side, which cannot
  import relax_gym: the last complete ``\\boxed{}``/``\\fbox{}`` (braces matched by depth,
  ``\\{ \\} \\\\`` escapes, ``\\boxed word`` after a space, a box holding only one box answers
  with the inner one, an unclosed box passed over, over 1000 characters is no answer), then the
  word stripped of spaces and dots, lower-cased, ``\\text{}`` unwrapped, checked against the
  allowed words: 1.0 right, 0.1 a wrong allowed word, 0 otherwise; success = right.
  bench/peers.py checks it against the env's own matcher on random strings before a run.
"""

from __future__ import annotations

from typing import Any

MAX_ANSWER_CHARS = 1000  # envs/_answers.py: a longer box is no answer
FORMAT_REWARD = 0.1  # envs/_base.py: a well-formed wrong answer
_COMMANDS = ("boxed", "fbox")


def _token_after_spaces(text: str, i: int) -> tuple[int, int] | None:
    """``\\boxed 5``: one or more plain spaces, then 1-200 characters that are neither
    whitespace nor ``$ { } \\``; the token's span, or None."""
    j = i
    while j < len(text) and text[j] == " ":
        j += 1
    if j == i:
        return None
    k = j
    while k < len(text) and k - j < 200 and not (text[k].isspace() or text[k] in "${}\\"):
        k += 1
    return (j, k) if k > j else None


def last_boxed(text: str) -> str | None:
    """The content of the last complete top-level box (stripped), or None (see the module doc)."""
    if not isinstance(text, str):
        return None
    done: list[dict[str, Any]] = []  # complete boxes, in order of completion (nested ones adopted)
    stack: list[dict[str, Any]] = []  # open boxes; each counts its own open plain braces
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            name = next((c for c in _COMMANDS if text.startswith(c, i + 1)), None)
            after = i + 1 + len(name) if name else -1
            if name is not None and not (after < n and text[after].isascii() and text[after].isalpha()):
                j = after
                while j < n and text[j].isspace():
                    j += 1
                if j < n and text[j] == "{":  # a box opens
                    stack.append({"start": i, "begin": j + 1, "depth": 0})
                    i = j + 1
                    continue
                span = _token_after_spaces(text, after)
                if span is not None:  # a one-token box; its characters hold nothing to scan
                    done.append({"start": i, "begin": span[0], "end": span[1], "stop": span[1], "inner": None})
                i = after
                continue
            i += 2  # an escape: the backslash and whatever follows it
            continue
        if ch == "{" and stack:
            stack[-1]["depth"] += 1
        elif ch == "}" and stack:
            if stack[-1]["depth"]:
                stack[-1]["depth"] -= 1
            else:
                box = stack.pop()
                box.update(end=i, stop=i + 1, inner=None)
                inside, child = 0, box  # the complete boxes found inside this one are adopted
                while done and done[-1]["start"] > box["start"]:
                    child = done.pop()
                    inside += 1
                if inside == 1:
                    before, after_child = text[box["begin"]:child["start"]], text[child["stop"]:box["end"]]
                    if (not before or before.isspace()) and (not after_child or after_child.isspace()):
                        box["inner"] = child
                done.append(box)
        i += 1
    if not done:
        return None
    box = done[-1]
    while box["inner"] is not None:
        box = box["inner"]
    return text[box["begin"]:box["end"]].strip()


def scene_score(text: str, answer: str, options: list[str]) -> tuple[float, bool]:
    """(reward, success) of a reply to a SceneQuery question whose right word is ``answer``."""
    raw = last_boxed(text)
    if raw is None or len(raw) > MAX_ANSWER_CHARS:
        return 0.0, False
    word = raw.strip().strip(".").lower().removeprefix("\\text{").removesuffix("}").strip()
    if word not in options:
        return 0.0, False
    return (1.0, True) if word == answer else (FORMAT_REWARD, False)


def build_processor(model_dir: str) -> Any:
    """transformers' Qwen3VLProcessor for ``model_dir`` without torchvision (see the module doc);
    its tokenizer pads on the left, as generation needs."""
    from unittest import mock

    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.processing_utils import ProcessorMixin

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    with open(f"{model_dir}/chat_template.jinja", encoding="utf-8") as f:
        template = f.read()
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                                chat_template=template)


def load_model(model_dir: str) -> Any:
    import torch
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)


def replies(model: Any, processor: Any, rows: list[dict[str, Any]], images: list[Any],
            max_new_tokens: int, batch: int = 32, generate: Any = None,
            template_kwargs: dict[str, Any] | None = None, sample_seed: int | None = None) -> list[str]:
    """Replies to ``rows``' prompts (chat messages with image placeholders) and their images,
    through the processor (chat template with ``template_kwargs``) and ``generate`` (default
    ``model.generate``) on left-padded batches: greedy, or with ``sample_seed`` sampled at
    temperature 1 without top-k/top-p (torch's generator seeded first)."""
    import torch

    sampling: dict[str, Any] = {"do_sample": False}
    if sample_seed is not None:
        torch.manual_seed(sample_seed)
        sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}

    generate = generate or model.generate

    tok = processor.tokenizer
    out_texts: list[str] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            chunk, imgs = rows[i: i + batch], images[i: i + batch]
            texts = [processor.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True,
                                                   **(template_kwargs or {})) for r in chunk]
            enc = processor(text=texts, images=imgs, return_tensors="pt", padding=True)
            out = generate(**enc, **sampling, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
            out_texts += [tok.decode(row, skip_special_tokens=True) for row in out[:, enc["input_ids"].shape[1]:]]
    if was_training:
        model.train()
    return out_texts
