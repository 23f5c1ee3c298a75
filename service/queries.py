"""Answering a query for a tenant: validate, pick documents (ids or BM25), link cached KV, generate.

The engine is shared by all requests; each request works on a shallow copy whose ``cache`` is the
tenant's view of the store wrapped in a :class:`RecordingCache` (per-document hit/miss). Every query (linked,
full, chat, retention below 1, CacheBlend recompute, explain, named adapters) is submitted to the batching
scheduler (:mod:`service.scheduled`); there is no other path to the model. Planning never takes the model
lock (a named adapter is only checked then, and loaded into the model when the request is admitted).
Documents are chosen and loaded by :mod:`service.documents_choice`; plans and results are
:mod:`service.query_plan`.

All timings are seconds measured from the start of :meth:`QueryService.plan` (request accepted).
A plan's ``mode`` is ``linked`` (the cached KV re-linked) or ``full`` (ordinary full prefill of the same
prompt ids, for comparison: no cache is read or written, no link tokens).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from service.documents import DocumentService
from service.documents_choice import DocumentChoice, QueryDoc
from service.errors import ServiceError, redis_errors
from service.explained import check_explained
from service.query_plan import (MODES, QueryPlan, QueryResult, check_generation, check_recompute, check_request,
                                choose_documents)
from store.doc_cache import BusyReason
from store.recording_cache import RecordingCache

if TYPE_CHECKING:
    from kvlink_rag.decoding.answer import Answer
    from kvlink_rag.engine import Engine
    from kvlink_rag.runtime.scheduler import Scheduler
    from service.settings import Settings
    from service.retrieval import Retrieval
    from store.factory import Store

__all__ = ["MODES", "QueryDoc", "QueryPlan", "QueryResult", "QueryService", "check_request", "choose_documents"]

log = logging.getLogger(__name__)


class QueryService:
    """Queries over one shared engine and store.

    Args:
        engine: the shared engine; its cache is the store's ``StoreCache`` (the store's cache keys).
        store: the store (texts, index, catalog, cache).
        retrieval: BM25 over each tenant's documents.
        model_lock: serialises model calls (the scheduler's steps, bookkeeping).
        settings: limits (question length, top_k, max_new_tokens, documents per query).
        on_result: called with every finished :class:`QueryResult` (metrics).
        scheduler: the batching scheduler every answer runs in.
    """

    def __init__(self, engine: Engine, store: Store, retrieval: Retrieval, model_lock: threading.Lock,
                 settings: Settings, scheduler: Scheduler, on_result: Callable[[QueryResult], None] | None = None,
                 documents: DocumentService | None = None):
        from kvlink_rag.adapter_registry import AdapterVariants

        self.engine, self.store, self.retrieval, self.model_lock = engine, store, retrieval, model_lock
        self.documents = documents if documents is not None else DocumentService(store, engine, retrieval)
        self.settings, self.on_result, self.scheduler = settings, on_result, scheduler
        self.variants = AdapterVariants(engine, settings.links_dir, settings.max_loaded_adapters)
        self.choice = DocumentChoice(store, retrieval, settings)

    # -- validation and document choice --------------------------------------------------------------
    def plan(self, tenant: str, question: str, document_ids: list[str] | None = None, top_k: int | None = None,
             k: int | None = None, adapter: str | None = None, mode: str = "linked", retention: float | None = None,
             explain: bool = False, recompute_ratio: float | None = None, required: bool = True,
             cutoff: tuple[float | None, float | None] = (None, None), attribution: str | None = None,
             **sampling) -> QueryPlan:
        """Check the limits and pick the documents; ``mode`` is one of :data:`MODES`; ``retention`` (0 < r <= 1,
        default the setting) is the fraction of each document's tokens kept; ``explain`` adds the attribution;
        ``attribution`` its method (``leave_one_out`` or ``attention``, default the setting);
        ``recompute_ratio`` (0..1, default the setting) the fraction of document tokens CacheBlend recomputes.
        ``cutoff`` is ``(min_relative_score, min_score)`` of retrieval (None: the settings). Without
        ``required``, a question that retrieves no document is planned without documents (a plain
        prompt: mode ``full`` with adapter ``none`` unless one is named; prefix and text shared through the
        prefix tree).

        Raises:
            ServiceError: 422 over a limit, contradictory fields, unknown mode, retention outside (0, 1] or
                explain with mode full, 400 unknown adapter, 404 unknown document ids or no document matching.
            redis.exceptions.ConnectionError: retrieval needed the Redis index and it is down.
        """
        t0 = time.perf_counter()
        if mode not in MODES:
            raise ServiceError(422, "invalid_mode", f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        question = check_request(self.settings, question, document_ids, top_k, sampling.get("max_new_tokens"))
        sampling = check_generation(self.settings, sampling)
        check_explained(mode, retention, explain, attribution)
        check_recompute(mode, recompute_ratio, explain)
        self._check_links(k, adapter)
        docs = choose_documents(self.choice, tenant, question, document_ids, top_k, required, cutoff)
        if not docs:  # a plain prompt: nothing to link, explain or retain; the base model (no link-token LoRA)
            mode, explain, retention, recompute_ratio, adapter = "full", False, 1.0, 0.0, adapter or "none"
        plan = QueryPlan(tenant, question, docs, time.perf_counter() - t0, t0, k, adapter,
                         {k_: v for k_, v in sampling.items() if v is not None}, mode)
        plan.retention = self.settings.retention if retention is None else retention  # KVLINK_RAG_RETENTION
        plan.explain = explain
        plan.attribution = attribution or self.settings.attribution  # KVLINK_RAG_ATTRIBUTION
        plan.cold = mode == "full" and bool(docs) and not self.settings.full_mode_cached
        if mode == "linked" and not explain:  # KVLINK_RAG_RECOMPUTE_RATIO
            plan.recompute_ratio = self.settings.recompute_ratio if recompute_ratio is None else recompute_ratio
        return plan

    def plan_chat(self, tenant: str, turns: list, document_ids: list[str] | None = None, top_k: int | None = None,
                  k: int | None = None, adapter: str | None = None, mode: str = "linked", **sampling) -> QueryPlan:
        """:meth:`plan` for a conversation (``turns``: :class:`kvlink_rag.text.conversation.Turn`, in order): the
        last user message picks the documents (BM25), the whole conversation follows them in the prompt; when
        it retrieves none (no documents, none above the cut-off) the chat is a plain one without documents.

        Raises:
            ServiceError: 422 ``invalid_messages`` (no user message, unknown role, turns out of order, a
                message over its limit: user and system ``KVLINK_RAG_MAX_QUESTION_CHARS``, assistant 8x),
                and as :meth:`plan`.
        """
        from kvlink_rag.text.conversation import InvalidConversation, check_turns, conversation_ids

        try:
            talk = check_turns(turns)
        except InvalidConversation as e:
            raise ServiceError(422, "invalid_messages", str(e)) from None
        for i, t in enumerate(turns):
            limit = self.settings.max_question_chars * (8 if t.role == "assistant" else 1)
            if len(t.text) > limit:
                raise ServiceError(422, "message_too_long", f"messages[{i}] ({t.role}) has {len(t.text)} characters; "
                                   f"the limit is {limit}")
        plan = self.plan(tenant, talk[-1].text, document_ids, top_k, k, adapter, mode, required=False, **sampling)
        if len(talk) > 1 or len(talk) < len(turns):
            eng = self.engine
            plan.text_ids = conversation_ids(eng.template, eng.lm.tokenizer, turns).tolist()
        return plan

    def _check_links(self, k: int | None, adapter: str | None, load: bool = False) -> Engine | None:
        """Check ``adapter`` exists and fits the model and ``k`` is within its K (reads its file only).

        With ``load`` (under the model lock): the adapter's engine, its LoRA loaded into the model.
        """
        from kvlink_rag.adapter_registry import UnknownAdapter
        from kvlink_rag.linking.link_tokens import LinkTokensMismatch

        try:
            eng = self.variants.get(adapter) if load else None
            lt = eng.link_tokens if eng is not None else self.variants.check(adapter)
        except UnknownAdapter as e:
            raise ServiceError(404, "unknown_adapter", str(e)) from None  # a named resource, as document ids
        except LinkTokensMismatch as e:
            raise ServiceError(400, "adapter_mismatch", str(e)) from None
        loaded = lt.k if lt is not None else 0
        if k is not None and not 0 <= k <= loaded:
            raise ServiceError(422, "k_out_of_range", f"k (link tokens per document) must be within "
                               f"0..{loaded}, the number loaded (KVLINK_RAG_LINK_K or the adapter's K); got {k}")
        return eng

    # -- answering -----------------------------------------------------------------------------------
    def _request_engine(self, plan: QueryPlan) -> Engine:
        """The engine of the plan's adapter (loaded now: call under the model lock) with a recording cache.

        The adapter is checked again: its file may have been removed or rewritten since planning.
        """
        eng = copy.copy(self._check_links(plan.k, plan.adapter, load=True))  # the shared engines stay as they are
        cache = self.store.cache.for_tenant(plan.tenant)
        eng.cache = RecordingCache(cache, cache.shared_only)
        return eng

    def answer(self, plan: QueryPlan) -> QueryResult:
        """Generate the whole answer.

        Raises:
            ServiceError: 422 when the prompt does not fit the model (``ContextTooLong``), 400 when the
                adapter was removed or replaced by a foreign one since planning. Anything else is an
                internal error.
        """
        for _, result in self._events(plan, pieces=False):  # one item: ("done", result)
            pass
        return result

    def stream(self, plan: QueryPlan) -> Iterator[tuple[str, object]]:
        """Yield ``("token", text piece)`` as generated, then ``("done", QueryResult)``; a plan with
        ``logprobs`` also yields ``("logprobs", TokenLogprob)`` per token, before its piece.

        The model lock is held only inside the scheduler's steps; closing the generator early cancels the
        request (its KV is freed before the next step). Raises as :meth:`answer` (before the first token).
        """
        return self._events(plan, pieces=True)

    def _events(self, plan: QueryPlan, pieces: bool) -> Iterator[tuple[str, object]]:
        """:meth:`_generate`, its text cut at the plan's stop strings (:mod:`service.stopped`)."""
        from service.stopped import stopped_events

        stops = plan.sampling.get("stop")
        events = self._generate(plan, pieces)
        return stopped_events(events, stops, self.engine.lm.tokenizer) if stops else events

    def _generate(self, plan: QueryPlan, pieces: bool) -> Iterator[tuple[str, object]]:
        """Run the plan through the batching scheduler (linked, full, chat, retention, CacheBlend and explain
        alike): ``("token", piece)`` per text piece (with ``pieces``), then ``("done", QueryResult)``.

        The request's engine (its adapter loaded, a recording view of the tenant's cache) is made in the
        scheduler's thread when it is admitted; full prefill reports ``cache_load_s`` 0 and its prefill time
        as ``link_s``."""
        from service.explained import explanation
        from service.scheduled import answer_of, scheduled_tokens, stage_timings, token_pieces, token_sources

        made: list[Engine] = []

        def make_engine() -> Engine:  # in the scheduler's thread, under the model lock
            made.append(self._request_engine(plan))
            return made[-1]

        text_ids = plan.text_ids or self.engine.template.question_ids(self.engine.lm.tokenizer, plan.question).tolist()
        gen = scheduled_tokens(self.scheduler, self.engine, plan, make_engine, text_ids)
        result = yield from token_pieces(gen, self.engine.lm.tokenizer, pieces)
        ans = answer_of(result, self.engine.lm.tokenizer)
        done = self._finish(plan, made[-1], ans, stage_timings(plan, result), result.tree_docs, result.cached_tokens,
                            token_sources(result, made[-1].cache))
        done.attribution = explanation(made[-1], plan, result.attention, ans.token_ids, self.model_lock)
        done.logprobs = result.logprobs
        yield "done", done

    def _finish(self, plan: QueryPlan, eng: Engine, ans: Answer, timings: dict[str, float],
                tree_docs: set[str] = frozenset(), cached_tokens: int = 0, sources: dict | None = None) -> QueryResult:
        keys = [eng.cache_keys(d.document) for d in plan.docs]  # a chunked document: all its chunks
        hits = [all(eng.cache.hits.get(key, False) or key in tree_docs for key in ks) for ks in keys]
        result = QueryResult(ans.text, ans.token_ids, plan.docs, hits, timings, ans.context_tokens,
                             ans.finish_reason, cached_tokens, token_sources=sources or {})
        if plan.mode == "full":  # a comparison that used no cache: no bookkeeping, no cache or TTFT metrics
            return result
        self._record(plan, hits, [next(filter(None, map(eng.cache.unstored.get, ks)), None) for ks in keys])
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _record(self, plan: QueryPlan, hits: list[bool], unstored: list[str | None]) -> None:
        """Bookkeeping after a query (best effort; skipped while the index is down): documents encoded on
        the spot become ``ready`` in the index (their cache is already stored, so this does not encode
        again), those too large for the store ``failed`` (with the reason; queries keep answering them
        uncached), hit counters of the others go up."""
        try:
            for d, hit, why in zip(plan.docs, hits, unstored, strict=True):
                if hit:
                    self.store.index.incr_hits(plan.tenant, d.doc_id)
                elif d.chunk is not None:  # one chunk encoded on the spot: the document's record stays as is
                    continue
                elif isinstance(why, BusyReason):  # not stored this time (the store was busy): left as it is
                    continue
                elif why is not None:
                    self.store.catalog.fail(plan.tenant, d.doc_id, d.version, why)
                else:
                    with self.model_lock:  # ready now; or the cache it wrote is dropped if d changed since
                        self.documents.adopt(plan.tenant, d.doc_id, d.version, d.document)
        except redis_errors() as e:
            log.warning("index unreachable; query bookkeeping skipped (%s)", e)
        except ValueError as e:  # the document was marked failed (e.g. its cache does not fit the store)
            log.warning("query bookkeeping: %s", e)
