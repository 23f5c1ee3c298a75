"""BM25 retrieval (bm25s) over one tenant's documents.

One index per tenant, built from the document index and the texts (title and text), rebuilt lazily on
the next search after a change this process made (ingest, update, delete: :meth:`Retrieval.invalidate`)
or after ``refresh_s`` seconds (changes by other processes). A rebuild that fails (the Redis index is
down) keeps serving the last index.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import bm25s

log = logging.getLogger(__name__)


@dataclass
class _TenantIndex:
    doc_ids: list[str]
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


def above_cutoff(hits: list[tuple[str, float]], relative: float, floor: float) -> list[tuple[str, float]]:
    """``hits`` (``[(doc_id, score)]``, best first) whose score is at least ``relative`` times the best score
    and at least ``floor``: documents a question barely touches (a long handbook sharing a few words with
    it) are not linked beside the one it is about."""
    if not hits:
        return []
    bar = max(floor, relative * max(s for _, s in hits))
    return [(d, s) for d, s in hits if s >= bar]


class Retrieval:
    """Per-tenant BM25 indexes.

    Args:
        index: ``store.index.DocumentIndex`` (which documents a tenant has).
        texts: ``store.texts.TextStore`` (their text and title).
        refresh_s: rebuild an index older than this (seconds; 0 = on every search).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, index, texts, refresh_s: float = 30.0, clock=time.monotonic):
        self.index, self.texts, self.refresh_s, self.clock = index, texts, refresh_s, clock
        self._indexes: dict[str, _TenantIndex] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._build_locks: dict[str, threading.Lock] = {}

    def invalidate(self, tenant: str) -> None:
        """Mark ``tenant``'s index out of date (a document was added, changed or removed)."""
        with self._lock:
            self._dirty.add(tenant)

    def search(self, tenant: str, question: str, top_k: int) -> list[tuple[str, float]]:
        """``[(doc_id, score)]`` of the ``top_k`` best-scoring documents with a positive BM25 score.

        Raises:
            redis.exceptions.ConnectionError: the index had to be built and Redis is down.
        """
        idx = self._current(tenant)
        if idx.retriever is None or not idx.doc_ids:
            return []
        query = _tokens([question])
        if not query[0]:
            return []
        k = min(top_k, len(idx.doc_ids))
        docs, scores = idx.retriever.retrieve(query, k=k, show_progress=False, n_threads=1)
        return [(idx.doc_ids[int(i)], float(s)) for i, s in zip(docs[0], scores[0], strict=True) if s > 0]

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
            if stored is not None:
                ids.append(rec.doc_id)
                corpus.append(f"{stored['title']}\n{stored['text']}")
        tokens = _tokens(corpus) if corpus else []
        retriever = None
        if any(tokens):
            retriever = _bm25s().BM25()
            retriever.index(tokens, show_progress=False)
        return _TenantIndex(ids, retriever, self.clock())

    def _text(self, tenant: str, rec) -> dict | None:
        """The text of ``rec``; None when the record or the text is corrupt (skipped, counted by the store)."""
        from store.index import is_corrupt

        return None if is_corrupt(rec) else self.texts.get_intact(tenant, rec.doc_id)
