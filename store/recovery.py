"""Bringing the index back in line with the store after a crash or a lost index.

* :func:`requeue_unfinished`: documents accepted (``queued``, or ``stale`` after an update) whose precompute
  task may have been lost with a crashed process are queued again (tasks are idempotent: a duplicate finds
  the cache stored and only marks the record ready).
* :func:`rebuild_index`: records the index lacks (a Redis index restarted empty, a corrupt record) are
  recreated from the stored texts, which also hold title, metadata and version: ``ready`` when the
  tenant's cache of the text is stored, else ``queued`` and enqueued.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvlink_rag.types import Document
from store.index.document_index import DocumentRecord, is_corrupt
from store.integrity import CorruptEntry
from store.keys import content_hash, simhash64

if TYPE_CHECKING:
    from store.catalog import CacheKeying


def requeue_unfinished(store, enqueue) -> int:
    """Call ``enqueue(tenant, doc_id, version)`` for every ``queued`` or ``stale`` record; how many.

    Args:
        store: ``store.factory.Store``.
        enqueue: the precompute queue.
    """
    n = 0
    for tenant in store.index.tenants():
        for rec in store.index.records(tenant):
            if rec.status in ("queued", "stale") and not is_corrupt(rec):
                enqueue(tenant, rec.doc_id, rec.version)
                n += 1
    return n


def restore_record(store, tenant: str, doc_id: str, stored: dict, engine: CacheKeying | None = None) -> DocumentRecord:
    """Recreate the index record of a stored text (replacing a corrupt or missing one).

    Args:
        stored: the text entry (``store.texts.TextStore.get``).
        engine: finds the tenant's cache of the text (then the record is ``ready``); without one, or
            when the cache is not stored, the record is ``queued`` and its precompute enqueued (which finds
            a stored cache without encoding).
    Returns:
        the record stored.
    """
    text, title = stored["text"], stored.get("title") or ""
    rec = DocumentRecord(doc_id=doc_id, tenant=tenant, title=title, content_hash=content_hash(text),
                         simhash=simhash64(text), version=int(stored["version"]),
                         metadata=dict(stored.get("metadata") or {}))
    if engine is not None:
        keys = store.catalog.cache_keys(tenant, Document(text, title or None), engine)
        metas = [store.blobs.meta(key) for key in keys]
        if all(meta is not None for meta in metas):  # every chunk stored
            rec.status, rec.cache_key = "ready", " ".join(keys)
            rec.num_tokens = sum(int(meta["num_tokens"]) for meta in metas)
            rec.nbytes = sum(int(meta["nbytes"]) for meta in metas)
    rec = store.index.upsert(rec)
    if rec.status == "queued":
        store.catalog.enqueue(tenant, doc_id, rec.version)
    return rec


@dataclass
class RebuildReport:
    """What :func:`rebuild_index` did: ``(tenant, doc_id)`` lists."""

    ready: list[tuple[str, str]] = field(default_factory=list)
    queued: list[tuple[str, str]] = field(default_factory=list)
    corrupt_texts: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0

    def to_dict(self) -> dict:
        return {"restored_ready": [list(x) for x in self.ready], "restored_queued": [list(x) for x in self.queued],
                "corrupt_texts": [list(x) for x in self.corrupt_texts], "kept": self.kept}


def rebuild_index(store, engine: CacheKeying | None = None) -> RebuildReport:
    """Recreate every record the index lacks (or holds corrupt) from the stored texts; records that are
    there are kept as they are.

    Args:
        store: ``store.factory.Store``.
        engine: names the texts' caches (``kvlink_rag.engine.Engine``) to find those stored (see
            :func:`restore_record`).
    Raises:
        redis.exceptions.ConnectionError: the Redis index is unreachable.
    """
    report = RebuildReport()
    for tenant, doc_id, stored in store.texts.items():
        if isinstance(stored, CorruptEntry):
            report.corrupt_texts.append((tenant, doc_id))
            continue
        existing = store.index.get(tenant, doc_id)
        if existing is not None and not is_corrupt(existing):
            report.kept += 1
            continue
        rec = restore_record(store, tenant, doc_id, stored, engine)
        (report.ready if rec.status == "ready" else report.queued).append((tenant, doc_id))
    return report


def index_lost(store) -> bool:
    """True when the index holds no document but the text store does (e.g. Redis restarted empty)."""
    return not store.index.tenants() and not store.texts.empty()
