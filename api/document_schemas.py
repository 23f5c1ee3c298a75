"""Document request and response bodies (pydantic) and the document id rule every route shares."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, WithJsonSchema

from api.contract import NON_BLANK, every, limit, refused
from api.request_body import RequestBody

DOC_ID_MAX_BYTES = 200
DOC_ID_FORBIDDEN = "/\\?#%"
DOC_ID_RULE = (f"1-{DOC_ID_MAX_BYTES} bytes (UTF-8), none of / \\ ? # % or control characters, and not '.' or '..' "
               "(every id must be addressable as /v1/documents/{id} by an ordinary HTTP client)")
MAX_LIST_OFFSET = 10**9
NO_TEXT = {"text": {"type": "null"}}  # PUT without new text: pinned alone
UPDATE_REFUSED = refused({"properties": {**NO_TEXT, "pinned": {"type": "null"}}},  # nothing to do
                         {"required": ["title"], "properties": {**NO_TEXT, "title": {"type": "string"}}},
                         {"required": ["metadata"], "properties": {**NO_TEXT, "metadata": {"type": "object"}}},
                         {"required": ["text", "pinned"], "properties": {"text": {"type": "string"}, "pinned": {"const": True}}})


def check_doc_id(value: str) -> str:
    """``value`` if it is a valid document id (see ``DOC_ID_RULE``).

    URL paths drop ``.``/``..`` segments and split at ``/`` (and ``\\`` in browsers), a ``?``/``#`` ends the
    path and ``%`` starts an escape, so such ids could be stored but never read, updated or deleted.

    Raises:
        ValueError: the id breaks the rule (pydantic reports it as a 422 naming the field).
    """
    bad = sorted({c for c in value if c in DOC_ID_FORBIDDEN or ord(c) < 0x20 or ord(c) == 0x7F})
    if not value or len(value.encode()) > DOC_ID_MAX_BYTES or bad or value in (".", ".."):
        shown = f" (contains {', '.join(repr(c) for c in bad)})" if bad else ""
        raise ValueError(f"invalid document id {value[:40]!r}{shown}: use {DOC_ID_RULE}")
    return value


DOC_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": DOC_ID_MAX_BYTES, "pattern": "^[^/\\\\?#%\\u0000-\\u001f\\u007f]+$",
                 "not": {"enum": [".", ".."]}, "description": f"Document id: {DOC_ID_RULE}."}
DocId = Annotated[str, AfterValidator(check_doc_id), WithJsonSchema(DOC_ID_SCHEMA)]
"""A document id as it enters the API (ingest body, ``document_ids`` of queries)."""


# -- documents ---------------------------------------------------------------------------------------


class DocumentIn(RequestBody):
    """One document to ingest; ``id`` is generated (32 hex digits) when omitted."""

    id: DocId | None = Field(None, description=f"Document id: {DOC_ID_RULE}.")
    text: str = Field(..., min_length=1, description="Document text (characters; limit KVLINK_RAG_MAX_DOCUMENT_CHARS).",
                      json_schema_extra={"pattern": NON_BLANK, **limit(maxLength="max_document_chars")})
    title: str = Field("", max_length=1000)
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentBatch(RequestBody):
    """Several documents in one request (limit KVLINK_RAG_MAX_BATCH_DOCUMENTS)."""

    documents: list[DocumentIn] = Field(..., min_length=1, json_schema_extra=limit(maxItems="max_batch_documents"))


class DocumentUpdate(RequestBody):
    """New text (and optionally title/metadata) of an existing document, or ``pinned`` alone: keep (true) or
    stop keeping (false) its cache in this replica's host tier, within the tenant's pin budget."""

    model_config = ConfigDict(json_schema_extra=UPDATE_REFUSED)
    text: str | None = Field(None, min_length=1, json_schema_extra={"pattern": NON_BLANK, **limit(maxLength="max_document_chars")})
    title: str | None = Field(None, max_length=1000)
    metadata: dict[str, Any] | None = None
    pinned: bool | None = None


class PinOut(BaseModel):
    """A document's pin on this replica and the tenant's pin budget (bytes)."""

    id: str
    pinned: bool
    nbytes: int = Field(..., description="Host-tier bytes the document's pin holds (0 when unpinned).")
    tenant_pinned_bytes: int
    budget_bytes: int


def _ingest_kind(value: Any) -> str:
    return "batch" if isinstance(value, dict) and "documents" in value else "document"


IngestIn = Annotated[Union[Annotated[DocumentIn, Tag("document")], Annotated[DocumentBatch, Tag("batch")]],
                     Discriminator(_ingest_kind)]
"""Body of ``POST /v1/documents``: one document, or ``{"documents": [...]}`` (chosen by that key)."""


class NearDuplicate(BaseModel):
    id: str
    distance: int = Field(..., description="SimHash Hamming distance (bits, 0-3).")


class IngestOut(BaseModel):
    """Outcome of ingesting one document (answered with 202: precompute runs in the background)."""

    id: str
    status: str = Field(..., description="queued | ready | stale | failed")
    version: int
    queued: bool = Field(..., description="A precompute was queued (new or changed text).")
    content_hash: str = Field(..., description="sha256 hex of the normalised text.")
    simhash: str = Field(..., description="64-bit SimHash, 16 hex digits.")
    near_duplicates: list[NearDuplicate]


class IngestBatchOut(BaseModel):
    documents: list[IngestOut]


class DocumentOut(BaseModel):
    """A document's record (and text on request)."""

    id: str
    title: str
    status: str
    version: int
    content_hash: str
    simhash: str
    cache_key: str = Field(..., description="Key of the stored KV cache ('' until precomputed); a document "
                           "stored as chunks (longer than KVLINK_RAG_CHUNK_TOKENS): its chunks' keys, space-separated.")
    num_tokens: int
    nbytes: int
    hits: int
    created: float
    updated: float
    metadata: dict[str, Any]
    text: str | None = None


class DocumentPage(BaseModel):
    total: int
    offset: int
    limit: int
    documents: list[DocumentOut]


class Deleted(BaseModel):
    id: str
    deleted: bool
