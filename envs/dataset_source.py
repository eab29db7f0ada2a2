"""Reading a dataset for :mod:`relax_gym.envs.dataset`: files or an in-memory
``datasets.Dataset``, the column mapping, splits, filters and the seed -> row order.

Files are read through the ``datasets`` library (memory-mapped Arrow: a file bigger than RAM
works). A :class:`DatasetSource` is built once per process for a given set of files and
options and shared by every env made from it -- the rollout makes one env per episode, so
opening the file per env would cost a full read each time.

Errors at load time are :class:`DatasetConfigError` and name the file, the row (0-based within
that file) and the column. Rows dropped by a filter are counted in :class:`DatasetReport` and
logged, never dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.errors import MediaError, RelaxGymError
from relax_gym.types import ContentPart, Message, TextPart

from .dataset_media import MEDIA_KINDS, is_missing, items_of, to_part
from .dataset_order import EpochOrder

log = logging.getLogger("relax_gym.envs.dataset")

SUFFIX_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
FORMATS = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet"}
_MAX_SOURCES = 8


class DatasetConfigError(RelaxGymError, ValueError):
    """A dataset env's configuration or data is unusable; the message says where and why."""


class RowError(RelaxGymError, ValueError):
    """One row could not be turned into an episode (a bad cell, an unreadable image)."""

    def __init__(self, where: str, column: str | None, cause: str) -> None:
        self.where = where
        self.column = column
        self.cause = cause
        col = f" column {column!r}" if column else ""
        super().__init__(f"{where}{col}: {cause}")


# ------------------------------------------------------------------------------------------------
# what a source is built from
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceOptions:
    """The options that decide which rows exist and what each becomes (the cache key)."""

    path: Any
    format: str | None = None
    prompt: str = "prompt"
    answer: str | None = "answer"
    system: str | None = None
    image: tuple[str, ...] = ()
    audio: tuple[str, ...] = ()
    video: tuple[str, ...] = ()
    tools_column: str | None = None
    reward_kwargs_column: str | None = None
    oracle_column: str | None = None
    extra_columns: tuple[str, ...] = ()
    media_root: str | None = None
    split: str | None = None
    split_column: str | None = None
    test_fraction: float = 0.0
    split_seed: int = 0
    shuffle: bool = True
    shuffle_seed: int = 0
    max_prompt_tokens: int | None = None
    tokenizer: str | None = None
    drop_missing_media: bool = True
    validate_rows: int = 8
    max_bad_rows: int = 100
    cache_dir: str | None = None
    video_fps: float = 2.0
    video_max_frames: int = 16
    audio_sample_rate: int | None = None

    def media_columns(self) -> list[tuple[str, str]]:
        return [(kind, col) for kind in MEDIA_KINDS for col in getattr(self, kind)]

    def mapped_columns(self) -> dict[str, str]:
        """column -> the role it was mapped as (for error messages)."""
        out: dict[str, str] = {self.prompt: "prompt"}
        for role in ("answer", "system", "tools_column", "reward_kwargs_column", "oracle_column", "split_column"):
            col = getattr(self, role)
            if col:
                out[col] = role
        for kind, col in self.media_columns():
            out[col] = kind
        for col in self.extra_columns:
            out.setdefault(col, "extra")
        return out


@dataclass(frozen=True)
class DataFile:
    """Rows ``[start, stop)`` of the loaded dataset came from ``name`` (media resolve in ``root``)."""

    name: str
    start: int
    stop: int
    root: Path | None


@dataclass
class DatasetReport:
    """What was read and what was dropped, with reasons -- shown at load and in ``info``."""

    files: list[str]
    rows_total: int = 0
    rows_split: int = 0
    rows_used: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    bad_rows: int = 0

    def drop(self, reason: str, where: str) -> None:
        self.dropped[reason] += 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < 3:
            shown.append(where)

    def summary(self) -> str:
        files = ", ".join(self.files[:3]) + (f" (+{len(self.files) - 3} more)" if len(self.files) > 3 else "")
        text = f"{files}: {self.rows_total} rows, {self.rows_split} in the split, {self.rows_used} used"
        if self.dropped:
            parts = [f"{n} {reason} (e.g. {'; '.join(self.examples.get(reason, []))})"
                     for reason, n in sorted(self.dropped.items())]
            text += "; dropped " + ", ".join(parts)
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"files": list(self.files), "rows_total": self.rows_total, "rows_split": self.rows_split,
                "rows_used": self.rows_used, "dropped": dict(self.dropped), "bad_rows": self.bad_rows}


@dataclass
class RowTask:
    """One row, ready for an episode."""

    row: int
    where: str
    messages: list[Message]
    answer: Any
    oracle: str | None
    tools: list[str]
    reward_kwargs: dict[str, Any]
    extra: dict[str, Any]


# ------------------------------------------------------------------------------------------------
# opening files
# ------------------------------------------------------------------------------------------------
def _datasets() -> Any:
    """Import ``datasets`` offline: relax-gym never downloads at run time."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise DatasetConfigError(
            "dataset envs read files through the `datasets` library: pip install 'relax-gym[data]'"
        ) from None
    datasets.disable_progress_bars()
    return datasets


def find_files(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], fmt: str | None) -> list[Path]:
    """The data files a ``path`` names: a file, a folder (its data files, sorted), or a list."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not paths:
        raise DatasetConfigError("path: give a data file, a folder of them, or a list of files")
    out: list[Path] = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise DatasetConfigError(f"path: expected a file or folder path, got {type(p).__name__}")
        f = Path(p).expanduser()
        if f.is_dir():
            found = sorted(x for x in f.rglob("*") if x.is_file() and x.suffix.lower() in SUFFIX_BUILDERS)
            if fmt is not None:
                found = [x for x in found if SUFFIX_BUILDERS[x.suffix.lower()] == FORMATS[fmt]]
            if not found:
                raise DatasetConfigError(
                    f"path {str(f)!r}: the folder holds no data files ({', '.join(sorted(SUFFIX_BUILDERS))})"
                )
            out.extend(found)
        elif f.is_file():
            out.append(f)
        else:
            raise DatasetConfigError(f"path {str(f)!r}: no such file or folder (relative to {Path.cwd()})")
    return out


def _builder(files: list[Path], fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise DatasetConfigError(f"format {fmt!r}: expected one of {sorted(FORMATS)}")
        return FORMATS[fmt]
    kinds = set()
    for f in files:
        b = SUFFIX_BUILDERS.get(f.suffix.lower())
        if b is None:
            raise DatasetConfigError(
                f"{f}: cannot tell the format from the suffix {f.suffix!r}; give format: json|csv|parquet"
            )
        kinds.add(b)
    if len(kinds) > 1:
        raise DatasetConfigError(f"path mixes formats {sorted(kinds)}; give files of one format (or format:)")
    return kinds.pop()


def _json_error(f: Path) -> str | None:
    """Where a JSON-lines or JSON file is malformed (the ``datasets`` error does not say)."""
    try:
        with f.open("r", encoding="utf-8") as fh:
            text = fh.read(1 << 26)
    except (OSError, UnicodeDecodeError) as exc:
        return f"{f}: cannot read as UTF-8 text ({exc})"
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"{f} line {exc.lineno}: invalid JSON ({exc.msg})"
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
        return None if bad is None else f"{f} row {bad}: expected a JSON object, got {type(rows[bad]).__name__}"
    row = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            return f"{f} line {lineno} (row {row}): invalid JSON ({exc.msg})"
        if not isinstance(obj, dict):
            return f"{f} line {lineno} (row {row}): expected a JSON object, got {type(obj).__name__}"
        row += 1
    return None


def _load_file(datasets: Any, f: Path, builder: str, cache_dir: str | None) -> Any:
    try:
        return datasets.load_dataset(builder, data_files=[str(f)], split="train", cache_dir=cache_dir)
    except Exception as exc:  # noqa: BLE001 - pyarrow / datasets raise many kinds; name the file
        detail = _json_error(f) if builder == "json" else None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatasetConfigError(detail or f"{f}: cannot read as {builder}: {first}") from None


def open_dataset(options: SourceOptions) -> tuple[Any, list[DataFile]]:
    """The dataset (one Arrow table over every file) and which rows came from which file."""
    datasets = _datasets()
    root_override = Path(options.media_root).expanduser() if options.media_root else None
    if isinstance(options.path, datasets.Dataset):
        ds = options.path
        return ds, [DataFile("<in-memory dataset>", 0, len(ds), root_override or Path.cwd())]
    if isinstance(options.path, datasets.DatasetDict):
        raise DatasetConfigError(
            f"path is a DatasetDict with splits {list(options.path)}; pass one split (e.g. dd['train'])"
        )
    files = find_files(options.path, options.format)
    builder = _builder(files, options.format)
    parts, table = [], []
    start = 0
    for f in files:
        d = _load_file(datasets, f, builder, options.cache_dir)
        parts.append(d)
        table.append(DataFile(str(f), start, start + len(d), root_override or f.parent))
        start += len(d)
    if len(parts) == 1:
        return parts[0], table
    try:
        return datasets.concatenate_datasets(parts), table
    except Exception as exc:  # noqa: BLE001
        raise DatasetConfigError(
            f"the files do not share one schema ({', '.join(str(f) for f in files[:4])}...): {exc}"
        ) from None


def _undecoded(datasets: Any, feature: Any) -> Any:
    """The same feature with media decoding off: cells arrive as ``{"bytes", "path"}``."""
    media = tuple(getattr(datasets, n) for n in ("Image", "Audio", "Video") if hasattr(datasets, n))
    if isinstance(feature, media):
        return type(feature)(decode=False)
    for seq_name in ("Sequence", "List", "LargeList"):
        seq = getattr(datasets, seq_name, None)
        if seq is not None and isinstance(feature, seq):
            inner = _undecoded(datasets, feature.feature)
            if inner is feature.feature:
                return feature
            try:
                return seq(inner, length=getattr(feature, "length", -1))
            except TypeError:
                return seq(inner)
    if isinstance(feature, list) and len(feature) == 1:
        return [_undecoded(datasets, feature[0])]
    return feature


# ------------------------------------------------------------------------------------------------
# the source
# ------------------------------------------------------------------------------------------------
class DatasetSource:
    """One opened dataset: rows of the split that passed the filters, in seed order."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        datasets = _datasets()
        ds, self.files = open_dataset(options)
        self.report = DatasetReport(files=[f.name for f in self.files], rows_total=len(ds))
        self._check_columns(ds)
        wanted = list(options.mapped_columns())
        ds = ds.select_columns(wanted)
        features = {name: _undecoded(datasets, feat) for name, feat in ds.features.items()}
        if any(features[n] is not ds.features[n] for n in features):
            ds = ds.cast(datasets.Features(features))
        self.dataset = ds
        indices = self._split(ds)
        self.report.rows_split = len(indices)
        indices = self._filter_missing_media(indices)
        indices = self._filter_long_prompts(indices)
        if len(indices) == 0:
            raise DatasetConfigError(f"no rows left to use: {self.report.summary()}")
        self.indices = indices
        self.report.rows_used = len(indices)
        self.order = EpochOrder(len(indices), shuffle=options.shuffle, shuffle_seed=options.shuffle_seed)
        self._bad: set[int] = set()
        self._lock = threading.Lock()
        if self.report.dropped:
            log.warning("dataset %s", self.report.summary())
        self._validate()

    # -- checks ---------------------------------------------------------------------------------
    def _check_columns(self, ds: Any) -> None:
        names = list(ds.column_names)
        for col, role in self.options.mapped_columns().items():
            if col not in names:
                import difflib

                close = difflib.get_close_matches(col, names, n=2)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise DatasetConfigError(
                    f"{self.report.files[0] if len(self.files) == 1 else 'the dataset'}: no column {col!r} "
                    f"(mapped as {role}); its columns are {names}{hint}"
                )

    def _validate(self) -> None:
        """Build the first rows fully, so a bad mapping or an unreadable file fails now."""
        for pos in range(min(self.options.validate_rows, len(self.indices))):
            try:
                self.build(int(self.indices[pos]))
            except RowError as exc:
                raise DatasetConfigError(str(exc)) from None

    # -- where a row came from ------------------------------------------------------------------
    def file_of(self, row: int) -> DataFile:
        lo, hi = 0, len(self.files) - 1
        while lo < hi:  # files are few; a binary search keeps 10k shards cheap too
            mid = (lo + hi) // 2
            if row < self.files[mid].stop:
                hi = mid
            else:
                lo = mid + 1
        return self.files[lo]

    def where(self, row: int) -> str:
        f = self.file_of(row)
        return f"{f.name} row {row - f.start}"

    # -- split and filters ----------------------------------------------------------------------
    def _split(self, ds: Any) -> np.ndarray:
        o = self.options
        n = len(ds)
        if o.split is None:
            return np.arange(n, dtype=np.int64)
        if o.split_column:
            values = ds.data.column(o.split_column).to_pylist()
            idx = np.array([i for i, v in enumerate(values) if str(v) == o.split], dtype=np.int64)
            if len(idx) == 0:
                seen = sorted({str(v) for v in values})[:10]
                raise DatasetConfigError(f"split {o.split!r}: no row has {o.split_column}={o.split!r} (values: {seen})")
            return idx
        if o.test_fraction > 0:
            if o.split not in ("train", "test"):
                raise DatasetConfigError(f"split {o.split!r}: a seeded split (test_fraction) has 'train' and 'test'")
            n_test = max(1, int(round(n * o.test_fraction))) if n > 1 else 0
            perm = np.random.default_rng([int(o.split_seed), 0x5B17]).permutation(n)
            chosen = perm[:n_test] if o.split == "test" else perm[n_test:]
            return np.sort(chosen).astype(np.int64)
        if o.split == "train":
            return np.arange(n, dtype=np.int64)
        raise DatasetConfigError(f"split {o.split!r} needs split_column (a column naming each row's split) "
                                 "or test_fraction (a seeded train/test split)")

    def _filter_missing_media(self, indices: np.ndarray) -> np.ndarray:
        if not self.options.drop_missing_media or not self.options.media_columns():
            return indices
        keep = np.ones(len(indices), dtype=bool)
        for _, col in self.options.media_columns():
            arr = self.dataset.data.column(col)
            for f in self.files:
                lo, hi = np.searchsorted(indices, [f.start, f.stop])
                if lo == hi:
                    continue
                part = indices[lo:hi]
                values = arr.take(part)
                missing = self._missing_paths(values, f.root)
                if missing is None:  # not a plain string column: look at each cell
                    flags = [any(is_missing(item, f.root) for item in items_of(cell)) for cell in values.to_pylist()]
                    bad = np.flatnonzero(np.array(flags, dtype=bool))
                else:
                    bad = missing
                for j in bad:
                    if keep[lo + j]:
                        keep[lo + j] = False
                        self.report.drop("missing media", f"{self.where(int(part[j]))} column {col!r}")
        return indices[keep]

    @staticmethod
    def _missing_paths(values: Any, root: Path | None) -> np.ndarray | None:
        """Positions of rows whose path does not exist, checking each distinct path once (a
        million rows often name far fewer files); None when the column is not plain strings."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            return None
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        distinct = pc.unique(values).to_pylist()
        gone = [v for v in distinct if v is not None and is_missing(v, root)]
        if not gone:
            return np.zeros(0, dtype=np.int64)
        mask = pc.is_in(values, value_set=pa.array(gone, type=values.type))
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False))

    def _filter_long_prompts(self, indices: np.ndarray) -> np.ndarray:
        o = self.options
        if o.max_prompt_tokens is None:
            return indices
        if not o.tokenizer:
            raise DatasetConfigError("max_prompt_tokens needs tokenizer: the run's tokenizer folder or tokenizer.json")
        count = load_token_counter(o.tokenizer)
        keep = np.ones(len(indices), dtype=bool)
        chunk = 4096
        for lo in range(0, len(indices), chunk):
            part = indices[lo:lo + chunk]
            prompts = self.dataset.data.column(o.prompt).take(part).to_pylist()
            systems = self.dataset.data.column(o.system).take(part).to_pylist() if o.system else [None] * len(part)
            texts = [prompt_text(p, s) for p, s in zip(prompts, systems)]
            for j, n in enumerate(count(texts)):
                if n > o.max_prompt_tokens:
                    keep[lo + j] = False
                    self.report.drop(f"over {o.max_prompt_tokens} prompt tokens", self.where(int(part[j])))
        return indices[keep]

    # -- rows -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.indices)

    def row_for_seed(self, seed: int) -> int:
        return int(self.indices[self.order(seed)])

    def record_bad(self, row: int, error: RowError) -> None:
        """Count a row that failed during a run; past ``max_bad_rows`` the run must stop."""
        with self._lock:
            if row not in self._bad:
                self._bad.add(row)
                self.report.bad_rows = len(self._bad)
                log.warning("dataset row skipped (%d so far): %s", len(self._bad), error)
            if len(self._bad) > self.options.max_bad_rows:
                raise DatasetConfigError(
                    f"{len(self._bad)} rows failed, over max_bad_rows={self.options.max_bad_rows}; last: {error}"
                )

    def is_bad(self, row: int) -> bool:
        return row in self._bad

    def build(self, row: int) -> RowTask:
        """Row ``row`` (an index into the loaded dataset) as an episode's task."""
        o = self.options
        where = self.where(row)
        try:
            record = self.dataset[row]
        except Exception as exc:  # noqa: BLE001
            raise RowError(where, None, f"cannot read the row: {exc}") from None
        root = self.file_of(row).root
        media: dict[str, list[ContentPart]] = {k: [] for k in MEDIA_KINDS}
        for kind, col in o.media_columns():
            for item in items_of(record[col]):
                try:
                    media[kind].append(to_part(kind, item, root, video_fps=o.video_fps,
                                               video_max_frames=o.video_max_frames,
                                               audio_sample_rate=o.audio_sample_rate))
                except (MediaError, ValueError, TypeError, OSError) as exc:
                    raise RowError(where, col, f"unreadable {kind}: {exc}") from None
        system = record[o.system] if o.system else None
        if system is not None and not isinstance(system, str):
            raise RowError(where, o.system, f"a system prompt must be text, got {type(system).__name__}")
        messages = build_messages(record[o.prompt], system, media, where, o.prompt)
        answer = record[o.answer] if o.answer else None
        oracle = record[o.oracle_column] if o.oracle_column else None
        if oracle is not None and not isinstance(oracle, str):
            raise RowError(where, o.oracle_column, f"the oracle answer must be text, got {type(oracle).__name__}")
        tools = _names_cell(record[o.tools_column], where, o.tools_column) if o.tools_column else []
        reward_kwargs = (_dict_cell(record[o.reward_kwargs_column], where, o.reward_kwargs_column)
                         if o.reward_kwargs_column else {})
        extra = {c: record[c] for c in o.extra_columns}
        return RowTask(row, where, messages, answer, oracle, tools, reward_kwargs, extra)


# ------------------------------------------------------------------------------------------------
# cells
# ------------------------------------------------------------------------------------------------
def _names_cell(cell: Any, where: str, col: str) -> list[str]:
    if cell is None:
        return []
    if isinstance(cell, str):
        cell = json.loads(cell) if cell.strip().startswith("[") else [x.strip() for x in cell.split(",") if x.strip()]
    if not isinstance(cell, list) or not all(isinstance(x, str) for x in cell):
        raise RowError(where, col, f"tools must be a list of tool names, got {cell!r:.80}")
    return list(cell)


def _dict_cell(cell: Any, where: str, col: str) -> dict[str, Any]:
    if cell is None:
        return {}
    if isinstance(cell, str):
        try:
            cell = json.loads(cell) if cell.strip() else {}
        except json.JSONDecodeError as exc:
            raise RowError(where, col, f"reward kwargs must be a JSON object ({exc.msg})") from None
    if not isinstance(cell, Mapping):
        raise RowError(where, col, f"reward kwargs must be a dict, got {type(cell).__name__}")
    return {str(k): v for k, v in cell.items() if v is not None}


def _as_messages(cell: Any) -> list[Any] | None:
    if isinstance(cell, str):
        s = cell.strip()
        if s.startswith("[") and s.endswith("]") and '"role"' in s:
            try:
                parsed = json.loads(s)
            except json.JSONDecodeError:
                return None
            return parsed if isinstance(parsed, list) else None
        return None
    if isinstance(cell, list):
        return cell
    return None


def prompt_text(cell: Any, system: Any) -> str:
    """The prompt's text (for the token-length filter): system + every message's text."""
    texts = [system] if isinstance(system, str) else []
    msgs = _as_messages(cell)
    if msgs is None:
        texts.append(str(cell) if cell is not None else "")
    else:
        for m in msgs:
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts.extend(p.get("text") or "" for p in content if isinstance(p, Mapping))
    return "\n".join(texts)


def build_messages(cell: Any, system: str | None, media: dict[str, list[ContentPart]], where: str,
                   column: str) -> list[Message]:
    """The opening messages: an optional system message, then the prompt with its media.

    A string prompt becomes one user message (text, then the row's media). A list of
    ``{"role", "content"}`` messages is kept as is; content may be a string or a list of parts
    ``{"type": "text", "text": ...}`` and ``{"type": "image"|"audio"|"video"}`` placeholders,
    which take the row's media items in order. Media left over go to the last user message.
    """
    queues = {k: list(v) for k, v in media.items()}
    out: list[Message] = [Message.system(system)] if system else []
    msgs = _as_messages(cell)
    if msgs is None:
        if not isinstance(cell, str) or not cell.strip():
            raise RowError(where, column, f"the prompt must be non-empty text or a list of messages, got {cell!r:.80}")
        out.append(Message.user(cell, *[p for k in MEDIA_KINDS for p in queues[k]]))
        return out
    if not msgs:
        raise RowError(where, column, "the prompt is an empty list of messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant"):
            raise RowError(where, column, f"message {i} must be {{role: system|user|assistant, content}}, got {m!r:.80}")
        content = m.get("content")
        parts: list[Any] = []
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for p in content:
                kind = p.get("type") if isinstance(p, Mapping) else None
                if kind == "text" and isinstance(p.get("text"), str):
                    parts.append(p["text"])
                elif kind in MEDIA_KINDS:
                    if not queues[kind]:
                        raise RowError(where, column, f"message {i} has more {kind} placeholders than the row has {kind}s")
                    parts.append(queues[kind].pop(0))
                else:
                    raise RowError(where, column, f"message {i}: unknown content part {p!r:.80}")
        elif content is not None:
            raise RowError(where, column, f"message {i}: content must be text or a list of parts")
        out.append(Message(m["role"], parts))
    left = [p for k in MEDIA_KINDS for p in queues[k]]
    if left:
        users = [j for j, m in enumerate(out) if m.role == "user"]
        if not users:
            raise RowError(where, column, "the row has media but the prompt has no user message to carry them")
        out[users[-1]].content.extend(left)
    if not any(m.role == "user" for m in out):
        raise RowError(where, column, "the prompt has no user message")
    return out


# ------------------------------------------------------------------------------------------------
# tokenizers (for the prompt-length filter)
# ------------------------------------------------------------------------------------------------
def load_token_counter(spec: str) -> Any:
    """A function ``list[str] -> list[int]`` (token counts) from a tokenizer folder or file."""
    p = Path(spec).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise DatasetConfigError(f"tokenizer {spec!r}: no tokenizer.json there (give the run's tokenizer folder)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DatasetConfigError("max_prompt_tokens needs the `tokenizers` package (relax-gym[train])") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001
        raise DatasetConfigError(f"tokenizer {spec!r}: cannot load {file}: {exc}") from None

    def count(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

    return count


# ------------------------------------------------------------------------------------------------
# the process-wide cache
# ------------------------------------------------------------------------------------------------
_SOURCES: dict[str, DatasetSource] = {}
_SOURCES_LOCK = threading.Lock()


def _fingerprint(path: Any) -> Any:
    if isinstance(path, (str, os.PathLike)) or (isinstance(path, Sequence) and not isinstance(path, (bytes, str))
                                                 and all(isinstance(p, (str, os.PathLike)) for p in path)):
        try:
            files = find_files(path, None)
        except DatasetConfigError:
            return repr(path)
        return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return ("object", id(path), getattr(path, "_fingerprint", None))


def source_for(options: SourceOptions) -> DatasetSource:
    """The shared :class:`DatasetSource` for these options (opened on first use)."""
    fields = {k: v for k, v in options.__dict__.items() if k != "path"}
    key = hashlib.sha256(json.dumps([_fingerprint(options.path), fields], sort_keys=True, default=repr)
                         .encode()).hexdigest()
    with _SOURCES_LOCK:
        src = _SOURCES.get(key)
        if src is not None:
            return src
        src = DatasetSource(options)
        if len(_SOURCES) >= _MAX_SOURCES:
            _SOURCES.pop(next(iter(_SOURCES)))
        _SOURCES[key] = src
        return src
