"""The engine: one loaded model with its prompt framing, anchor prefix, link tokens and a document cache.

It is what the service, the workers and the CLI hold; the tensor work lives in ``document_prefill``,
``linker`` and ``generate``, the decode-and-time loop in ``answer``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Generator

import torch

from .answer import Answer, generate_answer, run_to_end
from .blend import check_recompute_ratio
from .cache import DocumentCache, MemoryCache
from .chunking import Chunker
from .doc_side import check_query_side, document_adapter, encode_with_adapter
from .document_prefill import encode_document, encode_prefix, encoding_fingerprint
from .generate import SamplingParams, full_prefill, stop_token_ids
from .link_tokens import LinkTokens, initial_link_tokens, load_link_tokens, shipped_link_tokens
from .lora import adapter_scope, add_lora
from .model import LoadedModel, load_model
from .prompt import PromptTemplate, has_special_text
from .retention import check_retention
from .reuse import ReuseInputs, reuse_method
from .runtime.model_runner import get_runner
from .settings import EngineSettings
from .types import ContextTooLong, Document, DocumentKV, LayeredDocuments, LinkedContext, RetainedKV


class Engine:
    """Precompute, link and generate with one model.

    Args:
        settings: engine settings (encoding, K, dtypes, sampling defaults).
        lm: an already loaded model (tests); loaded from ``settings.model`` if None.
        cache: document cache; an in-memory one if None.
    Raises:
        ValueError: bad settings; kvlink_rag.link_tokens.LinkTokensMismatch: link tokens for another model.
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
        self.doc_adapter: str | None = None  # a document-side artifact's adapter (kvlink_rag.doc_side), eval only
        self.stop_ids = stop_token_ids(tok)
        self.min_question_tokens = self.template.min_question_tokens(tok)
        self.cache: DocumentCache = cache if cache is not None else MemoryCache()
        self.chunker = Chunker(lambda text, title: int(self.document_ids(Document(text, title)).numel()),
                               settings.chunk_tokens)

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
        eng.chunker = Chunker(self.chunker.count, chunk_tokens)
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
                     targets=tuple(cfg.get("targets", ("q_proj", "k_proj", "v_proj", "o_proj"))), state=lt.lora)
        return name

    # -- documents -------------------------------------------------------------------------------
    def document_ids(self, doc: Document) -> torch.Tensor:
        """``[tokens]`` int64 ids of ``doc`` tokenised alone. Raises ValueError if empty."""
        return self.template.document_ids(self.lm.tokenizer, doc.text, doc.title)

    def cache_key(self, doc: Document, cache: DocumentCache | None = None) -> str:
        """Exact key of a document's cache: encoding fingerprint and the hash of its exact prompt text.

        Args:
            cache: the cache whose keys to make (e.g. one tenant's view of the store); default this
                engine's cache.

        A text holding a special token's string gets a salted key: its ids changed when user text stopped
        being parsed for special tokens, so a cache stored before must not be reused.
        """
        text = self.template.document_text(doc.text, doc.title)
        salt = "|plain-user-text" if has_special_text(self.lm.tokenizer, text) else ""
        return (cache if cache is not None else self.cache).key(self.fingerprint + salt, text)

    def chunks(self, doc: Document) -> list[Document]:
        """``doc``'s chunks in order (:mod:`kvlink_rag.chunking`): ``[doc]`` when it fits ``chunk_tokens`` (or
        chunking is off), else pieces of at most ``chunk_tokens`` framed tokens, each cached under its own key.

        Raises:
            ValueError: empty document.
        """
        return self.chunker(doc)

    def expand(self, docs: list[Document]) -> list[Document]:
        """The slots of ``docs``: each document's :meth:`chunks` in order (link tokens follow every chunk)."""
        return [c for d in docs for c in self.chunks(d)]

    def cache_keys(self, doc: Document, cache: DocumentCache | None = None) -> list[str]:
        """The keys of ``doc``'s chunk caches (one key, :meth:`cache_key`, for a document that is not chunked)."""
        return [self.cache_key(c, cache) for c in self.chunks(doc)]

    def linked_tokens(self, doc: Document) -> int:
        """Positions ``doc`` takes in a linked prompt before its last K link tokens: its framed ids, or for a
        chunked document its chunks' ids and the K link tokens between them (compare with
        :meth:`max_document_tokens`). Raises ValueError: empty document."""
        chunks = self.chunks(doc)
        return sum(int(self.document_ids(c).numel()) for c in chunks) + self.link_k * (len(chunks) - 1)

    def warm(self, doc: Document) -> bool:
        """Encode and cache whichever of ``doc``'s chunks are not cached; True when all were cached already."""
        return all([self.get_or_encode(c)[1] for c in self.chunks(doc)])

    def max_document_tokens(self) -> int:
        """Longest document (tokens, framing included) that can still be asked about alone.

        The model's context (``max_position_embeddings``) less the anchor prefix, the K link tokens after
        the document, the shortest question with the assistant header and one new token. At most 0 when
        nothing fits.
        """
        return self.lm.max_positions - self.prefix.num_tokens - self.link_k - self.min_question_tokens - 1

    @property
    def link_k(self) -> int:
        """Link tokens per document (0 without link tokens)."""
        return self.link_tokens.k if self.link_tokens is not None else 0

    def document_budget_text(self) -> str:
        """How :meth:`max_document_tokens` is made up, for error messages."""
        return (f"the model's context of {self.lm.max_positions} positions less the {self.prefix.num_tokens}-token "
                f"prefix, {self.link_k} link tokens, a question of at least {self.min_question_tokens} tokens and "
                "1 new token")

    def check_document_tokens(self, n: int) -> None:
        """Raises ContextTooLong when a document of ``n`` tokens can never be asked about."""
        limit = self.max_document_tokens()
        if n > limit:
            raise ContextTooLong(f"document has {n} tokens; the longest this model can answer over is {limit} "
                                 f"({self.document_budget_text()})")

    def encode(self, doc: Document) -> DocumentKV:
        """Precompute ``doc``'s position-free KV.

        Runs under no_grad (not inference mode) so that training can attend to the result.

        Raises:
            ValueError: empty document. ContextTooLong: longer than :meth:`max_document_tokens`.
        """
        ids = self.document_ids(doc)
        self.check_document_tokens(int(ids.numel()))
        if self.doc_adapter is not None:
            with torch.no_grad():
                return encode_with_adapter(self.lm, ids, self.doc_adapter,
                                           prefix=self.prefix if self.anchored else None,
                                           kv_dtype=self.settings.kv_dtype, fingerprint=self.fingerprint)
        return encode_document(self.lm, ids, kv_dtype=self.settings.kv_dtype,
                               prefix=self.prefix if self.anchored else None, fingerprint=self.fingerprint,
                               importance=self.settings.importance_scores)

    def get_or_encode(self, doc: Document) -> tuple[DocumentKV, bool]:
        """The cached KV of ``doc`` (hit=True) or a fresh encoding stored in the cache (hit=False)."""
        key = self.cache_key(doc)
        kv = self.cache.get(key)
        if kv is not None and kv.fingerprint == self.fingerprint:
            return kv, True
        kv = self.encode(doc)
        self.cache.put(key, kv)
        return kv, False

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
                (:mod:`kvlink_rag.blend`; default the setting, 0 = reuse only).
        Raises:
            ValueError: no documents, empty question, retention outside (0, 1], recompute_ratio outside [0, 1].
            ContextTooLong: the prompt leaves no position for a new token (the counts in the message).
        """
        r, rr = self.retention(retention), self.recompute_ratio(recompute_ratio)
        if not docs:
            raise ValueError("at least one document is required")
        docs = self.expand(docs)  # a long document takes one slot per chunk
        q_ids = self.template.question_ids(self.lm.tokenizer, question)
        embeds = None
        if self.link_tokens is not None and (k is None or k > 0):
            embeds = self.link_tokens.embeds[..., : (k or self.link_tokens.k), :]  # [(S,) K, hidden]
        t0 = time.perf_counter()
        source, found = self.resolve_documents(docs, r, method)
        hits = sum(found)
        lookup_s = time.perf_counter() - t0
        try:
            with torch.inference_mode(), adapter_scope(self.lm, self.adapter):
                ctx = self._link(docs, source, embeds, q_ids, rr)
        except LookupError:  # a stored record vanished or failed its checksum mid-stream: encode instead
            kvs = LayeredDocuments.from_documents([self.get_or_encode(d)[0] for d in docs], r, method)
            with torch.inference_mode(), adapter_scope(self.lm, self.adapter):
                ctx = self._link(docs, kvs, embeds, q_ids, rr)
            hits = 0
        ctx.timings.load_s += lookup_s
        return ctx, hits

    def _link(self, docs: list[Document], source, embeds, q_ids: torch.Tensor, recompute_ratio: float) -> LinkedContext:
        """The context of the request's reuse method (:mod:`kvlink_rag.reuse`: link tokens, or with a recompute
        ratio above 0 CacheBlend over the same caches and link tokens)."""
        ids = [self.document_ids(d) for d in docs] if recompute_ratio > 0 else []
        inputs = ReuseInputs(self.lm, self.prefix, source, ids, embeds, q_ids, self.anchored, new_tokens=1)
        return reuse_method(recompute_ratio).context(inputs)

    def resolve_documents(self, docs: list[Document], retention: float = 1.0, method: str = "importance"
                          ) -> tuple[list[DocumentKV] | LayeredDocuments, list[bool]]:
        """Documents as a link source at ``retention`` (slot order) and, per document, whether it was a cache
        hit (:meth:`DocumentCache.resolve`); the linker's and the batching scheduler's way to the caches.

        Documents in memory are used in place, stored ones (e.g. only in LMDB) are streamed layer by layer
        (prefetch overlapping the linker), and missing ones (or cached under another fingerprint) are
        encoded now, once per key, and put in the cache. A memory tier holding a document at a lower retention
        (the cold tier) serves it only when it holds every token ``retention`` keeps; else it is read as stored.
        """
        keys = [self.cache_key(d) for d in docs]
        items = [None if isinstance(it, (DocumentKV, RetainedKV)) and it.fingerprint != self.fingerprint else it
                 for it in self.cache.resolve(keys, retention, method)]
        hits = [it is not None for it in items]
        encoded: dict[str, DocumentKV] = {}
        for i, (d, it) in enumerate(zip(docs, items)):
            if it is None:
                if keys[i] not in encoded:
                    encoded[keys[i]] = self.encode(d)
                    self.cache.put(keys[i], encoded[keys[i]])
                items[i] = encoded[keys[i]]
        if any(isinstance(it, str) for it in items):
            try:
                return self.cache.stream(items, retention, method), hits
            except LookupError:
                items, hits = [self.get_or_encode(d)[0] for d in docs], [False] * len(docs)
        if retention < 1.0:
            return LayeredDocuments.from_documents(items, retention, method), hits
        return items, hits

    def generate(self, ctx: LinkedContext, params: SamplingParams, t0: float, hits: int = 0,
                 pieces: bool = True) -> Generator[str, None, Answer]:
        """Decode from ``ctx`` under this engine's adapter (:func:`kvlink_rag.answer.generate_answer`, the one
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
        with torch.inference_mode(), adapter_scope(self.lm, self.adapter):
            return full_prefill(self.lm, self.prompt_ids(question, docs), new_tokens=1)

    def stream(self, question: str, docs: list[Document], k: int | None = None, retention: float | None = None,
               **sampling) -> Generator[str, None, Answer]:
        """Text pieces of the linked answer as they are generated; returns the :class:`Answer`."""
        t0 = time.perf_counter()
        ctx, hits = self.link_context(question, docs, k, retention)
        return (yield from self.generate(ctx, self.sampling(**sampling), t0, hits))

