"""A per-request view of the document cache that records which documents were cache hits."""

from __future__ import annotations

from collections.abc import Callable

from kvlink_rag.cache import DocumentCache
from kvlink_rag.types import DocumentKV, LayeredDocuments, RetainedKV


class RecordingCache(DocumentCache):
    """A :class:`~kvlink_rag.cache.DocumentCache` over a tenant's cache (``StoreCache``) for one request.

    Every method of the contract is forwarded to ``inner``; lookups are recorded on the way.
    ``hits[key]`` is True when the first lookup of ``key`` found it (memory tier or LMDB) and False when
    it was missing and encoded now (a ``put``); ``unstored[key]`` says why a document encoded now could
    not be stored (too large for the store); ``from_shared``: keys only the shared tier held when resolved
    (``shared_only(key)``, e.g. :meth:`store.doc_cache.StoreCache.shared_only`).
    """

    def __init__(self, inner: DocumentCache, shared_only: Callable[[str], bool] | None = None):
        self.inner, self.shared_only = inner, shared_only
        self.from_shared: set[str] = set()
        self.hits: dict[str, bool] = {}
        self.unstored: dict[str, str] = {}
        self._keys: dict[tuple[str, str], str] = {}

    def key(self, fingerprint: str, text: str) -> str:
        """The inner cache's key (computed once per text for this request: it hashes the whole text)."""
        k = self._keys.get((fingerprint, text))
        if k is None:
            k = self._keys[(fingerprint, text)] = self.inner.key(fingerprint, text)
        return k

    def get(self, key: str) -> DocumentKV | None:
        """The inner cache's document; the first lookup of ``key`` is recorded as a hit or a miss."""
        kv = self.inner.get(key)
        self.hits.setdefault(key, kv is not None)
        return kv

    def resolve(self, keys: list[str], retention: float = 1.0, method: str = "importance"
                ) -> list[DocumentKV | RetainedKV | str | None]:
        """The inner cache's resolution at ``retention``; each key's first lookup is recorded (found in
        memory or stored = hit)."""
        items = self.inner.resolve(keys, retention, method)
        for k, it in zip(keys, items, strict=True):
            self.hits.setdefault(k, it is not None)
            if isinstance(it, str) and self.shared_only is not None and self.shared_only(k):
                self.from_shared.add(k)
        return items

    def stream(self, items: list[DocumentKV | str], retention: float = 1.0,
               method: str = "importance") -> LayeredDocuments:
        """The inner cache's layer stream at ``retention`` (hits were recorded by :meth:`resolve`).

        Raises:
            LookupError: a keyed document is no longer stored.
        """
        return self.inner.stream(items, retention, method)

    def put(self, key: str, kv: DocumentKV) -> str | None:
        """Store through the inner cache; ``key`` is recorded as a miss, and why it was not stored if so."""
        self.hits[key] = False
        reason = self.inner.put(key, kv)
        if reason is not None:
            self.unstored[key] = reason
        return reason
