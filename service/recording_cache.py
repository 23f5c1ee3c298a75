"""A per-request view of the document cache that records which documents were cache hits."""

from __future__ import annotations


class RecordingCache:
    """Wraps a tenant's ``StoreCache`` for one request; every other attribute is the wrapped cache's.

    ``hits[key]`` is True when the first lookup of ``key`` found it (memory tier or LMDB) and False when
    it was missing and encoded now (a ``put``); ``unstored[key]`` says why a document encoded now could
    not be stored (too large for the store).
    """

    def __init__(self, inner):
        self.inner = inner
        self.hits: dict[str, bool] = {}
        self.unstored: dict[str, str] = {}
        if hasattr(inner, "resolve"):  # the engine streams LMDB documents layer by layer through it
            self.resolve = self._resolve

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def key(self, fingerprint: str, text: str) -> str:
        return self.inner.key(fingerprint, text)

    def get(self, key: str):
        kv = self.inner.get(key)
        self.hits.setdefault(key, kv is not None)
        return kv

    def _resolve(self, keys: list[str]):
        items = self.inner.resolve(keys)
        for k, it in zip(keys, items, strict=True):
            self.hits.setdefault(k, it is not None)
        return items

    def put(self, key: str, kv) -> None:
        self.hits[key] = False
        reason = self.inner.put(key, kv)
        if isinstance(reason, str):
            self.unstored[key] = reason
