"""Retrieval indexes over a :class:`~.corpus.Corpus`: BM25 and dense, one interface.

- ``bm25`` (default): ``bm25s`` over lowercased word tokens of ``title + text``
  with English stop words removed (Lucene scoring, ``k1``/``b`` settable);
- ``dense``: all-MiniLM-L6-v2 embeddings (:mod:`.embed`) of ``title + text`` in
  an exact inner-product ``faiss`` index (cosine similarity of unit vectors).

Both return the top ``k`` documents as :class:`Hit` (corpus position, score),
ties broken by corpus order, so results are deterministic. :func:`open_index`
returns the index of a corpus for some :class:`IndexSettings`: from an
in-process cache (indexes are read-only and shared by all environments of the
process), else from the disk cache, else built and saved there. The disk cache
lives under ``cache_dir`` (default ``~/.cache/horizonrl/search/<corpus hash>``,
``$XDG_CACHE_HOME`` honoured) in a folder named ``<retriever>-<key>``, where the
key hashes the corpus and the settings that affect the index; a folder whose
manifest does not match, or that fails to load, is rebuilt. Writes are atomic
(built in a temporary folder, then renamed), so concurrent processes are safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from horizonrl.envs.builtin.search.corpus import Corpus
from horizonrl.envs.builtin.search.embed import MAX_LENGTH, MODEL_NAME

RETRIEVERS = ("bm25", "dense")
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

_lock = threading.Lock()
_memory: dict[tuple[str, str], Index] = {}


@dataclass(frozen=True)
class IndexSettings:
    """How an index is built. Only the fields of the chosen retriever enter the cache key."""

    retriever: str = "bm25"
    k1: float = 1.5
    b: float = 0.75
    model: str = MODEL_NAME
    max_length: int = MAX_LENGTH

    def __post_init__(self) -> None:
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"search: retriever must be one of {RETRIEVERS}, got {self.retriever!r}")
        if not (isinstance(self.k1, int | float) and self.k1 >= 0):
            raise ValueError(f"search: bm25 k1 must be a number >= 0, got {self.k1!r}")
        if not (isinstance(self.b, int | float) and 0 <= self.b <= 1):
            raise ValueError(f"search: bm25 b must be a number in [0, 1], got {self.b!r}")
        if self.model != MODEL_NAME:
            raise ValueError(f"search: the only dense model is {MODEL_NAME!r}, got {self.model!r}")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 8:
            raise ValueError(f"search: dense max_length must be an integer >= 8, got {self.max_length!r}")

    def relevant(self) -> dict[str, Any]:
        """The settings that change the index of this retriever."""
        keep = ("k1", "b") if self.retriever == "bm25" else ("model", "max_length")
        return {"retriever": self.retriever, **{k: v for k, v in asdict(self).items() if k in keep}}

    def key(self, corpus_hash: str) -> str:
        """16 hex digits identifying the index of a corpus under these settings."""
        blob = json.dumps({"v": FORMAT_VERSION, "corpus": corpus_hash, **self.relevant()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Hit:
    """One search result: the document's position in the corpus and its score."""

    position: int
    score: float


def doc_text(corpus: Corpus, position: int) -> str:
    """The text that is indexed for a document: its title, a newline, its text."""
    doc = corpus.documents[position]
    return f"{doc.title}\n{doc.text}"


def top_k(scores: np.ndarray, k: int, *, positive: bool) -> list[Hit]:
    """The ``k`` best positions by score (ties by position); only scores > 0 when ``positive``."""
    idx = np.flatnonzero(scores > 0) if positive else np.arange(len(scores))
    order = idx[np.lexsort((idx, -scores[idx]))][:k]
    return [Hit(int(i), float(scores[i])) for i in order]


class Index(ABC):
    """A read-only retrieval index of one corpus."""

    kind: ClassVar[str]

    def __init__(self, corpus: Corpus, settings: IndexSettings) -> None:
        self.corpus = corpus
        self.settings = settings

    @abstractmethod
    def search(self, query: str, k: int) -> list[Hit]:
        """The top ``k`` documents for ``query`` (fewer when fewer match), best first."""

    @classmethod
    @abstractmethod
    def build(cls, corpus: Corpus, settings: IndexSettings) -> Index:
        """Index ``corpus`` from scratch."""

    @abstractmethod
    def save(self, folder: Path) -> None:
        """Write the index files into the existing ``folder``."""

    @classmethod
    @abstractmethod
    def load(cls, folder: Path, corpus: Corpus, settings: IndexSettings) -> Index:
        """Read an index written by :meth:`save`."""


def _tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    return [
        [t for t in toks if t]
        for toks in bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)
    ]


class BM25Index(Index):
    """Lucene BM25 via ``bm25s`` (see module docstring)."""

    kind = "bm25"

    def __init__(self, corpus: Corpus, settings: IndexSettings, retriever: Any) -> None:
        super().__init__(corpus, settings)
        self.retriever = retriever

    def search(self, query: str, k: int) -> list[Hit]:
        ids = self.retriever.get_tokens_ids(_tokenize([query])[0])
        if not ids or k < 1:
            return []
        scores = np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float64)
        return top_k(scores, k, positive=True)

    @classmethod
    def build(cls, corpus: Corpus, settings: IndexSettings) -> BM25Index:
        import bm25s

        tokens = _tokenize([doc_text(corpus, i) for i in range(len(corpus))])
        retriever = bm25s.BM25(k1=settings.k1, b=settings.b, method="lucene")
        retriever.index(tokens, show_progress=False)
        return cls(corpus, settings, retriever)

    def save(self, folder: Path) -> None:
        self.retriever.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: Path, corpus: Corpus, settings: IndexSettings) -> BM25Index:
        import bm25s

        retriever = bm25s.BM25.load(str(folder), show_progress=False)
        if retriever.scores["num_docs"] != len(corpus):
            raise ValueError(f"{folder}: index has {retriever.scores['num_docs']} documents")
        return cls(corpus, settings, retriever)


class DenseIndex(Index):
    """Exact cosine search over MiniLM embeddings in a ``faiss.IndexFlatIP`` (see module docstring)."""

    kind = "dense"
    FILE = "faiss.index"

    def __init__(self, corpus: Corpus, settings: IndexSettings, index: Any) -> None:
        super().__init__(corpus, settings)
        self.index = index

    def search(self, query: str, k: int) -> list[Hit]:
        from horizonrl.envs.builtin.search.embed import embed

        k = min(k, self.index.ntotal)
        if not query.strip() or k < 1:
            return []
        vec = embed([query], max_length=self.settings.max_length)
        scores, ids = self.index.search(vec, k)
        hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
        hits.sort(key=lambda h: (-h[1], h[0]))
        return [Hit(i, s) for i, s in hits]

    @classmethod
    def build(cls, corpus: Corpus, settings: IndexSettings) -> DenseIndex:
        import faiss

        from horizonrl.envs.builtin.search.embed import DIM, embed

        vecs = embed([doc_text(corpus, i) for i in range(len(corpus))], max_length=settings.max_length)
        index = faiss.IndexFlatIP(DIM)
        index.add(vecs)
        return cls(corpus, settings, index)

    def save(self, folder: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(folder / self.FILE))

    @classmethod
    def load(cls, folder: Path, corpus: Corpus, settings: IndexSettings) -> DenseIndex:
        import faiss

        index = faiss.read_index(str(folder / cls.FILE))
        if index.ntotal != len(corpus):
            raise ValueError(f"{folder}: index has {index.ntotal} documents")
        return cls(corpus, settings, index)


INDEXES: dict[str, type[Index]] = {"bm25": BM25Index, "dense": DenseIndex}


def default_cache_dir(corpus_hash: str) -> Path:
    """``~/.cache/horizonrl/search/<first 16 hex digits of the corpus hash>``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "horizonrl" / "search" / corpus_hash[:16]


def index_dir(corpus: Corpus, settings: IndexSettings, cache_dir: str | Path | None = None) -> Path:
    """The folder that caches the index of ``corpus`` under ``settings``."""
    root = default_cache_dir(corpus.hash) if cache_dir is None else Path(cache_dir).expanduser()
    return root / f"{settings.retriever}-{settings.key(corpus.hash)}"


def open_index(corpus: Corpus, settings: IndexSettings, cache_dir: str | Path | None = None) -> Index:
    """The (shared, read-only) index of ``corpus``: from memory, the disk cache, or built and cached."""
    folder = index_dir(corpus, settings, cache_dir)
    mem_key = (str(folder), settings.key(corpus.hash))
    with _lock:
        if mem_key in _memory:
            return _memory[mem_key]
        index = _load_cached(folder, corpus, settings)
        if index is None:
            index = INDEXES[settings.retriever].build(corpus, settings)
            _save_atomic(index, folder)
        _memory[mem_key] = index
        return index


def clear_memory_cache() -> None:
    """Forget the indexes held in memory (the disk cache stays)."""
    with _lock:
        _memory.clear()


def _manifest(corpus: Corpus, settings: IndexSettings) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "key": settings.key(corpus.hash),
        "corpus_hash": corpus.hash,
        "n_docs": len(corpus),
        "settings": settings.relevant(),
    }


def _load_cached(folder: Path, corpus: Corpus, settings: IndexSettings) -> Index | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest != _manifest(corpus, settings):
        return None
    try:
        return INDEXES[settings.retriever].load(folder, corpus, settings)
    except Exception:  # a damaged cache folder is rebuilt, never trusted
        return None


def _save_atomic(index: Index, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any other
        index.save(tmp)
        (tmp / MANIFEST).write_text(json.dumps(_manifest(index.corpus, index.settings), sort_keys=True))
        if folder.exists():  # stale or damaged (a valid one would have been loaded)
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # another process won the race; its copy is equivalent
            os.rename(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
