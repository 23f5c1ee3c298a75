"""The engine's document cache on the store: memory tiers in front of the blob store.

:meth:`StoreCache.write` is the one path by which a document's cache is written (queries through
:meth:`StoreCache.put`, precompute and the catalog's re-stores directly).
"""

from __future__ import annotations

import logging

from kvlink_rag.cache import DocumentCache
from kvlink_rag.types import DocumentKV, LayeredDocuments, RetainedKV
from store.blobs.blob_store import BlobStore, BlobStoreUnavailable
from store.keys import tenant_fingerprint, text_key
from store.lmdb_env import StoreBusyError, StoreFullError
from store.records.ordered_layout import record_importance
from store.tiers.prefetch import prefetch_layers
from store.tiers.tier_format import hold_part
from store.tiers.tiered import TieredCache

log = logging.getLogger(__name__)


class BusyReason(str):
    """Why a document's cache was not stored, when a later write can store it (``StoreBusyError``: a reader held
    the space freed for it): the document's record is left as it is, never marked failed for it."""


def too_large_reason(kv: DocumentKV, error: StoreFullError) -> str:
    """Why a document's cache is not stored, for logs and the document's ``failed`` status (a :class:`BusyReason`
    when a later write can store it)."""
    if isinstance(error, StoreBusyError):
        return BusyReason(f"the document store is full and the space freed for its KV cache is still read ({error}); "
                          "queries encode it on the spot until a later write stores it")
    return (f"its KV cache ({kv.nbytes} bytes) does not fit the document store ({error}); queries encode it "
            "on the spot, uncached; raise KVLINK_RAG_STORE_MAX_BYTES to cache it")


class StoreCache(DocumentCache):
    """The :class:`kvlink_rag.cache.DocumentCache` of one tenant over a :class:`TieredCache` and its blob store.

    Reads go device tier, host tier, then LMDB; documents encoded at query time are written to the
    tiers and to LMDB, so the next process finds them on disk.

    Args:
        tiered: memory tiers over ``tiered.blob_store`` (a :class:`BlobStore`).
        tenant: whose quota the entries count against, and (unless ``shared``) whose keys these are.
        int8: store new documents as int8.
        shared: all tenants share caches of the same text (``shared_cache_across_tenants``); else each
            tenant's keys include the tenant (:func:`store.keys.tenant_fingerprint`).
        tracked: caches written here belong to document records of the catalog (the service); False for
            the ad-hoc caches of ``kvlink-rag ask``/``demo`` (see :meth:`untracked`).
    Raises:
        ValueError: ``tiered`` has no blob store.
    """

    def __init__(self, tiered: TieredCache, tenant: str = "default", int8: bool = False, shared: bool = False,
                 tracked: bool = True):
        if tiered.blob_store is None:
            raise ValueError("a StoreCache needs memory tiers over a blob store")
        self.tiered, self.tenant, self.int8, self.shared, self.tracked = tiered, tenant, int8, shared, tracked

    @property
    def blobs(self) -> BlobStore:
        return self.tiered.blob_store

    def for_tenant(self, tenant: str) -> "StoreCache":
        """The same tiers and store, counted against ``tenant``."""
        return StoreCache(self.tiered, tenant, self.int8, self.shared, self.tracked)

    def untracked(self) -> "StoreCache":
        """The same view for ad-hoc caches no document record points at (``ask``, ``demo``): kept and
        evicted like any other, never reported or removed by ``store check`` as unreferenced."""
        return StoreCache(self.tiered, self.tenant, self.int8, self.shared, tracked=False)

    def key(self, fingerprint: str, text: str) -> str:
        """``store.keys.cache_key`` of the exact prompt text (content hash, SimHash, and the fingerprint
        with this tenant folded in unless caches are shared)."""
        return text_key(tenant_fingerprint(fingerprint, self.tenant, self.shared), text)

    def get(self, key: str) -> DocumentKV | None:
        """From the fastest tier holding it, else LMDB (checksummed), else None."""
        return self.tiered.get(key, self.tenant)

    def resolve(self, keys: list[str], retention: float = 1.0, method: str = "importance"
                ) -> list[DocumentKV | RetainedKV | str | None]:
        """Per key: the document if a memory tier can serve ``retention`` (a lossy tier's part: a
        :class:`RetainedKV`), the key itself if only LMDB has it (to be streamed with :meth:`stream`), or None
        if it is nowhere."""
        out: list[DocumentKV | RetainedKV | str | None] = []
        for key in keys:
            kv = None
            for tier in self.tiered.tiers:
                kv = tier.get(key, self.tenant, retention, method)
                if kv is not None:
                    break
            if kv is None and self.blobs.contains(key):
                out.append(key)
            else:
                if kv is None:
                    self.tiered.counters["miss"] += 1  # nowhere, as TieredCache.get counts it
                out.append(kv)
        return out

    def shared_only(self, key: str) -> bool:
        """Whether only the shared tier holds ``key`` (its read is a fetch from Redis, not this host's disk)."""
        from store.tiers.shared import TieredBlobStore

        return isinstance(self.blobs, TieredBlobStore) and not self.blobs.local.contains(key)

    def stream(self, items: list[DocumentKV | RetainedKV | str], retention: float = 1.0,
               method: str = "importance") -> LayeredDocuments:
        """Layer stream over in-memory and LMDB documents at ``retention`` (below 1: prefix reads of
        importance-ordered records); LMDB ones fill the tiers once read whole, and below 1 (method
        ``importance``) the lossy tiers holding a retention at most ``retention`` (the cold tier).

        Raises:
            KeyError: a keyed document disappeared.
        """
        def retained(key: str, part: RetainedKV, meta: dict) -> None:
            self.tiered.counters["load"] += 1  # an LMDB hit at retention < 1 too (a prefix read of the record)
            lossy = [t for t in self.tiered.tiers if not t.format.lossless and key not in t]
            ids = self.blobs.get_ids(key) if lossy else None
            for tier in lossy if ids is not None else []:
                held = hold_part(part, record_importance(meta), ids, tier.format, tier.device)
                if held is not None:
                    tier.put(key, held, self.tenant)

        return prefetch_layers(self.blobs, items, on_loaded=self._loaded, retention=retention, method=method,
                               on_retained=retained)

    def _loaded(self, key: str, kv: DocumentKV) -> None:
        """A document read whole from the store enters the memory tiers (a bound method: equal across streams, so
        the tier filler queues a key once for this cache)."""
        self.tiered.counters["load"] += 1  # an LMDB hit, as TieredCache.get counts one (shown in /metrics)
        self.tiered.put(key, kv, self.tenant)

    def write(self, key: str, kv: DocumentKV, fill_tiers: bool = True) -> int:
        """The one write path of a document's cache: the blob store (atomic), then the memory tiers.

        With int8 storage the tiers get the dequantised copy read back, so a document is served the same
        before and after a restart.

        Args:
            fill_tiers: also put it in the memory tiers (each only if it fits); False for precompute,
                whose documents are read from the blob store when first asked for.
        Returns:
            payload bytes written to the blob store.
        Raises:
            store.lmdb_env.StoreFullError: the store is smaller than this document's KV even after evicting
                every other document (nothing was written).
            ValueError: invalid key or document.
        """
        nbytes = self.blobs.put(key, kv, int8=self.int8, tracked=self.tracked)
        if fill_tiers:
            if self.int8:
                kv = self.blobs.get(key, kv.dtype) or kv
            self.tiered.put(key, kv, self.tenant)
        return nbytes

    def put(self, key: str, kv: DocumentKV) -> str | None:
        """:meth:`write` to the blob store and the memory tiers; a document too large for the blob store is
        kept in the tiers only, and one the shared tier could not take (unreachable) on this host only.

        Returns:
            None when stored; else why not (logged as a warning; a :class:`BusyReason` when a later write can
            store it). The caller still has ``kv`` to answer from.
        """
        try:
            self.write(key, kv)
        except StoreFullError as e:
            reason = too_large_reason(kv, e)
            log.warning("document %s not cached: %s", key[:24], reason)
            self.tiered.put(key, kv, self.tenant)
            return reason
        except BlobStoreUnavailable as e:  # kept on this host (local tier written first); others encode it
            log.warning("document %s cached on this host only: %s", key[:24], e)
            self.tiered.put(key, kv, self.tenant)
        return None
