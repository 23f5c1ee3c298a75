"""BM25 retrieval (bm25s) over one tenant's documents, or their chunks.

A document the engine stores as chunks (:mod:`kvlink_rag.text.chunking`, longer than ``chunk_tokens``) is indexed
chunk by chunk once :meth:`Retrieval.use_chunks` gave the engine's chunker: a question retrieves the
chunks it is about and only those are linked, not a whole employee handbook. BM25's length normalisation
(``b``, Robertson et al.) is applied per indexed entry, so a chunk competes with passages of its own size.

One index per tenant, built from the document index and the texts (title and text), rebuilt lazily on
the next search after a change this process made (ingest, update, delete: :meth:`Retrieval.invalidate`)
or after ``refresh_s`` seconds (changes by other processes). A rebuild that fails (the Redis index is
down) keeps serving the last index.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from kvlink_rag.types import Document

if TYPE_CHECKING:
    import bm25s

log = logging.getLogger(__name__)


class Hit(NamedTuple):
    """A retrieved document (``chunk`` None) or one chunk of it (``chunk`` = its index in the engine's
    chunks); ``score``: BM25 score (unitless, > 0)."""

    doc_id: str
    score: float
    chunk: int | None = None


@dataclass(frozen=True)
class BM25Params:
    """BM25's term-frequency saturation ``k1`` and length normalisation ``b`` (0: none, 1: full; bm25s's
    defaults 1.5 and 0.75)."""

    k1: float = 1.5
    b: float = 0.75


@dataclass
class _TenantIndex:
    doc_ids: list[tuple[str, int | None]]  # (document id, chunk index or None) per indexed entry
    retriever: bm25s.BM25 | None  # None: no document has an indexable word
    built: float


def _bm25s():
    """bm25s, imported when an index is first built: it imports JAX where JAX is installed, and JAX takes 75%
    of a GPU's memory in each process at first use (16 processes ran out of memory on an H200); its top-k
    selection runs on the CPU either way, so JAX is kept there unless the environment says otherwise."""
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import bm25s

    return bm25s


# Words of conversation rather than content, dropped beside bm25s's English stopwords (which keep "who" and
# "you"): with them "Hello, who are you?" matched a storage FAQ ("you") and was answered from it.
CONVERSATIONAL = ("hello", "hi", "hey", "thanks", "thank", "please", "who", "whom", "what", "which", "where", "when",
                  "why", "how", "you", "your", "yours", "i", "me", "my", "mine", "we", "us", "our", "he", "she",
                  "him", "her", "his", "its", "them", "do", "does", "did", "can", "could", "would", "should", "am",
                  "have", "has", "had", "were", "been", "tell")


def _stopwords() -> list[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return sorted(set(STOPWORDS_EN) | set(CONVERSATIONAL))


def _tokens(texts: list[str]) -> list[list[str]]:
    return _bm25s().tokenize(texts, stopwords=_stopwords(), return_ids=False, show_progress=False)


def above_cutoff(hits: list[tuple], relative: float, floor: float) -> list[tuple]:
    """``hits`` (``(doc_id, score, ...)`` tuples such as :class:`Hit`, best first) whose score is at least
    ``relative`` times the best score and at least ``floor``: documents a question barely touches (a long
    handbook sharing a few words with it) are not linked beside the one it is about."""
    if not hits:
        return []
    bar = max(floor, relative * max(h[1] for h in hits))
    return [h for h in hits if h[1] >= bar]


def _index(corpus: list[str], params: BM25Params):
    """A bm25s index of ``corpus`` (None when no text has an indexable word)."""
    tokens = _tokens(corpus) if corpus else []
    if not any(tokens):
        return None
    retriever = _bm25s().BM25(k1=params.k1, b=params.b)
    retriever.index(tokens, show_progress=False)
    return retriever


def _top(retriever, n: int, question: str, top_k: int) -> list[tuple[int, float]]:
    """``[(entry index, score)]`` of the ``top_k`` best of ``n`` entries with a positive score, best first."""
    query = _tokens([question])
    if retriever is None or not n or not query[0]:
        return []
    docs, scores = retriever.retrieve(query, k=min(top_k, n), show_progress=False, n_threads=1)
    return [(int(i), float(s)) for i, s in zip(docs[0], scores[0], strict=True) if s > 0]


def rank(texts: list[str], question: str, top_k: int | None = None,
         params: BM25Params = BM25Params()) -> list[tuple[int, float]]:
    """``[(index into texts, BM25 score)]`` of ``question`` over ``texts`` alone, best first, positive
    scores only (the ``top_k`` best; all by default): the service's tokenisation and scoring, for
    evaluations over a question's candidate passages (``kvlink-rag eval --retrieve``)."""
    return _top(_index(texts, params), len(texts), question, top_k or len(texts))


class Retrieval:
    """Per-tenant BM25 indexes.

    Args:
        index: ``store.index.document_index.DocumentIndex`` (which documents a tenant has).
        texts: ``store.texts.TextStore`` (their text and title).
        refresh_s: rebuild an index older than this (seconds; 0 = on every search).
        clock: monotonic seconds (injectable for tests).
        params: BM25's ``k1`` and ``b``.
        chunks: a document's chunks (``Engine.chunks``); None indexes whole documents (see :meth:`use_chunks`).
    """

    def __init__(self, index, texts, refresh_s: float = 30.0, clock=time.monotonic,
                 params: BM25Params = BM25Params(), chunks: Callable[[Document], list[Document]] | None = None):
        self.index, self.texts, self.refresh_s, self.clock = index, texts, refresh_s, clock
        self.params, self.chunks = params, chunks
        self._indexes: dict[str, _TenantIndex] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._build_locks: dict[str, threading.Lock] = {}

    def invalidate(self, tenant: str) -> None:
        """Mark ``tenant``'s index out of date (a document was added, changed or removed)."""
        with self._lock:
            self._dirty.add(tenant)

    def use_chunks(self, chunks: Callable[[Document], list[Document]]) -> None:
        """Index documents the engine stores as chunks chunk by chunk from now on (``chunks``: the engine's
        ``Engine.chunks``, so a retrieved chunk is exactly a cached one); every index is rebuilt."""
        with self._lock:
            self.chunks = chunks
            self._dirty.update(self._indexes)

    def search(self, tenant: str, question: str, top_k: int) -> list[Hit]:
        """The ``top_k`` best-scoring documents or chunks with a positive BM25 score, best first.

        Raises:
            redis.exceptions.ConnectionError: the index had to be built and Redis is down.
        """
        idx = self._current(tenant)
        return [Hit(idx.doc_ids[i][0], s, idx.doc_ids[i][1])
                for i, s in _top(idx.retriever, len(idx.doc_ids), question, top_k)]

    def chunk_of(self, doc: Document, chunk: int) -> Document | None:
        """Chunk ``chunk`` of ``doc`` as the engine caches it; None when ``doc`` no longer has it (changed)."""
        pieces = self.chunks(doc) if self.chunks is not None else [doc]
        return pieces[chunk] if len(pieces) > 1 and 0 <= chunk < len(pieces) else None

    def _current(self, tenant: str) -> _TenantIndex:
        with self._lock:
            idx = self._indexes.get(tenant)
            stale = idx is None or tenant in self._dirty or self.clock() - idx.built > self.refresh_s
            build_lock = self._build_locks.setdefault(tenant, threading.Lock())
        if not stale:
            return idx
        with build_lock:
            with self._lock:  # another thread may have rebuilt it meanwhile
                idx = self._indexes.get(tenant)
                if idx is not None and tenant not in self._dirty and self.clock() - idx.built <= self.refresh_s:
                    return idx
                self._dirty.discard(tenant)
            try:
                fresh = self._build(tenant)
            except Exception:
                if idx is None:
                    with self._lock:
                        self._dirty.add(tenant)
                    raise
                log.warning("BM25 index of %s not rebuilt (index unreachable); serving the last one", tenant)
                with self._lock:
                    self._dirty.add(tenant)
                return idx
            with self._lock:
                self._indexes[tenant] = fresh
            return fresh

    def _build(self, tenant: str) -> _TenantIndex:
        ids, corpus = [], []
        for rec in self.index.records(tenant):
            stored = self._text(tenant, rec)
            if stored is None:
                continue
            title = stored["title"] or ""
            pieces = self._pieces(Document(stored["text"], title or None))
            for i, text in enumerate(pieces):
                ids.append((rec.doc_id, i if len(pieces) > 1 else None))
                corpus.append(f"{title}\n{text}")
        return _TenantIndex(ids, _index(corpus, self.params), self.clock())

    def _pieces(self, doc: Document) -> list[str]:
        """The texts indexed for ``doc``: its chunks' (the engine's chunker), or its own."""
        if self.chunks is None or not doc.text.strip():
            return [doc.text]
        try:
            return [c.text for c in self.chunks(doc)]
        except ValueError:  # a text the chunker refuses is indexed whole
            return [doc.text]

    def _text(self, tenant: str, rec) -> dict | None:
        """The text of ``rec``; None when the record or the text is corrupt (skipped, counted by the store)."""
        from store.index.document_index import is_corrupt

        return None if is_corrupt(rec) else self.texts.get_intact(tenant, rec.doc_id)
