"""Open the whole store for a :class:`kvlink_rag.settings.Settings`: blobs, index, texts, tiers, catalog."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlink_rag.settings import Settings
from store.backends import open_blob_store, open_index
from store.blob_store import BlobStore
from store.catalog import Catalog, Enqueue
from store.doc_cache import StoreCache
from store.index import DocumentIndex
from store.lmdb_env import open_env
from store.policies import FairPolicy, LRUPolicy
from store.texts import TextStore
from store.tiers import CacheTier, TieredCache


@dataclass
class Store:
    """Handles to every part of the store (one LMDB environment under ``settings.store_dir`` holds the
    texts, the embedded index and, with the default ``lmdb://`` blob store, the KV caches)."""

    blobs: BlobStore
    index: DocumentIndex
    texts: TextStore
    tiered: TieredCache
    catalog: Catalog
    cache: StoreCache


def memory_tiers(settings: Settings) -> list[CacheTier]:
    """Device tier (when a GPU and a budget exist) then host tier, with fair or LRU eviction."""
    policy = FairPolicy if settings.fair_eviction else LRUPolicy
    tiers = []
    if settings.device_cache_bytes and torch.cuda.is_available():
        tiers.append(CacheTier("device", settings.device_cache_bytes, policy(), device="cuda"))
    tiers.append(CacheTier("host", settings.host_cache_bytes, policy(), device="cpu"))
    return tiers


def open_store(settings: Settings, enqueue: Enqueue | None = None, on_corrupt=None) -> Store:
    """Open (creating) the store under ``settings.home``.

    Args:
        enqueue: schedules precompute of ``(tenant, doc_id, version)``; without one, ingest only records.
        on_corrupt: called with a cache key whose record failed its checksum (re-queue it).
    Raises:
        ValueError: bad index URL; redis errors when a Redis index is unreachable.
    """
    settings.store_dir.mkdir(parents=True, exist_ok=True)
    blobs = open_blob_store(f"lmdb://{settings.store_dir}", max_map_size=settings.store_max_bytes,
                            on_corrupt=on_corrupt)
    # texts and the embedded index: the process-wide environment of the folder, the lmdb:// blob store's own
    env = open_env(settings.store_dir, max_map_size=settings.store_max_bytes)
    url = settings.index_url or f"lmdb://{settings.store_dir}"
    index = open_index(url, env=env if url.startswith("lmdb://") else None)
    texts = TextStore(env)
    tiered = TieredCache(memory_tiers(settings), blobs)
    cache = StoreCache(tiered, "default", settings.store_int8, settings.shared_cache_across_tenants)
    catalog = Catalog(index, texts, cache, enqueue or (lambda tenant, doc_id, version: None))
    return Store(blobs, index, texts, tiered, catalog, cache)
