"""The document-cache contract the engine reads and writes through, and the plain in-process cache.

Implementations: :class:`MemoryCache` (here), ``store.doc_cache.StoreCache`` (memory tiers over a blob
store) and ``store.recording_cache.RecordingCache`` (a per-request wrapper that records hits). Each
subclasses :class:`DocumentCache` explicitly and defines every method; the engine calls nothing else.
"""

from __future__ import annotations

import hashlib
from typing import Protocol, runtime_checkable

from .types import DocumentKV, LayeredDocuments, RetainedKV


@runtime_checkable
class DocumentCache(Protocol):
    """Where encoded documents are kept between queries.

    Keys are opaque strings made by :meth:`key`; a stored :class:`DocumentKV` is position-free
    (``[layers, kv_heads, tokens, head_dim]``, keys before RoPE).
    """

    def key(self, fingerprint: str, text: str) -> str:
        """The cache key of a document's exact prompt ``text`` under an encoding ``fingerprint``."""
        ...

    def get(self, key: str) -> DocumentKV | None:
        """The stored document, or None when it is not cached."""
        ...

    def put(self, key: str, kv: DocumentKV) -> str | None:
        """Store ``kv`` under ``key``. Returns None when stored, else why it could not be kept durably
        (the caller still holds ``kv`` and answers from it)."""
        ...

    def resolve(self, keys: list[str], retention: float = 1.0, method: str = "importance"
                ) -> list[DocumentKV | RetainedKV | str | None]:
        """Per key, in order: the document if it is in memory (from a memory tier that holds it at a lower
        retention, only if it holds every token ``retention``/``method`` keeps: then a :class:`RetainedKV`), the
        key itself if it is stored but must be read (to be passed to :meth:`stream`), or None if it is not
        cached."""
        ...

    def stream(self, items: list[DocumentKV | RetainedKV | str], retention: float = 1.0,
               method: str = "importance") -> LayeredDocuments:
        """The documents (in memory, or keys from :meth:`resolve`) as one layer-by-layer stream.

        Args:
            retention: fraction of each document's tokens streamed (``kvlink_rag.retention``), 0 < r <= 1;
                below 1 a stored document is read as a prefix of its importance-ordered records.
            method: ``importance`` (stored order), ``random`` or ``recency`` (evaluation baselines).
        Raises:
            LookupError: a keyed document is no longer stored (the caller encodes instead).
        """
        ...


class MemoryCache(dict, DocumentCache):
    """A plain in-process :class:`DocumentCache`: a dict of key -> :class:`DocumentKV`."""

    def key(self, fingerprint: str, text: str) -> str:
        """sha256 of the encoding fingerprint and the document's exact prompt text."""
        return hashlib.sha256(f"{fingerprint}|{text}".encode()).hexdigest()

    def get(self, key: str) -> DocumentKV | None:
        """The document stored under ``key``, or None."""
        return dict.get(self, key)

    def put(self, key: str, kv: DocumentKV) -> None:
        """Keep ``kv`` (always stored: returns None)."""
        self[key] = kv

    def resolve(self, keys: list[str], retention: float = 1.0, method: str = "importance"
                ) -> list[DocumentKV | None]:
        """Per key: the document or None (everything here is in memory; never a key to stream)."""
        return [dict.get(self, k) for k in keys]

    def stream(self, items: list[DocumentKV | str], retention: float = 1.0,
               method: str = "importance") -> LayeredDocuments:
        """``LayeredDocuments.from_documents`` of the items (keys looked up here) at ``retention``.

        Raises:
            KeyError: a key is not stored. ValueError: the documents' fingerprints differ.
        """
        docs = [self[it] if isinstance(it, str) else it for it in items]
        return LayeredDocuments.from_documents(docs, retention, method)
