"""Open the whole store for a :class:`store.settings.StoreSettings`: blobs, index, texts, tiers, catalog."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from store.settings import StoreSettings
from store.backends import open_blob_store, open_index, open_local_store, open_texts
from store.blobs.blob_store import BlobStore
from store.catalog import Catalog, Enqueue
from store.doc_cache import StoreCache
from store.index.document_index import DocumentIndex
from store.tiers.policies import FairPolicy, LRUPolicy
from store.texts import Texts
from store.tiers.tier import CacheTier
from store.tiers.tier_format import TierFormat
from store.tiers.tiered import TieredCache


@dataclass
class Store:
    """Handles to every part of the store (one LMDB environment under ``settings.store_dir`` holds the
    texts, the embedded index and the KV caches by default; with a Redis index the texts live in Redis too,
    and with a shared store URL ``blobs`` is the local LMDB tier in front of ``shared``)."""

    blobs: BlobStore
    index: DocumentIndex
    texts: Texts
    tiered: TieredCache
    catalog: Catalog
    cache: StoreCache
    shared: BlobStore | None = None


def memory_tiers(settings: StoreSettings) -> list[CacheTier]:
    """Device tier (when a GPU and a budget exist), host tier, then the cold tier (when it has a budget: documents
    at ``cold_cache_retention``, int8 if ``cold_cache_int8``), with fair or LRU eviction."""
    policy = FairPolicy if settings.fair_eviction else LRUPolicy
    tiers = []
    if settings.device_cache_bytes and torch.cuda.is_available():
        tiers.append(CacheTier("device", settings.device_cache_bytes, policy(), device="cuda"))
    tiers.append(CacheTier("host", settings.host_cache_bytes, policy(), device="cpu"))
    if settings.cold_cache_bytes:
        cold = TierFormat(settings.cold_cache_retention, settings.cold_cache_int8)
        tiers.append(CacheTier("cold", settings.cold_cache_bytes, policy(), device="cpu", fmt=cold))
    return tiers


def open_store(settings: StoreSettings, enqueue: Enqueue | None = None, on_corrupt=None) -> Store:
    """Open (creating) the store: the local one at ``settings.local_store`` (``lmdb://<home>/store`` by default).

    Args:
        enqueue: schedules precompute of ``(tenant, doc_id, version)``; without one, ingest only records.
        on_corrupt: called with a cache key whose record failed its checksum (re-queue it).
    Raises:
        ValueError: bad local store or index URL; redis errors when a Redis index is unreachable.
    """
    settings.store_dir.mkdir(parents=True, exist_ok=True)
    local = settings.local_store  # this host's store: blobs, and texts and index unless in Redis
    blobs = open_local_store(local, settings.store_max_bytes, on_corrupt)
    shared = None
    if settings.shared_store_url:  # no connection yet: an unreachable shared tier shows in /readyz
        from store.tiers.shared import TieredBlobStore

        shared = open_blob_store(settings.shared_store_url, timeout_s=settings.shared_store_timeout_s,
                                 probe_interval_s=settings.shared_store_probe_interval_s)
        blobs = TieredBlobStore(blobs, shared)
    url = settings.index_url or local  # the folder's one LMDB environment holds all three when local
    index = open_index(url)
    texts = open_texts(url) if url == local else open_texts(url, mirror=open_texts(local))
    tiered = TieredCache(memory_tiers(settings), blobs)
    cache = StoreCache(tiered, "default", settings.store_int8, settings.shared_cache_across_tenants)
    catalog = Catalog(index, texts, cache, enqueue or (lambda tenant, doc_id, version: None))
    return Store(blobs, index, texts, tiered, catalog, cache, shared)

