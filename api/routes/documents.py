"""``/v1/documents``: ingest (one or a batch), read, list, update (invalidates the cache), delete.

Ingest and update answer 202: the record is stored and a precompute queued (embedded thread pool or
Celery worker); queries encode a document on the spot if its precompute has not finished.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response

from api.deps import StateDep, TenantDep
from api.errors import ApiError, error_responses
from api.document_schemas import (MAX_LIST_OFFSET, Deleted, DocumentBatch, DocumentOut, DocumentPage,
                                  DocumentUpdate, IngestBatchOut, IngestIn, IngestOut, NearDuplicate, PinOut)
from api.state import ServiceState
from service.text_rules import find_unencodable, sanitised

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/documents", tags=["documents"], responses=error_responses(401, 503))
MAX_PAGE = 1000


def check_limits(state: ServiceState, doc_id: str, text: str, title: str, metadata: dict | None) -> None:
    """Size limits of one document.

    Raises:
        ApiError: 413 over the character, token or metadata limit; 422 for metadata that is not JSON.
    """
    s = state.settings
    if len(text) > s.max_document_chars:
        raise ApiError(413, "document_too_large", f"document {doc_id!r} has {len(text)} characters; the limit is "
                       f"{s.max_document_chars} (KVLINK_RAG_MAX_DOCUMENT_CHARS)")
    if metadata:
        try:
            size = len(json.dumps(metadata, allow_nan=False).encode())
        except (TypeError, ValueError) as e:
            raise ApiError(422, "invalid_metadata", f"metadata of {doc_id!r} is not JSON: {e}") from e
        if size > s.max_metadata_bytes:
            raise ApiError(413, "metadata_too_large", f"metadata of {doc_id!r} has {size} bytes; the limit is "
                           f"{s.max_metadata_bytes} (KVLINK_RAG_MAX_METADATA_BYTES)")
    if not text.strip():
        raise ApiError(422, "empty_document", f"document {doc_id!r} is empty")
    try:
        size = state.runtime.documents.size(text, title)
    except ValueError as e:
        raise ApiError(422, "invalid_document", f"document {doc_id!r}: {e}") from e
    if size.tokens > s.max_document_tokens:
        raise ApiError(413, "document_too_large", f"document {doc_id!r} has {size.tokens} tokens; the limit is "
                       f"{s.max_document_tokens} (KVLINK_RAG_MAX_DOCUMENT_TOKENS)")
    if size.linked > size.fits:  # what a query over this document alone can hold, its chunks' links included
        raise ApiError(413, "document_too_large", f"document {doc_id!r} has {size.linked} tokens; the limit is "
                       f"{size.fits}: {size.budget}")


def _ingest(state: ServiceState, tenant: str, doc_id: str, text: str, title: str, metadata,
            update: bool = False) -> IngestOut:
    documents = state.runtime.documents
    try:
        if update:
            res = documents.update(tenant, doc_id, text, title, metadata)
        else:
            res = documents.ingest(tenant, doc_id, text, title, metadata)
    except ValueError as e:
        raise ApiError(422, "invalid_document", f"document {doc_id!r}: {e}") from e
    r = res.record
    return IngestOut(id=r.doc_id, status=r.status, version=r.version, queued=res.queued, content_hash=r.content_hash,
                     simhash=f"{r.simhash:016x}",
                     near_duplicates=[NearDuplicate(id=d, distance=n) for d, n in res.near_duplicates])


def document_out(rec, text: str | None = None) -> DocumentOut:
    """The API view of a ``store.index.document_index.DocumentRecord``. Text no JSON response can carry (lone surrogates, NaN
    in metadata: stored before the API refused them) is shown sanitised (U+FFFD, null), so one such record
    never fails a listing; ``kvlink-rag store check --repair`` rewrites it."""
    fields = {"id": rec.doc_id, "title": rec.title, "metadata": rec.metadata, "text": text}
    shown = {name: sanitised(value) for name, value in fields.items()}
    if any(find_unencodable(value) for value in fields.values()):
        log.warning("document %r of tenant %r holds text that is not valid Unicode; shown sanitised (run "
                    "`kvlink-rag store check --repair`)", shown["id"], sanitised(rec.tenant))
    return DocumentOut(id=shown["id"], title=shown["title"], status=rec.status, version=rec.version,
                       content_hash=rec.content_hash, simhash=f"{rec.simhash:016x}", cache_key=rec.cache_key,
                       num_tokens=rec.num_tokens, nbytes=rec.nbytes, hits=rec.hits, created=rec.created,
                       updated=rec.updated, metadata=shown["metadata"], text=shown["text"])


@router.post("", status_code=202, response_model=IngestOut | IngestBatchOut,
             responses=error_responses(413))
def ingest(state: StateDep, tenant: TenantDep, body: Annotated[IngestIn, Body()]):
    """Ingest one document, or ``{"documents": [...]}``; all are checked before any is stored."""
    docs = body.documents if isinstance(body, DocumentBatch) else [body]
    if len(docs) > state.settings.max_batch_documents:
        raise ApiError(413, "batch_too_large", f"{len(docs)} documents in one request; the limit is "
                       f"{state.settings.max_batch_documents} (KVLINK_RAG_MAX_BATCH_DOCUMENTS)")
    ids = [d.id or uuid.uuid4().hex for d in docs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ApiError(422, "duplicate_ids", f"document ids repeated in the batch: {', '.join(dup)}")
    for doc_id, d in zip(ids, docs, strict=True):
        check_limits(state, doc_id, d.text, d.title, d.metadata)
    out = [_ingest(state, tenant, doc_id, d.text, d.title, d.metadata) for doc_id, d in zip(ids, docs, strict=True)]
    return IngestBatchOut(documents=out) if isinstance(body, DocumentBatch) else out[0]


@router.get("", response_model=DocumentPage)
def list_documents(state: StateDep, tenant: TenantDep, offset: Annotated[int, Query(ge=0, le=MAX_LIST_OFFSET)] = 0,
                   limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100) -> DocumentPage:
    """The tenant's documents ordered by id, ``limit`` from ``offset``."""
    recs = state.store.index.list(tenant, offset=offset, limit=limit)
    return DocumentPage(total=state.store.index.count(tenant), offset=offset, limit=limit,
                        documents=[document_out(r) for r in recs])


def _record(state: ServiceState, tenant: str, doc_id: str):
    rec = state.store.index.get(tenant, doc_id)
    if rec is None:
        raise ApiError(404, "document_not_found", f"unknown document id: {doc_id}")
    return rec


@router.get("/{doc_id}", response_model=DocumentOut, responses=error_responses(404))
def get_document(state: StateDep, tenant: TenantDep, doc_id: str,
                 include_text: Annotated[bool, Query(description="Also return the text.")] = False) -> DocumentOut:
    """One document of the caller's tenant (404 for unknown ids and other tenants' documents). A document
    whose stored text or record is corrupt is ``failed``, ``metadata.error`` saying so: re-ingest it."""
    rec, stored = state.store.catalog.verified(tenant, doc_id)  # the text is checked (marks it failed if corrupt)
    if rec is None:
        raise ApiError(404, "document_not_found", f"unknown document id: {doc_id}")
    return document_out(rec, stored["text"] if include_text and stored else None)


@router.put("/{doc_id}", status_code=202, response_model=IngestOut | PinOut,
            responses={200: {"model": PinOut, "description": "pinned alone: the pin (or unpin) is done"},
                       **error_responses(404, 409, 413)})
def update_document(state: StateDep, tenant: TenantDep, doc_id: str, body: DocumentUpdate, response: Response):
    """Replace the text: the old cache is never served again and is deleted once the new one is ready (a pinned
    document is unpinned). Or, with ``pinned`` alone (200): pin or unpin its cache in this replica's host tier."""
    rec = _record(state, tenant, doc_id)
    pins = state.runtime.pins
    if body.text is None:
        if body.pinned is None or body.title is not None or body.metadata is not None:
            raise ApiError(422, "invalid_request", "give the new text (with title, metadata), or pinned alone")
        response.status_code = 200
        return pin_document(pins, tenant, rec, body.pinned)
    if body.pinned:
        raise ApiError(422, "invalid_request", "pin a document once its new version is ready (PUT pinned alone)")
    title = rec.title if body.title is None else body.title
    check_limits(state, doc_id, body.text, title, body.metadata)
    return _ingest(state, tenant, doc_id, body.text, title, body.metadata, update=True)


def pin_document(pins, tenant: str, rec, pinned: bool) -> PinOut:
    """Pin or unpin ``rec``'s caches (:class:`service.pins.PinRegistry`).

    Raises:
        ApiError: 409 not ready, over the pin budget or too large for the host tier; 422 without a host tier.
    """
    if pins is None:
        raise ApiError(422, "no_host_tier", "pinning needs a host tier (KVLINK_RAG_HOST_CACHE_BYTES > 0)")
    nbytes = pins.pin(tenant, rec.doc_id, rec.cache_keys) if pinned else 0
    if not pinned:
        pins.unpin(tenant, rec.doc_id)
    return PinOut(id=rec.doc_id, pinned=pinned, nbytes=nbytes, tenant_pinned_bytes=pins.tenant_bytes(tenant),
                  budget_bytes=pins.budget)


@router.delete("/{doc_id}", response_model=Deleted, responses=error_responses(404))
def delete_document(state: StateDep, tenant: TenantDep, doc_id: str) -> Deleted:
    """Remove the record, the text and the cache (unless another document has the same text); also a text
    whose record the index lost."""
    if not state.runtime.documents.delete(tenant, doc_id):  # unpinned first
        raise ApiError(404, "document_not_found", f"unknown document id: {doc_id}")
    return Deleted(id=doc_id, deleted=True)
