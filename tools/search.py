"""``search``: BM25 ranking over a document collection that the environment provides.

An env makes its documents searchable in one of two ways:

* an attribute or method ``documents`` returning a sequence of :class:`Document`, ``str`` or
  ``{"id", "title", "text"}`` dicts -- the tool builds a :class:`BM25Index` once per episode;
* an attribute ``search_index`` holding any object with ``search(query, k)`` returning
  ``[(Document, score), ...]`` (e.g. a prebuilt :class:`BM25Index` shared by all episodes).

BM25 here is Okapi BM25 with the non-negative IDF ``log(1 + (N - df + 0.5) / (df + 0.5))``,
``k1 = 1.5`` and ``b = 0.75``; ties keep the collection's order, so results are deterministic.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from pydantic import Field

from .declaration import ToolContext, ToolError, tool

_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore)."""
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    title: str = ""


def as_document(obj: Any, index: int) -> Document:
    if isinstance(obj, Document):
        return obj
    if isinstance(obj, str):
        return Document(id=str(index), text=obj)
    if isinstance(obj, Mapping):
        return Document(id=str(obj.get("id", index)), text=str(obj.get("text", "")), title=str(obj.get("title", "")))
    raise TypeError(f"a document must be a Document, str or dict, got {type(obj).__name__}")


class BM25Index:
    """An in-memory Okapi BM25 index (titles are indexed with the text)."""

    def __init__(self, documents: Sequence[Document | str | Mapping[str, Any]], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.documents = [as_document(d, i) for i, d in enumerate(documents)]
        self.k1, self.b = k1, b
        self._tf: list[Counter[str]] = []
        self._len: list[int] = []
        df: Counter[str] = Counter()
        for doc in self.documents:
            tokens = tokenize(f"{doc.title} {doc.text}")
            counts = Counter(tokens)
            self._tf.append(counts)
            self._len.append(len(tokens))
            df.update(counts.keys())
        n = len(self.documents)
        self._avg_len = (sum(self._len) / n) if n else 0.0
        self._idf = {term: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for term, f in df.items()}

    def __len__(self) -> int:
        return len(self.documents)

    def scores(self, query: str) -> list[float]:
        terms = tokenize(query)
        out = []
        for tf, length in zip(self._tf, self._len):
            norm = self.k1 * (1.0 - self.b + self.b * length / self._avg_len) if self._avg_len else self.k1
            score = 0.0
            for term in terms:
                f = tf.get(term, 0)
                if f:
                    score += self._idf[term] * f * (self.k1 + 1.0) / (f + norm)
            out.append(score)
        return out

    def search(self, query: str, k: int = 5) -> list[tuple[Document, float]]:
        """The ``k`` best documents with a positive score, best first."""
        scored = [(s, i) for i, s in enumerate(self.scores(query)) if s > 0.0]
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [(self.documents[i], s) for s, i in scored[:k]]


class SearchIndex(Protocol):
    def search(self, query: str, k: int = 5) -> list[tuple[Document, float]]: ...


_CACHE_KEY = "search:index"


def index_for(ctx: ToolContext) -> SearchIndex:
    """The env's search index (built from its ``documents`` once per episode)."""
    env = ctx.env
    prebuilt = getattr(env, "search_index", None)
    if prebuilt is not None and hasattr(prebuilt, "search"):
        return prebuilt
    cached = ctx.scratch.get(_CACHE_KEY)
    if cached is not None:
        return cached
    docs = getattr(env, "documents", None)
    if callable(docs):
        docs = docs()
    if docs is None:
        raise ToolError("this environment has no documents to search")
    index = BM25Index(list(docs))
    ctx.scratch[_CACHE_KEY] = index
    return index


@tool
def search(query: str, ctx: ToolContext, k: Annotated[int, Field(ge=1, le=20)] = 5) -> str:
    """Search the documents of this task and return the best matches (BM25 ranking).

    Args:
        query: Keywords to look for.
        k: How many results to return (1-20).
    """
    if not query.strip():
        raise ToolError("the query is empty")
    hits = index_for(ctx).search(query, k)
    if not hits:
        return f"no document matches {query!r}"
    return json.dumps(
        [{"id": d.id, "title": d.title, "score": round(s, 4), "text": _snippet(d.text)} for d, s in hits],
        ensure_ascii=False,
    )


def _snippet(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
