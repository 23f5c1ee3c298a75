"""Request and response bodies (pydantic). Limits that depend on settings are checked in the routes."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

DOC_ID_PATTERN = r"^[^/\x00-\x1f]{1,200}$"

# -- documents ---------------------------------------------------------------------------------------


class DocumentIn(BaseModel):
    """One document to ingest; ``id`` is generated (32 hex digits) when omitted."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(None, pattern=DOC_ID_PATTERN, description="Document id: 1-200 characters, no '/'.")
    text: str = Field(..., min_length=1, description="Document text (characters; limit KVLINK_RAG_MAX_DOCUMENT_CHARS).")
    title: str = Field("", max_length=1000)
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentBatch(BaseModel):
    """Several documents in one request (limit KVLINK_RAG_MAX_BATCH_DOCUMENTS)."""

    model_config = ConfigDict(extra="forbid")
    documents: list[DocumentIn] = Field(..., min_length=1)


class DocumentUpdate(BaseModel):
    """New text (and optionally title/metadata) of an existing document."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., min_length=1)
    title: str | None = Field(None, max_length=1000)
    metadata: dict[str, Any] | None = None


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
    cache_key: str = Field(..., description="Key of the stored KV cache ('' until precomputed).")
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


# -- queries -----------------------------------------------------------------------------------------


class Sampling(BaseModel):
    max_new_tokens: int | None = Field(None, ge=1, description="Limit KVLINK_RAG_MAX_NEW_TOKENS_LIMIT.")
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None


class QueryIn(Sampling):
    """A question over named documents (``document_ids``) or the ``top_k`` best BM25 matches."""

    model_config = ConfigDict(extra="forbid")
    question: str = Field(..., min_length=1)
    document_ids: list[str] | None = None
    top_k: int | None = Field(None, ge=1)
    stream: bool = False
    k: int | None = Field(None, ge=0, description="Link tokens per document (0 = naive reuse); at most the loaded K.")
    adapter: str | None = Field(None, description="'default' (the loaded link tokens and query-side adapter), 'none' "
                                "(adapter off) or the name of an artifact in $KVLINK_RAG_HOME/links (GET /v1/adapters).")


class UsedDocument(BaseModel):
    id: str
    title: str
    version: int
    content_hash: str
    cache_hit: bool = Field(..., description="True: KV came from the cache; False: encoded for this query.")
    score: float | None = Field(None, description="BM25 score when retrieved.")


class Timings(BaseModel):
    """Seconds from the request's start: retrieval (incl. reading the texts), waiting for the model,
    loading cached KV (and encoding misses), linking (RoPE + link/question forward), first token, total."""

    retrieval_s: float
    queue_wait_s: float
    cache_load_s: float
    link_s: float
    ttft_s: float
    total_s: float


class QueryOut(BaseModel):
    answer: str
    documents: list[UsedDocument]
    timings: Timings
    context_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length"]


# -- OpenAI-compatible chat --------------------------------------------------------------------------


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The text of the message (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatIn(BaseModel):
    """``/v1/chat/completions``: the last user message is the question; documents by ``document_ids``
    or ``top_k`` (extra fields, e.g. the openai client's ``extra_body``). Other OpenAI fields are ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    document_ids: list[str] | None = None
    top_k: int | None = Field(None, ge=1)
    k: int | None = Field(None, ge=0)
