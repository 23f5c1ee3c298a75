"""Answering a query for a tenant: validate, pick documents (ids or BM25), link cached KV, generate.

The engine is shared by all requests; each request works on a shallow copy whose ``cache`` is the
tenant's view of the store wrapped in a :class:`RecordingCache` (per-document hit/miss), and every model
call runs under one lock (one model; the embedded precompute threads take it too). Planning never takes
that lock (a named adapter is only checked then, and loaded into the model when the query runs), so
requests waiting for the model wait in :mod:`api.concurrency`, not in threads. Documents read by
id come from the text store (LMDB), not the index, so a query over cached documents still answers while
a Redis index is down.

All timings are seconds measured from the start of :meth:`QueryService.plan` (request accepted).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from api.errors import ApiError, redis_errors
from api.recording_cache import RecordingCache
from kvlink_rag.engine import Document
from kvlink_rag.types import ContextTooLong
from store.keys import content_hash

log = logging.getLogger(__name__)


@dataclass
class QueryDoc:
    """A document chosen for a query: id, current version and text, BM25 score when retrieved."""

    doc_id: str
    version: int
    document: Document
    score: float | None = None

    @property
    def content_hash(self) -> str:
        return content_hash(self.document.text)


@dataclass
class QueryPlan:
    """Validated query with its documents; ``t0`` is ``time.perf_counter()`` at the start."""

    tenant: str
    question: str
    docs: list[QueryDoc]
    retrieval_s: float
    t0: float
    k: int | None = None
    adapter: str | None = None
    sampling: dict = field(default_factory=dict)


@dataclass
class QueryResult:
    """Answer text and ids, per-document cache hits, timings (s) and token counts."""

    answer: str
    token_ids: list[int]
    docs: list[QueryDoc]
    cache_hits: list[bool]
    timings: dict[str, float]
    context_tokens: int
    finish_reason: str

    def documents(self) -> list[dict]:
        """``[{id, title, version, content_hash, cache_hit, score}]`` in prompt order."""
        return [{"id": d.doc_id, "title": d.document.title or "", "version": d.version,
                 "content_hash": d.content_hash, "cache_hit": hit, "score": d.score}
                for d, hit in zip(self.docs, self.cache_hits, strict=True)]


class QueryService:
    """Queries over one shared engine and store.

    Args:
        engine: ``kvlink_rag.engine.Engine`` whose cache is the store's ``StoreCache``.
        store: ``store.factory.Store``.
        retrieval: :class:`api.retrieval.Retrieval`.
        model_lock: serialises model calls.
        settings: limits (question length, top_k, max_new_tokens, documents per query).
        on_result: called with every finished :class:`QueryResult` (metrics).
    """

    def __init__(self, engine, store, retrieval, model_lock: threading.Lock, settings,
                 on_result: Callable[[QueryResult], None] | None = None):
        from kvlink_rag.named_adapters import AdapterVariants

        self.engine, self.store, self.retrieval, self.model_lock = engine, store, retrieval, model_lock
        self.settings, self.on_result = settings, on_result
        self.variants = AdapterVariants(engine, settings.links_dir, settings.max_loaded_adapters)

    # -- validation and document choice --------------------------------------------------------------
    def plan(self, tenant: str, question: str, document_ids: list[str] | None = None, top_k: int | None = None,
             k: int | None = None, adapter: str | None = None, **sampling) -> QueryPlan:
        """Check the limits and pick the documents.

        Raises:
            ApiError: 422 over a limit or contradictory fields, 400 unknown adapter, 404 unknown document
                ids or no document matching the question.
            redis.exceptions.ConnectionError: retrieval needed the Redis index and it is down.
        """
        t0 = time.perf_counter()
        s = self.settings
        question = (question or "").strip()
        if not question:
            raise ApiError(422, "invalid_question", "question is empty")
        if len(question) > s.max_question_chars:
            raise ApiError(422, "question_too_long", f"question has {len(question)} characters; the limit is "
                           f"{s.max_question_chars} (KVLINK_RAG_MAX_QUESTION_CHARS)")
        if document_ids is not None and top_k is not None:
            raise ApiError(422, "invalid_request", "give either document_ids or top_k, not both")
        mnt = sampling.get("max_new_tokens")
        if mnt is not None and not 1 <= mnt <= s.max_new_tokens_limit:
            raise ApiError(422, "max_new_tokens_out_of_range", f"max_new_tokens must be within 1..{s.max_new_tokens_limit}"
                           f" (KVLINK_RAG_MAX_NEW_TOKENS_LIMIT), got {mnt}")
        self._check_links(k, adapter)
        if document_ids is not None:
            docs = self._by_ids(tenant, document_ids)
        else:
            docs = self._retrieve(tenant, question, s.default_top_k if top_k is None else top_k)
        return QueryPlan(tenant, question, docs, time.perf_counter() - t0, t0, k, adapter,
                         {k_: v for k_, v in sampling.items() if v is not None})

    def _check_links(self, k: int | None, adapter: str | None, load: bool = False):
        """Check ``adapter`` exists and fits the model and ``k`` is within its K (reads its file only).

        With ``load`` (under the model lock): the adapter's engine, its LoRA loaded into the model.
        """
        from kvlink_rag.links import LinkTokensMismatch
        from kvlink_rag.named_adapters import UnknownAdapter

        try:
            eng = self.variants.get(adapter) if load else None
            lt = eng.link_tokens if eng is not None else self.variants.check(adapter)
        except UnknownAdapter as e:
            raise ApiError(400, "unknown_adapter", str(e)) from None
        except LinkTokensMismatch as e:
            raise ApiError(400, "adapter_mismatch", str(e)) from None
        loaded = lt.k if lt is not None else 0
        if k is not None and not 0 <= k <= loaded:
            raise ApiError(422, "k_out_of_range", f"k (link tokens per document) must be within 0..{loaded}, "
                           f"the number loaded (KVLINK_RAG_LINK_K or the adapter's K); got {k}")
        return eng

    def _by_ids(self, tenant: str, ids: list[str]) -> list[QueryDoc]:
        ids = list(dict.fromkeys(ids))
        if not ids:
            raise ApiError(422, "invalid_request", "document_ids is empty (omit it to retrieve with top_k)")
        if len(ids) > self.settings.max_query_documents:
            raise ApiError(422, "too_many_documents", f"{len(ids)} document ids; the limit is "
                           f"{self.settings.max_query_documents} (KVLINK_RAG_MAX_QUERY_DOCUMENTS)")
        found = [self._load(tenant, i) for i in ids]
        missing = [i for i, d in zip(ids, found, strict=True) if d is None]
        if missing:
            raise ApiError(404, "document_not_found", f"unknown document id(s): {', '.join(missing)}")
        return found

    def _retrieve(self, tenant: str, question: str, top_k: int) -> list[QueryDoc]:
        if not 1 <= top_k <= self.settings.max_top_k:
            raise ApiError(422, "top_k_out_of_range", f"top_k must be within 1..{self.settings.max_top_k} "
                           f"(KVLINK_RAG_MAX_TOP_K), got {top_k}")
        docs = []
        for doc_id, score in self.retrieval.search(tenant, question, top_k):
            d = self._load(tenant, doc_id, strict=False)  # None: deleted since the index was built, or corrupt
            if d is not None:
                d.score = score
                docs.append(d)
        if not docs:
            raise ApiError(404, "no_matching_documents", "no document of this tenant shares a word with the "
                           "question (BM25); ingest documents or name them with document_ids")
        return docs

    def _load(self, tenant: str, doc_id: str, strict: bool = True) -> QueryDoc | None:
        """The document's current text (verified), or None when unknown.

        The index must hold the document: a text whose record the index lost is not served. While the index
        is unreachable the text store alone decides, so queries over cached documents survive a Redis outage.

        Raises:
            ApiError: 409 ``document_corrupt`` when its stored text or index record failed its checksum
                (with ``strict``; else None).
        """
        from store.index import is_corrupt
        from store.integrity import CorruptEntry

        try:
            stored = self.store.texts.get(tenant, doc_id)
            rec = self._index_record(tenant, doc_id) if stored is not None else None
            if is_corrupt(rec):
                raise CorruptEntry(f"index record of document {doc_id!r}", rec.reason)
        except CorruptEntry as e:
            with contextlib.suppress(*redis_errors()):
                self.store.catalog.mark_corrupt(tenant, doc_id, e)
            if not strict:
                return None
            raise ApiError(409, "document_corrupt", f"document {doc_id!r} cannot be served: {e}") from None
        if stored is None or rec is None:
            return None
        return QueryDoc(doc_id, int(stored["version"]), Document(stored["text"], stored["title"] or None))

    def _index_record(self, tenant: str, doc_id: str):
        """The index record, or ``True`` (unknown, but do not refuse) while the index is unreachable."""
        try:
            return self.store.index.get(tenant, doc_id)
        except redis_errors():
            return True

    # -- answering -----------------------------------------------------------------------------------
    def _request_engine(self, plan: QueryPlan):
        """The engine of the plan's adapter (loaded now: call under the model lock) with a recording cache.

        The adapter is checked again: its file may have been removed or rewritten since planning.
        """
        eng = copy.copy(self._check_links(plan.k, plan.adapter, load=True))  # the shared engines stay as they are
        eng.cache = RecordingCache(self.store.cache.for_tenant(plan.tenant))
        return eng

    def answer(self, plan: QueryPlan) -> QueryResult:
        """Generate the whole answer.

        Raises:
            ApiError: 422 when the prompt does not fit the model (``ContextTooLong``), 400 when the adapter
                was removed or replaced by a foreign one since planning. Anything else is an internal error.
        """
        docs = [d.document for d in plan.docs]
        with self.model_lock:
            t_call = time.perf_counter()
            eng = self._request_engine(plan)
            try:
                ans = eng.answer(plan.question, docs, k=plan.k, **plan.sampling)
            except ContextTooLong as e:
                raise ApiError(422, "context_too_long", str(e)) from e
        end = time.perf_counter()
        timings = {"retrieval_s": plan.retrieval_s, "queue_wait_s": t_call - plan.t0 - plan.retrieval_s,
                   "cache_load_s": ans.timings.get("load_s", 0.0),
                   "link_s": ans.timings.get("rope_s", 0.0) + ans.timings.get("link_forward_s", 0.0),
                   "ttft_s": t_call - plan.t0 + ans.ttft_s, "total_s": end - plan.t0}
        return self._finish(plan, eng, ans.text, ans.token_ids, timings, ans.context_tokens, ans.finish_reason)

    def stream(self, plan: QueryPlan) -> Iterator[tuple[str, object]]:
        """Yield ``("token", text piece)`` as generated, then ``("done", QueryResult)``.

        Holds the model lock while generating; closing the generator early releases it. Raises as
        :meth:`answer` (before the first token).
        """
        from kvlink_rag.adapters import adapter_scope
        from kvlink_rag.generate import decode, stream_text

        docs = [d.document for d in plan.docs]
        ids: list[int] = []
        pieces: list[str] = []
        first = None

        def counted(it):
            for tok in it:
                ids.append(tok)
                yield tok

        with self.model_lock:
            t_call = time.perf_counter()
            eng = self._request_engine(plan)
            try:
                ctx, _ = eng.link_context(plan.question, docs, plan.k)
            except ContextTooLong as e:
                raise ApiError(422, "context_too_long", str(e)) from e
            params = eng.sampling(**plan.sampling)
            with adapter_scope(eng.lm, eng.adapter):
                for piece in stream_text(eng.lm.tokenizer, counted(decode(eng.lm, ctx, params))):
                    if first is None:
                        first = time.perf_counter()
                    pieces.append(piece)
                    yield "token", piece
        end = time.perf_counter()
        t = ctx.timings
        timings = {"retrieval_s": plan.retrieval_s, "queue_wait_s": t_call - plan.t0 - plan.retrieval_s,
                   "cache_load_s": t.load_s, "link_s": t.rope_s + t.link_forward_s,
                   "ttft_s": (first or end) - plan.t0, "total_s": end - plan.t0}
        text = eng.lm.tokenizer.decode(ids, skip_special_tokens=True).strip()
        yield "done", self._finish(plan, eng, text, ids, timings, ctx.next_position, ctx.finish_reason or "length")

    def _finish(self, plan: QueryPlan, eng, text: str, ids: list[int], timings: dict, context_tokens: int,
                finish_reason: str) -> QueryResult:
        keys = [eng.cache_key(d.document) for d in plan.docs]
        hits = [eng.cache.hits.get(key, False) for key in keys]
        result = QueryResult(text, ids, plan.docs, hits, timings, context_tokens, finish_reason)
        self._record(plan, hits, [eng.cache.unstored.get(key) for key in keys])
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _record(self, plan: QueryPlan, hits: list[bool], unstored: list[str | None]) -> None:
        """Bookkeeping after a query (best effort; skipped while the index is down): documents encoded on
        the spot become ``ready`` in the index (their cache is already stored, so this does not encode
        again), those too large for the store ``failed`` (with the reason; queries keep answering them
        uncached), hit counters of the others go up."""
        catalog = self.store.catalog
        try:
            for d, hit, why in zip(plan.docs, hits, unstored, strict=True):
                if hit:
                    self.store.index.incr_hits(plan.tenant, d.doc_id)
                elif why is not None:
                    catalog.fail(plan.tenant, d.doc_id, d.version, why)
                else:
                    with self.model_lock:  # ready now; or the cache it wrote is dropped if d changed since
                        catalog.adopt(plan.tenant, d.doc_id, d.version, d.document, self.engine)
        except redis_errors() as e:
            log.warning("index unreachable; query bookkeeping skipped (%s)", e)
        except ValueError as e:  # the document was marked failed (e.g. its cache does not fit the store)
            log.warning("query bookkeeping: %s", e)
