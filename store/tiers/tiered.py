"""Memory tiers stacked over the blob store (e.g. ``[device tier, host tier, cold tier]`` over LMDB).

:class:`TieredCache` looks a key up fastest tier first: a hit is promoted to the tiers above, a miss
everywhere is loaded from the :class:`~store.blobs.blob_store.BlobStore` once (concurrent misses of one key
share the load) and fills every tier; an entry evicted from a tier is demoted to the tier below.

Values are shared, never copied on ``get``: treat a returned ``DocumentKV`` as read-only.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager

import torch

from kvlink_rag.types import DocumentKV, RetainedKV
from store.tiers.tier import CacheTier
from store.tiers.tier_format import HeldKV


class TieredCache:
    """Tiers in lookup order (fastest first) over an optional blob store.

    Args:
        tiers: e.g. ``[CacheTier('device', ..., device='cuda'), CacheTier('host', ...)]``.
        blob_store: a :class:`store.blobs.blob_store.BlobStore` (only ``get(key, dtype)`` is used here), or None.
        dtype: dtype requested from the blob store (None: as stored).
        demote: put entries evicted from a tier into the next tier (whole documents only: an entry a lossy
            tier evicts is dropped, the store still has it).

    A hit in a lossy tier (:mod:`store.tiers.tier_format`) is not promoted: the tiers above hold documents whole
    and at full precision, so they get the document when it is next read from the store.
    """

    def __init__(
        self, tiers: list[CacheTier], blob_store=None, dtype: torch.dtype | None = None, demote: bool = True
    ) -> None:
        if not tiers:
            raise ValueError("TieredCache needs at least one tier")
        self.tiers = list(tiers)
        self.blob_store = blob_store
        self.dtype = dtype
        self.counters: Counter[str] = Counter()
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()
        if demote:
            for upper, lower in zip(self.tiers, self.tiers[1:], strict=False):
                upper.on_evict = lambda e, lower=lower: (None if e.key in lower or isinstance(e.kv, HeldKV)
                                                         else lower.put(e.key, e.kv, e.tenant))

    def get(self, key: str, tenant: str, retention: float = 1.0, method: str = "importance"
            ) -> DocumentKV | RetainedKV | None:
        """The document from the fastest tier that can serve ``retention`` (promoted upwards from a lossless
        tier), else loaded whole from the blob store and put into every tier; None when absent everywhere.
        Only a lossy tier's hit at ``retention`` below 1 is a :class:`RetainedKV`."""
        for i, tier in enumerate(self.tiers):
            kv = tier.get(key, tenant, retention, method)
            if kv is not None:
                self.counters[f"hit_{tier.name}"] += 1
                return self._fill(key, kv, tenant, self.tiers[:i]) if i and tier.format.lossless else kv
        if self.blob_store is None:
            self.counters["miss"] += 1
            return None
        with self._lock:
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = self._inflight[key] = Future()
        if not owner:
            self.counters["load_shared"] += 1
            return fut.result()
        try:
            kv = self.blob_store.get(key, self.dtype)
            if kv is None:
                self.counters["miss"] += 1
            else:
                self.counters["load"] += 1
                kv = self._fill(key, kv, tenant, self.tiers)
            fut.set_result(kv)
            return kv
        except BaseException as e:
            fut.set_exception(e)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _fill(self, key: str, kv: DocumentKV, tenant: str, tiers: list[CacheTier]) -> DocumentKV:
        """Put ``kv`` into ``tiers`` from the slowest up; the copy of the fastest lossless tier that took it."""
        best = kv
        for tier in reversed(tiers):
            got = tier.put(key, best, tenant)
            if got is not None and tier.format.lossless:
                best = got
        return best

    def get_many(self, keys: Iterable[str], tenant: str) -> list[DocumentKV | None]:
        """:meth:`get` for each key, in order."""
        return [self.get(k, tenant) for k in keys]

    def put(self, key: str, kv: DocumentKV, tenant: str) -> DocumentKV:
        """Insert a freshly computed document into every tier (not the blob store)."""
        return self._fill(key, kv, tenant, self.tiers)

    def invalidate(self, key: str) -> None:
        """Drop ``key`` from every tier where it is not pinned."""
        for tier in self.tiers:
            tier.remove(key)

    @contextmanager
    def pinned(self, keys: Iterable[str]) -> Iterator[None]:
        """Pin ``keys`` in every tier holding them for the duration of the block."""
        keys = list(keys)
        with ExitStack() as stack:
            for tier in self.tiers:
                stack.enter_context(tier.pinned(keys))
            yield

    def stats(self) -> dict:
        """``{tiers: [tier stats], counters: {hit_<tier>, load, load_shared, miss}}``."""
        return {"tiers": [t.stats() for t in self.tiers], "counters": dict(self.counters)}
