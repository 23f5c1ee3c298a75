"""The engine: one loaded model with its prompt framing, anchor prefix, link tokens and a document cache.

It is what the service, the workers and the CLI hold. Its documents (ids, keys, chunks, encoding,
resolution to cached KV) are :class:`~kvlink_rag.engine_documents.EngineDocuments`; the tensor work lives in
``linking/`` (precompute, linker), ``reuse/`` (the request's reuse method) and ``decoding/`` (generation,
the decode-and-time loop).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Generator

import torch

from .cache import DocumentCache, MemoryCache
from .decoding.answer import Answer, generate_answer, run_to_end
from .decoding.generate import SamplingParams, full_prefill, stop_token_ids
from .engine_documents import EngineDocuments
from .linking.context import LinkedContext
from .linking.document_prefill import encode_prefix, encoding_fingerprint
from .linking.link_tokens import LinkTokens, initial_link_tokens, load_link_tokens, shipped_link_tokens
from .model.loader import LoadedModel, load_model
from .model.lora import add_lora, forward_scope
from .retention import check_retention
from .reuse.blend import check_recompute_ratio
from .reuse.doc_side import check_query_side, document_adapter
from .reuse.methods import ReuseInputs, reuse_method
from .runtime.hf_cache import runs_on_runner
from .runtime.model_runner import get_runner
from .settings import EngineSettings
from .text.chunking import Chunker
from .text.prompt import PromptTemplate
from .types import Document, LayeredDocuments

class Engine(EngineDocuments):
    """Precompute, link and generate with one model.

    Args:
        settings: engine settings (encoding, K, dtypes, sampling defaults).
        lm: an already loaded model (tests); loaded from ``settings.model`` if None.
        cache: document cache; an in-memory one if None.
    Raises:
        ValueError: bad settings; kvlink_rag.linking.link_tokens.LinkTokensMismatch: link tokens for another model.
    """

    def __init__(self, settings: EngineSettings, lm: LoadedModel | None = None, cache: DocumentCache | None = None):
        self.settings = settings
        self.lm = lm if lm is not None else load_model(settings)
        get_runner(self.lm)  # the runner's fused (and converted) weights now, not in the first request's TTFT
        tok = self.lm.tokenizer
        self.template = PromptTemplate.from_tokenizer(tok, settings.system_prompt)
        self.prefix = encode_prefix(self.lm, self.template.prefix_ids(tok))
        self.anchored = settings.encoding == "anchored"
        self.fingerprint = encoding_fingerprint(self.lm.fingerprint, settings.encoding, self.prefix,
                                                settings.kv_dtype)
        self.link_tokens = self._load_link_tokens()
        self.adapter = self._load_adapter()
        get_runner(self.lm).prepare(self.adapter)  # its merged prefill weights too, not in the first linked TTFT
        self.doc_adapter: str | None = None  # a document-side artifact's adapter (kvlink_rag.reuse.doc_side), eval only
        self.stop_ids = stop_token_ids(tok)
        self.min_question_tokens = self.template.min_question_tokens(tok)
        self.cache: DocumentCache = cache if cache is not None else MemoryCache()
        self.token_memo = functools.lru_cache(maxsize=4096)(
            lambda text, title, framed=True: self.template.document_ids(tok, text, title, framed))
        self.chunker = Chunker(lambda text, title: int(self.document_ids(Document(text, title)).numel()),
                               settings.chunk_tokens, context=settings.chunk_window)

    def _load_link_tokens(self) -> LinkTokens | None:
        if self.settings.link_k == 0:
            return None
        if self.settings.link_tokens_path is not None:
            lt = load_link_tokens(self.settings.link_tokens_path, self.lm)
            check_query_side(lt, str(self.settings.link_tokens_path))
            return lt
        if self.settings.shipped_links:
            shipped = shipped_link_tokens(self.lm)
            if shipped is not None and shipped.k == self.settings.link_k:
                return shipped
        return initial_link_tokens(self.lm, self.settings.link_k)

    def with_link_tokens(self, link_tokens: LinkTokens | None, adapter: bool = True) -> Engine:
        """A shallow copy using ``link_tokens`` (and their query-side LoRA unless ``adapter`` is False),
        sharing this engine's model, prefix and document cache: documents are never re-encoded."""
        eng = copy.copy(self)
        eng.link_tokens = link_tokens
        eng.adapter = eng._load_adapter() if adapter else None
        eng.doc_adapter, eng.fingerprint = document_adapter(eng)  # document-side: own caches, adapter on
        return eng

    def with_chunk_tokens(self, chunk_tokens: int) -> Engine:
        """A shallow copy that chunks documents at ``chunk_tokens`` (0 = never), sharing this engine's model,
        prefix, link tokens and document cache. Raises ValueError: 0 < chunk_tokens < 64."""
        eng = copy.copy(self)
        eng.chunker = Chunker(self.chunker.count, chunk_tokens, context=self.chunker.context)
        return eng

    def _load_adapter(self) -> str | None:
        """Inject the link tokens' query-side LoRA (if any) into the shared model; returns its name."""
        lt = self.link_tokens
        if lt is None or not lt.lora:
            return None
        name = "q" + lt.identity()
        if name not in self.lm.adapters:
            cfg = lt.lora_config or {}
            add_lora(self.lm, name, rank=int(cfg.get("rank", 16)), alpha=int(cfg.get("alpha", 32)),
                     targets=tuple(cfg.get("targets", self.lm.family.attention_targets)), state=lt.lora)
        return name

    # -- answering -------------------------------------------------------------------------------
    def sampling(self, ignore_eos: bool = False, **overrides) -> SamplingParams:
        """Sampling params from settings, with ``overrides`` (max_new_tokens, temperature, top_p, seed);
        ``ignore_eos`` generates all ``max_new_tokens`` (no stop token; vLLM's option, for benchmarks).
        Without a ``seed`` sampling is nondeterministic (:class:`SamplingParams`); greedy decoding never
        depends on it."""
        s = self.settings
        base = dict(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=None)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return SamplingParams(stop_token_ids=() if ignore_eos else self.stop_ids, **base)

    def prompt_ids(self, question: str, docs: list[Document]) -> torch.Tensor:
        """``[tokens]`` ids of the full prompt: prefix, documents, question (the same ids the linker uses)."""
        tok = self.lm.tokenizer
        parts = [self.prefix.token_ids] + [self.document_ids(d) for d in self.expand(docs)]
        return torch.cat(parts + [self.template.question_ids(tok, question)])

    def retention(self, retention: float | None) -> float:
        """The retention a query runs at: ``retention``, else the ``retention`` setting.

        Raises:
            ValueError: outside (0, 1].
        """
        return check_retention(self.settings.retention if retention is None else retention)

    def recompute_ratio(self, ratio: float | None) -> float:
        """The CacheBlend recompute ratio a query runs at: ``ratio``, else the ``recompute_ratio`` setting.

        Raises:
            ValueError: outside [0, 1].
        """
        return check_recompute_ratio(self.settings.recompute_ratio if ratio is None else ratio)

    def link_context(self, question: str, docs: list[Document], k: int | None = None, retention: float | None = None,
                     method: str = "importance", recompute_ratio: float | None = None) -> tuple[LinkedContext, int]:
        """Linked context for ``question`` over ``docs`` (cached or encoded now) and the number of cache hits
        (slots: a chunked document counts each of its chunks, :meth:`chunks`).

        Args:
            k: override the number of link tokens (0 = naive reuse); at most the loaded K.
            retention: fraction of each document's tokens kept (0 < r <= 1; default the setting), at their
                original positions (:mod:`kvlink_rag.retention`).
            method: which tokens retention keeps: ``importance`` (the service), ``random``, ``recency``.
            recompute_ratio: CacheBlend's fraction of document tokens recomputed in the joined context
                (:mod:`kvlink_rag.reuse.blend`; default the setting, 0 = reuse only).
        Raises:
            ValueError: no documents, empty question, retention outside (0, 1], recompute_ratio outside [0, 1].
            ContextTooLong: the prompt leaves no position for a new token (:meth:`check_fits`, before any document
                is encoded or stored; the counts in the message).
        """
        r, rr = self.retention(retention), self.recompute_ratio(recompute_ratio)
        if not docs:
            raise ValueError("at least one document is required")
        q_ids = self.template.question_ids(self.lm.tokenizer, question)
        embeds = None
        if self.link_tokens is not None and (k is None or k > 0):
            embeds = self.link_tokens.embeds[..., : (k or self.link_tokens.k), :]  # [(S,) K, hidden]
        self.check_fits(docs, int(q_ids.numel()), 0 if embeds is None else int(embeds.shape[-2]))  # before encoding
        docs = self.expand(docs)  # a long document takes one slot per chunk
        t0 = time.perf_counter()
        source, found = self.resolve_documents(docs, r, method)
        hits = sum(found)
        lookup_s = time.perf_counter() - t0
        try:
            with torch.inference_mode(), self._forward_scope(rr):
                ctx = self._link(docs, source, embeds, q_ids, rr)
        except LookupError:  # a stored record vanished or failed its checksum mid-stream: encode instead
            kvs = LayeredDocuments.from_documents([self.get_or_encode(d)[0] for d in docs], r, method)
            with torch.inference_mode(), self._forward_scope(rr):
                ctx = self._link(docs, kvs, embeds, q_ids, rr)
            hits = 0
        ctx.timings.load_s += lookup_s
        return ctx, hits

    def _forward_scope(self, recompute_ratio: float = 0.0):
        """The query-side adapter's scope for a link or full-prefill forward (inside inference mode): the runner alone
        runs it unless CacheBlend recomputes (a transformers forward) or an attention capture is open (explain)."""
        return forward_scope(self.lm, self.adapter, recompute_ratio > 0 or not runs_on_runner())

    def _link(self, docs: list[Document], source, embeds, q_ids: torch.Tensor, recompute_ratio: float) -> LinkedContext:
        """The context of the request's reuse method (:mod:`kvlink_rag.reuse.methods`: link tokens, or with a recompute
        ratio above 0 CacheBlend over the same caches and link tokens)."""
        ids = [self.document_ids(d) for d in docs] if recompute_ratio > 0 else []
        inputs = ReuseInputs(self.lm, self.prefix, source, ids, embeds, q_ids, self.anchored, new_tokens=1,
                             joined=self.joins(docs))
        return reuse_method(recompute_ratio).context(inputs)

    def generate(self, ctx: LinkedContext, params: SamplingParams, t0: float, hits: int = 0,
                 pieces: bool = True) -> Generator[str, None, Answer]:
        """Decode from ``ctx`` under this engine's adapter (:func:`kvlink_rag.decoding.answer.generate_answer`, the one
        decode-and-time loop): yields text pieces (none when ``pieces`` is False), returns the :class:`Answer`."""
        return (yield from generate_answer(self.lm, self.adapter, ctx, params, t0, hits, pieces))

    def finish(self, ctx: LinkedContext, params: SamplingParams, t0: float, hits: int = 0) -> Answer:
        """The whole answer from ``ctx`` (:meth:`generate` run to its end, no text pieces)."""
        return run_to_end(self.generate(ctx, params, t0, hits, pieces=False))

    def answer(self, question: str, docs: list[Document], k: int | None = None, retention: float | None = None,
               recompute_ratio: float | None = None, **sampling) -> Answer:
        """Answer from reused document caches, re-linked with link tokens (KVLink), keeping ``retention`` of
        each document's tokens and recomputing ``recompute_ratio`` of them (CacheBlend; defaults the settings)."""
        t0 = time.perf_counter()
        ctx, hits = self.link_context(question, docs, k, retention, recompute_ratio=recompute_ratio)
        return self.finish(ctx, self.sampling(**sampling), t0, hits)

    def answer_full(self, question: str, docs: list[Document], **sampling) -> Answer:
        """Answer with ordinary full prefill of the same prompt ids (the baseline).

        Raises:
            ValueError: no documents, empty question. ContextTooLong: no position left for a new token.
        """
        t0 = time.perf_counter()
        return self.finish(self.full_context(question, docs), self.sampling(**sampling), t0)

    def full_context(self, question: str, docs: list[Document]) -> LinkedContext:
        """Context of ordinary full prefill of :meth:`prompt_ids` (under this engine's adapter); no cache used.

        Raises:
            ContextTooLong: no position left for a new token.
        """
        with torch.inference_mode(), self._forward_scope():
            return full_prefill(self.lm, self.prompt_ids(question, docs), new_tokens=1)

    def stream(self, question: str, docs: list[Document], k: int | None = None, retention: float | None = None,
               **sampling) -> Generator[str, None, Answer]:
        """Text pieces of the linked answer as they are generated; returns the :class:`Answer`."""
        t0 = time.perf_counter()
        ctx, hits = self.link_context(question, docs, k, retention)
        return (yield from self.generate(ctx, self.sampling(**sampling), t0, hits))

