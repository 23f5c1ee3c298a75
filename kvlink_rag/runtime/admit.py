"""Admitting a request to the batching scheduler: its layout, the longest stored prefix in the prefix tree, the
cached document KV appended, the prefill left to compute (:func:`admit`, called by the scheduler under the
model lock); the :class:`~kvlink_rag.runtime.running.RunningRequest` it returns then runs step by step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..decoding.generate import SamplingParams
from ..engine import Engine
from ..explain.attention_rows import RowAttention
from ..reuse.methods import ScheduledInputs, reuse_method
from ..types import ContextTooLong, Document, LayeredDocuments
from .prefix_tree import Match, PrefixTree
from .request_layout import RequestLayout, fill_cached, full_layout, linked_layout, new_sequence, pending_prefill
from .running import RunningRequest


def _fill(req: RunningRequest, todo: list[Document], retention: float = 1.0, source=None,
          hits: list[bool] | None = None) -> tuple[int, list[bool]]:
    """:func:`fill_cached` from the stored caches of ``todo`` (``source`` and ``hits``: already resolved at
    ``retention``); a record that vanished or failed its checksum while streaming is encoded instead (as
    :meth:`Engine.link_context` does). Returns the first item to compute and per-document cache hits."""
    eng, lay = req.engine, req.layout
    capacity = req.seq.capacity
    if source is None:
        source, hits = eng.resolve_documents(todo, retention) if todo else (None, [])
    try:
        return fill_cached(eng.lm, lay, req.match.items, req.seq, eng.prefix, source), hits
    except LookupError:
        req.seq.release()
        req.seq = new_sequence(eng.lm, req.match.chunks, capacity)
        kvs = [eng.get_or_encode(d)[0] for d in todo]
        kvs = LayeredDocuments.from_documents(kvs, retention) if retention < 1 else kvs
        return fill_cached(eng.lm, lay, req.match.items, req.seq, eng.prefix, kvs), [False] * len(todo)


def _too_long(lay: RequestLayout, max_positions: int) -> str:
    """The one-request full prefill's message (``full_prefill``); a linked prompt is refused before its layout
    (:meth:`~kvlink_rag.engine_documents.EngineDocuments.check_fits`, the linker's counts)."""
    return (f"prompt of {lay.next_position} tokens plus 1 new token(s) exceeds the model's context of "
            f"{max_positions} positions")


def context_key(eng: Engine, mode: str, k: int) -> tuple:
    """Prefix-tree root of a request: KV is shared only under the same mode, adapter, link tokens, K and chunk
    layout (``chunk_links``: where a document's slots sit depends on it)."""
    links = eng.link_tokens.identity() if eng.link_tokens is not None and k else None
    return (mode, eng.adapter, links, k, eng.fingerprint, eng.settings.chunk_links)


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
    return linked_layout(prefix_ids, keys, lens, k, list(text_ids), eng.anchored, kept, eng.joins(docs))


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


def _prefill(req: RunningRequest, docs: list[Document], start: int, embeds: torch.Tensor | None, ratio: float):
    """The request's prefill from item ``start`` and its fixup: a linked request's from its reuse method (link
    tokens as laid out; CacheBlend adds the document tokens it recomputes), others' as laid out."""
    eng, lay = req.engine, req.layout
    pending = pending_prefill(eng.lm, lay, start, embeds)
    if not lay.linked:
        return pending, None
    return reuse_method(ratio).scheduled(ScheduledInputs(eng.lm, lay, start, req.seq, eng.prefix, docs,
                                                         eng.document_ids, embeds, pending))


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
    k_used = 0 if eng.link_tokens is None or mode != "linked" else (eng.link_tokens.k if k is None else k)
    if mode == "linked":  # from token counts, before a document's cache is read or encoded (retention reads first)
        eng.check_fits(docs, len(text_ids), k_used)
    docs = eng.expand(docs)  # a long document takes one slot per chunk (kvlink_rag.text.chunking)
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
    doc_items = [j for j, kind in enumerate(lay.kinds) if kind == "doc"]
    todo_items = [j for j in doc_items if j >= req.match.items]
    todo = [d for d, j in zip(docs, doc_items) if j >= req.match.items]
    try:  # a full pool (the scheduler retries later) or a cancel while loading: unpin, give the blocks back
        req.seq = new_sequence(eng.lm, req.match.chunks, lay.num_tokens - req.match.tokens + req.budget + 1)
        start, hits = _fill(req, todo, reuse.retention, source, found) if mode == "linked" else (req.match.items, [])
    except BaseException:
        tree.release(req.match)
        if req.seq is not None:
            req.seq.release()
        raise
    req.encoded_tokens = sum(lay.sizes[j] for j, hit in zip(todo_items, hits) if not hit)
    req.hit_sizes = {lay.items[j][1]: lay.sizes[j] for j, hit in zip(todo_items, hits) if hit}
    req.timings["load_s"] = time.perf_counter() - t0 if mode == "linked" else 0.0
    embeds = eng.link_tokens.embeds[..., :k_used, :] if k_used else None
    req.pending, req.fixup = _prefill(req, docs, start, embeds, reuse.recompute_ratio if own else 0.0)
    if own and reuse.explain:  # the link tokens come first in the prefill and are not counted
        req.attention = RowAttention(sum(lay.sizes[j] for j in range(start, len(lay.items)) if lay.kinds[j] == "link"))
    req.cached_tokens = lay.num_tokens - req.pending.num_tokens - req.encoded_tokens
    return req
