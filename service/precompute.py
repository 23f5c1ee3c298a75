"""The precompute step of a document's lifecycle: encode the current version's chunks that are not stored
yet, write them through the store's one write path (:meth:`store.doc_cache.StoreCache.write`), mark the
record ready, and drop what no record points at any more. Called through
:class:`service.documents.DocumentService` (its failure policy is there).

A chunked document encodes only its chunks whose key is not stored yet and drops only the old keys the
new version does not use, so the chunks an edit left alone stay stored and keep serving as cache hits.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kvlink_rag.linking.chunk_past import chunk_walk
from kvlink_rag.types import Document
from store.doc_cache import StoreCache, too_large_reason
from store.index.document_index import DocumentRecord, is_corrupt
from store.lmdb_env import StoreBusyError, StoreFullError

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from kvlink_rag.types import DocumentKV
    from store.catalog import Catalog

log = logging.getLogger(__name__)


class CacheTooLarge(ValueError):
    """A document's KV cache is larger than the whole store (permanent until the limit is raised)."""


def precompute(catalog: Catalog, tenant: str, doc_id: str, version: int, engine: Engine) -> DocumentRecord | None:
    """Encode and store the document's KV if ``version`` is still current; idempotent.

    Returns the ready record, or None when the document is gone or a newer version exists (the task is
    stale and skipped). The old cache of an updated document is deleted once the new one is ready; the
    cache written here is deleted again when the document was deleted or updated while it was encoded
    (unless another record uses it). A corrupt stored text marks the record failed (and returns None).

    Raises:
        CacheTooLarge: the KV does not fit the store even alone; the document is marked ``failed`` with
            the reason (queries still answer it, encoding it each time).
        ValueError: the document cannot be encoded (e.g. longer than the model's context).
    """
    rec = catalog.index.get(tenant, doc_id)
    if rec is None or is_corrupt(rec) or rec.version != version:
        return None
    stored = catalog.stored_text(tenant, doc_id)
    if stored is None or stored["version"] != version:
        return None
    doc = Document(stored["text"], stored["title"] or None)
    engine.check_document_tokens(engine.linked_tokens(doc))  # chunks fit, but all of them must too
    chunks = engine.chunks(doc)
    keys = [catalog.cache_key(tenant, c, engine) for c in chunks]
    cache = catalog.cache.for_tenant(tenant)
    kvs, num_tokens, nbytes = _store_chunks(catalog, (tenant, doc_id, version), chunks, keys, cache, engine)
    ready = catalog.index.set_status(tenant, doc_id, "ready", version=version, cache_key=" ".join(keys),
                                     num_tokens=num_tokens, nbytes=nbytes)
    if ready is None:  # deleted or updated while encoding: nothing may point at these caches any more
        for key in keys:
            catalog.drop_cache(key, kvs.get(key))
        return None
    for c, key in zip(chunks, keys, strict=True):
        if not catalog.blobs.contains(key):  # a concurrent drop_cache deleted it after our check: store it again,
            catalog.restore_cache(key, kvs[key] if key in kvs else engine.encode(c))  # if still pointed at then
    for key in set(rec.cache_keys) - set(keys):  # the old version's chunks this version no longer has
        catalog.drop_cache(key)
    return ready


def _store_chunks(catalog: Catalog, task: tuple[str, str, int], chunks: list[Document], keys: list[str],
                  cache: StoreCache, engine: Engine) -> tuple[dict[str, DocumentKV], int, int]:
    """Encode and write the chunks whose key is not stored yet: ``({key: KV encoded here}, tokens, bytes)``
    of all chunks together (stored ones counted from their metadata); ``task`` is ``(tenant, doc_id,
    version)``.

    Raises:
        CacheTooLarge: a chunk's KV does not fit the store (the document is marked failed; the chunks
            written here are dropped again unless another record uses them).
    """
    kvs: dict = {}
    read: dict[str, DocumentKV] = {}  # chunks read from the store for the chunks after them (each read once)
    num_tokens = nbytes = 0
    with chunk_walk():  # each chunk after the caches of those before it: their past grows, not rebuilt
        for i, (c, key) in enumerate(zip(chunks, keys, strict=True)):
            meta = catalog.blobs.meta(key)
            if meta is not None:
                num_tokens, nbytes = num_tokens + int(meta["num_tokens"]), nbytes + int(meta["nbytes"])
                continue
            if key in kvs:  # the same chunk text twice in one document: stored once
                num_tokens += kvs[key].num_tokens
                continue
            before = _before(engine, cache, keys[:i], kvs, read)  # only where chunks are encoded after their caches
            kv = engine.encode(c) if before is None else engine.encode(c, before)
            try:
                nbytes += cache.write(key, kv, fill_tiers=False)
            except StoreBusyError:
                raise  # transient (a reader holds the space freed): the queue retries; chunks stored so far stay
            except StoreFullError as e:
                reason = too_large_reason(kv, e)
                log.warning("precompute of %s/%s v%d: %s", *task, reason)
                catalog.fail(*task, reason)
                for written in kvs:
                    catalog.drop_cache(written)
                raise CacheTooLarge(reason) from e
            kvs[key] = kv
            num_tokens += kv.num_tokens
    return kvs, num_tokens, nbytes


def _before(engine: Engine, cache: StoreCache, keys: list[str], kvs: dict[str, DocumentKV],
            read: dict[str, DocumentKV]) -> list[DocumentKV] | None:
    """The caches of the chunks before one (``keys``: theirs, in order) where the engine encodes a chunk after them
    (``chunk_context_from`` 'cache'): encoded here (``kvs``) or read from this tenant's store once (kept in ``read``);
    None otherwise, or when one is gone meanwhile (the engine then reads them through its own cache, encoding what it
    lacks). A store that quantizes (``store_int8``) is always read: a chunk is then encoded after what the store
    holds, as after an edit or at query time, never after the exact KV only this encode saw."""
    if engine.settings.chunk_context_from != "cache" or not keys:
        return None
    fresh = {} if cache.int8 else kvs
    for k in keys:
        if k not in fresh and k not in read and (kv := cache.get(k)) is not None:
            read[k] = kv
    out = [fresh.get(k, read.get(k)) for k in keys]
    return None if any(kv is None for kv in out) else out


def adopt(catalog: Catalog, tenant: str, doc_id: str, version: int, doc: Document,
          engine: Engine) -> DocumentRecord | None:
    """After a query encoded ``doc`` (version ``version`` as the query read it) and stored its cache:
    mark the record ready (no encoding: the cache is there); when the document was deleted or changed
    since, drop that cache unless another record uses it. The ready record, or None.

    Raises:
        ValueError: as :func:`precompute`.
    """
    ready = precompute(catalog, tenant, doc_id, version, engine)
    if ready is None:
        for key in catalog.cache_keys(tenant, doc, engine):
            catalog.drop_cache(key)
    return ready
