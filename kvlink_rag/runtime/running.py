"""A request inside the batching scheduler: its prompt layout, prefix-tree match, KV and sampling state.

:func:`admit` builds it (layout, longest stored prefix, the cached KV appended, the prefill left to
compute); the scheduler then packs :meth:`RunningRequest.next_inputs` of many requests into one
:class:`~kvlink_rag.runtime.ragged.RaggedBatch` forward and hands each its logits with :meth:`RunningRequest.step`.
Token choice, budget and stop rules are those of :func:`kvlink_rag.decoding.generate.decode` (the same tokens for
the same logits and seed): the first token comes from the prefill's logits, each later one from a
one-token decode, and the last token sampled is never fed.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from ..decoding.generate import SamplingParams, sample_next, sampling_generator
from ..decoding.logprobs import TokenLogprob, token_logprob
from ..decoding.stop_strings import StopStrings
from ..engine import Engine
from ..explain.attention_rows import RowAttention
from ..linking.context import LinkedContext, Timings
from ..reuse.blend_stage import blend_prefill
from ..types import ContextTooLong, Document, LayeredDocuments
from .prefix_tree import Match, PrefixTree
from .ragged import KVChunk, mask_rows
from .request_layout import (PendingPrefill, RequestLayout, fill_cached, full_layout, linked_layout, new_sequence,
                             pending_prefill, prepare_tokens)


class RunningRequest:
    """State of one admitted request (see module docstring).

    Attributes:
        engine: the request's engine (adapter, link tokens, cache view).
        context: prefix-tree root key (mode, adapter, link tokens, K, encoding fingerprint).
        layout: items in storage order (grows with fed tokens).
        prompt_items: items of the prompt (before generation).
        seq: the KV (shared chunks, then own tokens).
        pending: inputs of the next forward (prefill, then one token per decode step), None when done.
        tokens: generated ids; finish_reason once finished.
        tree_tokens, tree_docs: what the prefix tree served.
        encoded_tokens: tokens of documents encoded now (cache misses).
        hit_sizes: cache key -> tokens of each document served from its stored cache (per-request accounting).
        cached_tokens: prompt tokens not computed for this request (prefix tree, prefix KV, stored caches).
        context_tokens: positions the prompt spans (retention's dropped tokens count).
        own_prompt: the prompt's KV stays the request's own (not put in the tree): retention, CacheBlend, explain.
        fixup: CacheBlend's :class:`~kvlink_rag.reuse.blend_stage.BlendFixup`, applied once the prefill is complete.
        attention: explain's :class:`~kvlink_rag.explain.attention_rows.RowAttention`, handed to the runner with each row.
        cold: computed without the prefix tree (mode ``full`` with documents, the comparison): nothing is
            read from it and its KV is not inserted.
    """

    def __init__(self, engine: Engine, context: Hashable, layout: RequestLayout, params: SamplingParams,
                 tree: PrefixTree):
        self.engine, self.context, self.layout, self.params, self.tree = engine, context, layout, params, tree
        self.prompt_items = len(layout.items)
        self.prompt_tokens = layout.num_tokens
        self.match: Match | None = None
        self.seq = None
        self.pending: PendingPrefill | None = None
        self.fed = 0  # tokens of ``pending`` already computed (chunked prefill)
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.tree_tokens, self.tree_docs = 0, set()
        self.encoded_tokens = self.cached_tokens = 0
        self.hit_sizes: dict[str, int] = {}
        self.shared = False
        self.cold = False
        self.logits: list[torch.Tensor] | None = None  # [vocab] float32 per step, when kept (verification)
        self.last_layer_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # with logits: the prompt's last layer
        self.generator = sampling_generator(params)
        self.budget = min(params.max_new_tokens, engine.lm.max_positions - layout.next_position)
        self.stops = StopStrings.of(engine.lm.tokenizer, params.stop)  # None without stop strings
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.matcher = params.grammar.matcher() if params.grammar is not None else None  # its own grammar state
        self.timings = {"load_s": 0.0, "prefill_s": 0.0}
        self.context_tokens = layout.next_position  # positions the prompt spans (retention: kept or not)
        self.own_prompt = False  # keep the prompt's KV to itself (retention, CacheBlend, explain: see admit)
        self.prompt_in_tree = False  # the prompt's KV was put in the prefix tree (its answer goes after it)
        self.fixup = None  # CacheBlend: fresh KV to put in place once the prefill is complete
        self.attention = None  # explain: kvlink_rag.explain.attention_rows.RowAttention over the answer's rows

    @property
    def adapter(self) -> str | None:
        return self.engine.adapter

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def pending_left(self) -> int:
        """Tokens of :attr:`pending` not yet computed (0 when finished)."""
        return 0 if self.pending is None else self.pending.num_tokens - self.fed

    def next_chunk(self, n: int) -> PendingPrefill:
        """The next ``n`` (at most :attr:`pending_left`) tokens of :attr:`pending` to compute, with their rows of
        its mask over every key up to the chunk's last token (chunked prefill: the same attention as one
        forward of the whole prefill, split across steps). :meth:`step` is called after the last chunk."""
        p, a = self.pending, self.fed
        b = min(p.num_tokens, a + n)
        self.fed = b
        if self.attention is not None:
            self.attention.chunk(a, b)
        return PendingPrefill(p.embeds[a:b], p.positions[a:b], mask_rows(p.mask, a, b))

    def step(self, logits: torch.Tensor) -> int | None:
        """Take the ``[vocab]`` logits after the last fed token; returns the token to emit (None when the
        request ended on a stop token). Sets :attr:`pending` to the token to feed, or finishes. With a grammar
        the logits are masked by the request's matcher before sampling (greedy or sampled); with ``logprobs``
        the emitted token's :class:`~kvlink_rag.decoding.logprobs.TokenLogprob` (of the unmasked logits) is appended to
        :attr:`logprobs`."""
        if self.fixup is not None:  # CacheBlend: the recomputed document tokens' KV into their slots
            self.fixup.apply(self.seq)
            self.fixup = None
        if self.logits is not None:
            self.logits.append(logits.detach().clone())
            if not self.shared:  # the prompt's last-layer KV, storage order: [kv_heads, prompt_tokens, head_dim]
                last = self.engine.lm.num_layers - 1
                pieces = list(self.seq.layer_kv(last))
                self.last_layer_kv = (torch.cat([k for k, _ in pieces], 1).clone(), torch.cat([v for _, v in pieces], 1).clone())
        if not self.shared:
            self.shared = True
            if self.attention is not None:
                self.attention.prompt_done()
            if not self.own_prompt and not self.cold:
                self._share_prompt()
        self.fed = 0
        masked = logits if self.matcher is None else self.matcher.mask(logits)
        tok = sample_next(masked, self.params, self.generator, len(self.tokens))
        if self.matcher is not None:
            self.matcher.accept(tok)
        if tok in self.params.stop_token_ids:
            self.finish_reason, self.pending = "stop", None
            return None
        self.tokens.append(tok)
        if self.logprobs is not None:  # of the raw logits (vLLM's default), before any mask
            self.logprobs.append(token_logprob(logits, tok, self.params.logprobs))
        if self.stops is not None and self.stops.push(tok):
            self.finish_reason, self.pending = "stop", None
        elif self.matcher is not None and self.matcher.finished:
            self.finish_reason, self.pending = "stop", None
        elif len(self.tokens) >= self.budget:
            self.finish_reason, self.pending = "length", None
        else:
            self.pending = prepare_tokens(self.engine.lm, [tok], self.layout.next_position)
            self.layout.append_text(tok)
        return tok

    def _share_prompt(self) -> None:
        """After the prefill: put the prompt's KV in the tree. The tree takes views of this request's buffers
        (nothing copied) and the request decodes on in them; when the tree already held the whole prompt
        (a concurrent request's), the request reads it from there instead and drops its own copy, so
        concurrent requests with the same prompt hold it once."""
        seq, n_items = self.seq, self.prompt_items
        start = self.match.tokens - seq.shared_tokens  # own tokens copied from the match (new_sequence)
        own = KVChunk(seq.keys[:, :, start: seq.length], seq.values[:, :, start: seq.length])
        stored = self.tree.insert(self.context, self.layout.items[:n_items], self.layout.sizes[:n_items], own,
                                  kv_from=self.match.items)
        self.prompt_in_tree = True
        if stored:
            seq.lent = seq.length - start
            return
        again = self.tree.match(self.context, self.layout.items[:n_items])
        if again.tokens == self.prompt_tokens:
            self.tree.release(self.match)
            self.match = again
            self.seq = new_sequence(self.engine.lm, again.chunks, max(self.budget, 1))
        else:
            self.tree.release(again)
            self.prompt_in_tree = False

    def explained(self) -> tuple | None:
        """With explain: ``(AttentionMass, LinkedContext)``, the mass collected and a context holding the
        prompt's layout (segments, ``[prompt slots]`` storage positions; no cache) for
        :func:`kvlink_rag.explain.answers.attribution`; else None."""
        if self.attention is None:
            return None
        lay = self.layout
        ctx = LinkedContext(cache=None, segments=lay.segments, storage_positions=lay.storage_positions(0, self.prompt_items),
                            next_position=self.context_tokens, last_logits=torch.zeros(0), timings=Timings())
        return self.attention.mass, ctx

    def finish(self) -> None:
        """Store the fed generated tokens' KV in the tree (the next turn of a chat finds them) and unpin."""
        if self.match is None:
            return
        seq = self.seq
        fed = len(self.layout.items)
        start = self.prompt_tokens - seq.shared_tokens  # own tokens of the prompt (before the answer's)
        if self.prompt_in_tree and seq.length > start and not self.cold:
            own = KVChunk(seq.keys[:, :, start: seq.length], seq.values[:, :, start: seq.length])  # views
            self.tree.insert(self.context, self.layout.items[:fed], self.layout.sizes[:fed], own,
                             kv_from=self.prompt_items)
        self.tree.release(self.match)
        self.match = None


def _fill(req: RunningRequest, todo: list[Document], retention: float = 1.0, source=None,
          hits: list[bool] | None = None) -> tuple[int, list[bool]]:
    """:func:`fill_cached` from the stored caches of ``todo`` (``source`` and ``hits``: already resolved at
    ``retention``); a record that vanished or failed its checksum while streaming is encoded instead (as
    :meth:`Engine.link_context` does). Returns the first item to compute and per-document cache hits."""
    eng, lay = req.engine, req.layout
    capacity = req.seq.keys.shape[2]
    if source is None:
        source, hits = eng.resolve_documents(todo, retention) if todo else (None, [])
    try:
        return fill_cached(eng.lm, lay, req.match.items, req.seq, eng.prefix, source), hits
    except LookupError:
        req.seq = new_sequence(eng.lm, req.match.chunks, capacity)
        kvs = [eng.get_or_encode(d)[0] for d in todo]
        kvs = LayeredDocuments.from_documents(kvs, retention) if retention < 1 else kvs
        return fill_cached(eng.lm, lay, req.match.items, req.seq, eng.prefix, kvs), [False] * len(todo)


def _too_long(lay: RequestLayout, max_positions: int) -> str:
    """The one-request paths' message (:func:`kvlink_rag.linking.linker.check_link_inputs`, ``full_prefill``)."""
    if not lay.linked:
        return (f"prompt of {lay.num_tokens} tokens plus 1 new token(s) exceeds the model's context of "
                f"{max_positions} positions")
    count = {kind: sum(s for k, s in zip(lay.kinds, lay.sizes) if k == kind) for kind in ("prefix", "doc", "link", "text")}
    count["doc"] = sum(s.length for s in lay.segments if s.kind == "document")  # retention: dropped tokens too
    n_docs = sum(k == "doc" for k in lay.kinds)
    return (f"the prompt needs {lay.next_position} tokens (prefix {count['prefix']}, {n_docs} documents {count['doc']}, "
            f"link tokens {count['link']}, question {count['text']}) plus 1 new token(s); the model's context holds "
            f"{max_positions}")


def context_key(eng: Engine, mode: str, k: int) -> tuple:
    """Prefix-tree root of a request: KV is shared only under the same mode, adapter, link tokens and K."""
    links = eng.link_tokens.identity() if eng.link_tokens is not None and k else None
    return (mode, eng.adapter, links, k, eng.fingerprint)


def _layout(eng: Engine, docs: list[Document], text_ids: list[int], mode: str, k: int,
            kept: list[torch.Tensor] | None = None) -> RequestLayout:
    if mode == "plain":  # a raw prompt (legacy completions): the ids alone, no system prompt
        return full_layout(list(text_ids))
    prefix_ids = eng.prefix.token_ids.tolist()
    if mode == "full":
        ids = prefix_ids + [t for d in docs for t in eng.document_ids(d).tolist()] + list(text_ids)
        return full_layout(ids)
    keys = [eng.cache_key(d) for d in docs]
    lens = [int(eng.document_ids(d).numel()) for d in docs]
    return linked_layout(prefix_ids, keys, lens, k, list(text_ids), eng.anchored, kept)


@dataclass(frozen=True)
class Reuse:
    """How a linked request reuses its documents beyond link tokens.

    Attributes:
        retention: fraction of each document's tokens kept (0 < r <= 1; :mod:`kvlink_rag.retention`).
        recompute_ratio: CacheBlend's fraction of document tokens recomputed (:mod:`kvlink_rag.reuse.blend_stage`).
        explain: collect the answer's attention over the slots (:mod:`kvlink_rag.explain.attention_rows`).
    """

    retention: float = 1.0
    recompute_ratio: float = 0.0
    explain: bool = False

    @property
    def own(self) -> bool:
        """The request computes its documents' part itself: it matches only the system prompt in the prefix
        tree (a retained or blended cache differs from the shared one; explain counts every question row)
        and keeps its prompt out of the tree."""
        return self.retention < 1.0 or self.recompute_ratio > 0 or self.explain


def admit(eng: Engine, tree: PrefixTree, docs: list[Document], text_ids: list[int], params: SamplingParams,
          mode: str = "linked", k: int | None = None, reuse: Reuse = Reuse(), cold: bool = False) -> RunningRequest:
    """Lay out, match in ``tree`` and prepare a request (call under the model lock); ``mode`` is ``linked``,
    ``full`` (system prompt, documents and text prefilled) or ``plain`` (``text_ids`` alone, no documents);
    ``reuse`` (linked only): retention, CacheBlend recompute and explain. ``cold``: computed without the
    prefix tree (no read, no insert; ``cached_tokens`` 0): the service asks it for mode ``full`` with
    documents, the comparison with linking (KVLINK_RAG_FULL_MODE_CACHED).

    Raises:
        ValueError: linked mode without documents, empty text.
        ContextTooLong: the prompt leaves no position for a new token (counts in the message).
    """
    if not text_ids:
        raise ValueError("question is empty")
    if mode == "linked" and not docs:
        raise ValueError("at least one document is required to link (a question alone has no documents)")
    docs = eng.expand(docs)  # a long document takes one slot per chunk (kvlink_rag.text.chunking)
    k_used = 0 if eng.link_tokens is None or mode != "linked" else (eng.link_tokens.k if k is None else k)
    own = mode == "linked" and reuse.own
    source = found = None
    t0 = time.perf_counter()
    if own and reuse.retention < 1.0:  # the kept tokens (stored importance order) make the layout
        source, found = eng.resolve_documents(docs, reuse.retention)
    kept = None if source is None else [source.offsets(j) for j in range(len(docs))]
    lay = _layout(eng, docs, text_ids, mode, k_used, kept)
    if lay.next_position + 1 > eng.lm.max_positions:
        raise ContextTooLong(_too_long(lay, eng.lm.max_positions))
    req = RunningRequest(eng, context_key(eng, mode, k_used), lay, params, tree)
    req.own_prompt, req.cold = own, cold
    # the last prompt item is always computed; a cold request matches nothing
    req.match = Match([], 0, 0, None) if cold else tree.match(req.context, lay.items[: lay.kinds.count("prefix") if own else -1])
    req.tree_tokens = req.match.tokens
    req.tree_docs = {it[1] for it in lay.items[: req.match.items] if isinstance(it, tuple) and it[0] == "doc"}
    req.seq = new_sequence(eng.lm, req.match.chunks, lay.num_tokens - req.match.tokens + req.budget + 1)
    doc_items = [j for j, kind in enumerate(lay.kinds) if kind == "doc"]
    todo_items = [j for j in doc_items if j >= req.match.items]
    todo = [d for d, j in zip(docs, doc_items) if j >= req.match.items]
    try:
        start, hits = _fill(req, todo, reuse.retention, source, found) if mode == "linked" else (req.match.items, [])
    except BaseException:  # e.g. the request was cancelled while loading: unpin its prefix-tree path
        tree.release(req.match)
        raise
    req.encoded_tokens = sum(lay.sizes[j] for j, hit in zip(todo_items, hits) if not hit)
    req.hit_sizes = {lay.items[j][1]: lay.sizes[j] for j, hit in zip(todo_items, hits) if hit}
    req.timings["load_s"] = time.perf_counter() - t0 if mode == "linked" else 0.0
    embeds = eng.link_tokens.embeds[..., :k_used, :] if k_used else None
    req.pending = pending_prefill(eng.lm, lay, start, embeds)
    if own and reuse.recompute_ratio > 0:  # CacheBlend: the selected document tokens join the prefill
        ids = [eng.document_ids(d) for d in docs]
        req.pending, req.fixup = blend_prefill(eng.lm, lay, start, req.seq, eng.prefix, ids, embeds, req.pending,
                                               reuse.recompute_ratio)
    if own and reuse.explain:  # the link tokens come first in the prefill and are not counted
        req.attention = RowAttention(sum(lay.sizes[j] for j in range(start, len(lay.items)) if lay.kinds[j] == "link"))
    req.cached_tokens = lay.num_tokens - req.pending.num_tokens - req.encoded_tokens
    return req
