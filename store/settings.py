"""The store's settings (env vars ``KVLINK_RAG_*``): where the KV caches, texts and index live, the memory
tiers' budgets and eviction, the shared tier. The store reads only this class."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from kvlink_rag.home import LayerSettings


class StoreSettings(LayerSettings):
    """Store settings: every field can be set with ``KVLINK_RAG_<FIELD>`` (or in ``$KVLINK_RAG_HOME/settings.env``
    through :func:`service.settings.get_settings`)."""

    local_store_url: str | None = Field(
        None, description="This host's local store (KV caches, and the texts and embedded index unless "
        "index_url is set), opened by URL scheme (store/backends.py BACKENDS): lmdb://PATH; None = "
        "lmdb://<home>/store.")
    index_url: str = Field("", description="Document index: '' = embedded in the LMDB store, or redis://host:port/db.")
    shared_store_url: str = Field(
        "", description="Shared KV cache tier every host reads: redis://host:port/db or "
        "redis+cluster://host:port[,host:port]; the local LMDB store (KVLINK_RAG_STORE_MAX_BYTES) becomes a "
        "read-through tier in front of it. '' = none (caches only in the local store).")
    shared_store_timeout_s: float = Field(
        2.0, gt=0, le=60, description="Socket and connect timeout of the shared tier's connections (seconds): a "
        "paused or unreachable Redis (node) costs about this once, then its circuit breaker skips it (reads are "
        "misses, writes stay on this host) until a background probe answers.")
    shared_store_probe_interval_s: float = Field(
        1.0, gt=0, le=60, description="Seconds between background probes of a shared-tier server or cluster node "
        "whose circuit breaker is open.")
    store_max_bytes: int = Field(
        8 << 30, ge=1 << 20, description="LMDB map size limit (bytes, at least 1 MiB): the store's data file never "
        "grows past it; least valuable caches are evicted instead, and a document whose KV alone does not fit is "
        "answered uncached (its status says why).")
    store_int8: bool = Field(False, description="Store K and V as int8 (keys per channel, values per token).")
    host_cache_bytes: int = Field(1 << 30, ge=0, description="Host-memory tier budget (bytes).")
    device_cache_bytes: int = Field(0, ge=0, description="Accelerator tier budget (bytes); 0 = no device tier.")
    cold_cache_bytes: int = Field(
        0, ge=0, description="Cold host-memory tier below the host tier (bytes; 0 = none). It holds each document it "
        "takes (evicted from the host tier, or put into the tiers) at cold_cache_retention of its tokens (the top of "
        "the stored importance order, at their positions), int8 when cold_cache_int8, and serves a query only when "
        "it holds every token the query's retention keeps: a query at retention 1 reads such a document from the "
        "store (a partial miss).")
    cold_cache_retention: float = Field(0.4, gt=0.0, le=1.0, description="Fraction of each document's tokens the "
                                        "cold tier holds (0 < r <= 1).")
    cold_cache_int8: bool = Field(True, description="The cold tier holds K and V as int8 (keys per channel, values "
                                  "per token, as store_int8).")
    fair_eviction: bool = Field(True, description="Fair per-tenant eviction in the memory tiers (else LRU).")
    shared_cache_across_tenants: bool = Field(
        False, description="Let tenants share the KV cache of identical texts (only when all tenants trust each "
        "other: a cache hit and its timing reveal that another tenant holds the text). Off: each tenant's "
        "caches are keyed by tenant, so its first use of a text is a miss.")

    @property
    def store_dir(self) -> Path:
        """Document KV store (LMDB) lives here."""
        return self.home / "store"

    @property
    def local_store(self) -> str:
        """URL of this host's local store: ``local_store_url``, or ``lmdb://<store_dir>`` when it is None."""
        return self.local_store_url or f"lmdb://{self.store_dir}"
