"""The engine's document cache on the store: memory tiers in front of the LMDB blob store."""

from __future__ import annotations

from kvlink_rag.types import DocumentKV, LayeredDocuments
from store.blobs import BlobStore
from store.keys import text_key
from store.prefetch import prefetch_layers
from store.tiers import TieredCache


class StoreCache:
    """``kvlink_rag.engine.DocumentCache`` for one tenant over a :class:`TieredCache` and its blob store.

    Reads go device tier, host tier, then LMDB; documents encoded at query time are written to the
    tiers and to LMDB, so the next process finds them on disk.

    Args:
        tiered: memory tiers over ``tiered.blob_store`` (a :class:`BlobStore`).
        tenant: whose quota the entries count against.
        int8: store new documents as int8.
    """

    def __init__(self, tiered: TieredCache, tenant: str = "default", int8: bool = False):
        self.tiered, self.tenant, self.int8 = tiered, tenant, int8

    @property
    def blobs(self) -> BlobStore:
        return self.tiered.blob_store

    def for_tenant(self, tenant: str) -> "StoreCache":
        """The same tiers and store, counted against ``tenant``."""
        return StoreCache(self.tiered, tenant, self.int8)

    def key(self, fingerprint: str, text: str) -> str:
        """``store.keys.cache_key`` of the exact prompt text (content hash, SimHash, fingerprint)."""
        return text_key(fingerprint, text)

    def get(self, key: str) -> DocumentKV | None:
        """From the fastest tier holding it, else LMDB (checksummed), else None."""
        return self.tiered.get(key, self.tenant)

    def resolve(self, keys: list[str]) -> list[DocumentKV | str | None]:
        """Per key: the document if a memory tier holds it, the key itself if only LMDB has it (to be
        streamed with :meth:`stream`), or None if it is nowhere."""
        out: list[DocumentKV | str | None] = []
        for key in keys:
            kv = None
            for tier in self.tiered.tiers:
                kv = tier.get(key, self.tenant)
                if kv is not None:
                    break
            if kv is None and self.blobs is not None and self.blobs.contains(key):
                out.append(key)
            else:
                out.append(kv)
        return out

    def stream(self, items: list[DocumentKV | str]) -> LayeredDocuments:
        """Layer stream over in-memory and LMDB documents; LMDB ones fill the tiers once read.

        Raises:
            KeyError: a keyed document disappeared.
        """
        return prefetch_layers(self.blobs, items, on_loaded=lambda key, kv: self.tiered.put(key, kv, self.tenant))

    def put(self, key: str, kv: DocumentKV) -> None:
        """Write to LMDB (atomic) and the memory tiers.

        With int8 storage the tiers get the dequantised copy read back, so a document is served the same
        before and after a restart.
        """
        if self.blobs is not None:
            self.blobs.put(key, kv, int8=self.int8)
            if self.int8:
                kv = self.blobs.get(key, kv.dtype) or kv
        self.tiered.put(key, kv, self.tenant)
