"""The linker: stored document caches + RoPE at their new offsets + fresh link tokens -> one KV cache.

KVLink (Yang et al., 2025, arXiv 2502.16002), section 3: documents' keys are re-rotated at the positions
they take in the concatenated context, K trainable link tokens follow each document and attend to
everything before them (repairing the missing cross-document attention), then the question attends to all.
Only link tokens and question tokens run through the model; one forward pass computes all of them.
"""

from __future__ import annotations

import time

import torch

from ..model.loader import LoadedModel
from ..runtime.hf_cache import cache_view, prefill, runs_on_runner
from ..runtime.kv_sequence import SequenceKV, pooled_sequence
from ..types import ContextTooLong, DocumentKV, LayeredDocuments
from .context import LinkedContext, PrefixKV, Segment, Timings
from .kvcache import build_cache
from .mask import additive, allowed
from .rope import apply_rope, rope_cos_sin
from .filled_kv import filled_layers, filled_sequence


def plan_layout(prefix_len: int, doc_lens: list[int], num_links: int, question_len: int,
                joined: list[bool] | None = None) -> list[Segment]:
    """Contiguous positions for ``[prefix][d1][L1]...[dN][LN][question]`` (lengths in tokens).

    ``num_links`` link tokens follow each document; link segments are omitted when it is 0, the prefix
    segment when ``prefix_len`` is 0, and after document ``i`` where ``joined[i]`` (the next slot is the chunk
    after it, encoded in its context: :meth:`kvlink_rag.engine_documents.EngineDocuments.joins`), so the two
    chunks sit side by side as in the whole document. A link segment's ``index`` is its document's slot.
    """
    segments = [Segment("prefix", -1, 0, prefix_len)] if prefix_len else []
    pos = prefix_len
    for i, n in enumerate(doc_lens):
        segments.append(Segment("document", i, pos, n))
        pos += n
        if num_links > 0 and not (joined and joined[i]):
            segments.append(Segment("link", i, pos, num_links))
            pos += num_links
    segments.append(Segment("question", -1, pos, question_len))
    return segments


def link_count(n_docs: int, joined: list[bool] | None) -> int:
    """Link segments in a layout of ``n_docs`` slots (one after each slot not joined to the next)."""
    return n_docs - sum(joined or [])


def _positions(segments: list[Segment], kinds: tuple[str, ...]) -> torch.Tensor:
    parts = [torch.arange(s.start, s.end) for s in segments if s.kind in kinds]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def slot_link_embeds(link_embeds: torch.Tensor, n_docs: int) -> list[torch.Tensor]:
    """The ``[K, hidden]`` link embeddings of each of ``n_docs`` slots: the same tensor for shared
    ``[K, hidden]`` link tokens; row ``min(i, S - 1)`` of per-slot ``[S, K, hidden]`` ones (slots past
    the last trained one reuse it)."""
    if link_embeds.dim() == 2:
        return [link_embeds] * n_docs
    return [link_embeds[min(i, link_embeds.shape[0] - 1)] for i in range(n_docs)]


def segment_link_embeds(link_embeds: torch.Tensor | None, segments: list[Segment]) -> list[torch.Tensor]:
    """``[K, hidden]`` link embeddings of each link segment of ``segments`` in order (its slot's, as
    :func:`slot_link_embeds`); empty without link segments or embeddings."""
    idx = [s.index for s in segments if s.kind == "link"]
    if link_embeds is None or not idx:
        return []
    slots = slot_link_embeds(link_embeds, max(idx) + 1)
    return [slots[i] for i in idx]


def check_link_inputs(lm: LoadedModel, prefix: PrefixKV | None, docs: LayeredDocuments,
                      link_embeds: torch.Tensor | None, question_ids: torch.Tensor, new_tokens: int = 0,
                      joined: list[bool] | None = None) -> int:
    """Validate inputs; returns the number of link tokens per document (0 without link tokens).

    Args:
        new_tokens: positions that must stay free after the question (generation).
        joined: per slot, no link tokens after it (:func:`plan_layout`); None: link tokens after every slot.
    Raises:
        ValueError: no documents, empty question, shape mismatch.
        ContextTooLong: prefix + documents + link tokens + question + ``new_tokens`` exceed the model's
            context (``max_position_embeddings``); the message gives every count.
    """
    if not docs.num_tokens:
        raise ValueError("at least one document is required to link (a question alone has no documents)")
    if question_ids.numel() == 0:
        raise ValueError("question is empty")
    if link_embeds is not None and link_embeds.dim() not in (2, 3):
        raise ValueError(f"link embeddings must be [K, hidden] or [slots, K, hidden], got {tuple(link_embeds.shape)}")
    num_links = 0 if link_embeds is None else int(link_embeds.shape[-2])
    if link_embeds is not None and link_embeds.shape[-1] != lm.config.hidden_size:
        raise ValueError(f"link embeddings have width {link_embeds.shape[-1]}, model hidden size is "
                         f"{lm.config.hidden_size}")
    n_docs = len(docs.num_tokens)
    p_len = prefix.num_tokens if prefix is not None else 0
    d_len, q_len = sum(docs.layout_lengths), int(question_ids.numel())  # dropped tokens keep their positions
    if joined is not None and len(joined) != n_docs:
        raise ValueError(f"joined has {len(joined)} entries for {n_docs} documents")
    links = num_links * link_count(n_docs, joined)
    total = p_len + d_len + links + q_len
    if total + new_tokens > lm.max_positions:
        raise ContextTooLong(
            f"the prompt needs {total} tokens (prefix {p_len}, {n_docs} documents {d_len}, link tokens {links}, "
            f"question {q_len}) plus {new_tokens} new token(s); the model's context holds {lm.max_positions}")
    return num_links


def document_positions(segments: list[Segment], docs: LayeredDocuments) -> torch.Tensor:
    """``[streamed document tokens]`` int64 layout positions of the documents' streamed tokens, in slot order:
    each document's segment start plus the offsets of its kept tokens (every offset at retention 1)."""
    starts = [s.start for s in segments if s.kind == "document"]
    parts = [start + docs.offsets(j) for j, start in enumerate(starts)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def rotate_documents(lm: LoadedModel, docs: LayeredDocuments, segments: list[Segment],
                     prefix: PrefixKV | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Re-apply RoPE to every document's keys at its layout offsets, layer by layer as layers arrive.

    Kept tokens of a partly retained document are rotated at their original offsets within its slot.
    Keeps the graph when the document KV requires grad (document-side training); otherwise nothing is
    recorded (stored caches never require grad; serving runs under inference mode).

    Returns:
        per-layer ``(keys, values)`` lists, each ``[kv_heads, prefix + streamed_doc_tokens, head_dim]`` in the
        compute dtype: the prefix, then the documents in slot order.
    """
    pos = document_positions(segments, docs).to(lm.device)
    cos, sin = rope_cos_sin(lm.rotary_emb, pos, torch.float32)
    if docs.fill is not None and lm.device.type == "cpu":
        return filled_layers(lm, docs, cos, sin, prefix)
    keys, values = [], []
    it = iter(docs.layers)
    for i in range(lm.num_layers):
        t0 = time.perf_counter()
        k_raw, v = next(it)  # k_raw, v: [kv_heads, doc_tokens_total, head_dim]
        docs.wait_s += time.perf_counter() - t0
        k = apply_rope(k_raw.to(lm.device, non_blocking=True).float(), cos, sin).to(lm.dtype)
        v = v.to(lm.device, lm.dtype, non_blocking=True)
        if prefix is not None:
            k = torch.cat([prefix.keys[i].to(lm.device, lm.dtype), k], dim=1)
            v = torch.cat([prefix.values[i].to(lm.device, lm.dtype), v], dim=1)
        keys.append(k)
        values.append(v)
    return keys, values


def _cached_kv(lm: LoadedModel, docs: LayeredDocuments, segments: list[Segment], prefix: PrefixKV | None,
               new_tokens: int | None, timings: Timings):
    """``(seq, keys, values)``: the runner's filled sequence (``new_tokens`` given, the source can write into it:
    :func:`~.filled_kv.filled_sequence`; keys and values None) or the per-layer lists of
    :func:`rotate_documents` (seq None); the seconds spent land in ``timings`` (``load_s``: waiting on the
    stream, ``rope_s``: the rest)."""
    t0 = time.perf_counter()
    seq = None
    if new_tokens is not None and docs.fill is not None and lm.device.type == "cpu":
        cos, sin = rope_cos_sin(lm.rotary_emb, document_positions(segments, docs).to(lm.device), torch.float32)
        n_new = sum(s.length for s in segments if s.kind in ("link", "question"))
        seq = filled_sequence(lm, docs, cos, sin, prefix, n_new + max(new_tokens, 1))
    doc_k, doc_v = rotate_documents(lm, docs, segments, prefix) if seq is None else (None, None)
    timings.load_s = docs.wait_s
    timings.rope_s = time.perf_counter() - t0 - docs.wait_s
    return seq, doc_k, doc_v


def link(
    lm: LoadedModel,
    prefix: PrefixKV | None,
    docs: list[DocumentKV] | LayeredDocuments,
    link_embeds: torch.Tensor | None,
    question_ids: torch.Tensor,
    *,
    anchored: bool,
    logits_to_keep: int = 1,
    new_tokens: int = 0,
    joined: list[bool] | None = None,
) -> LinkedContext:
    """Build the linked KV cache and the logits after the question.

    Args:
        lm: the model.
        prefix: anchor prefix KV (positions ``0..P-1``), or None for no prefix.
        docs: stored document caches in slot order (keys before RoPE), in memory or streamed by layer.
        link_embeds: ``[K, hidden]`` link-token embeddings shared by every slot, ``[S, K, hidden]`` per
            slot (see :func:`slot_link_embeds`), or None for K=0.
            May require grad (training); the forward then keeps the graph.
        question_ids: ``[question_tokens]`` int64.
        anchored: documents were encoded after the prefix (affects only the reference mask semantics;
            link and question rows are the same).
        logits_to_keep: return logits for this many last new tokens in ``ctx.logits`` (training passes
            question + answer ids and keeps the answer's logits).
        new_tokens: positions to keep free after the question (1 before generating).
        joined: per slot, True where the next slot continues it with no link tokens between (:func:`plan_layout`).
    Returns:
        ``LinkedContext`` whose cache holds ``[prefix][docs][links][question]`` in storage order.
    Raises:
        ValueError, ContextTooLong: see :func:`check_link_inputs`.
    """
    if not isinstance(docs, LayeredDocuments):
        if not docs:
            raise ValueError("at least one document is required to link (a question alone has no documents)")
        docs = LayeredDocuments.from_documents(docs)
    num_links = check_link_inputs(lm, prefix, docs, link_embeds, question_ids, new_tokens, joined)
    timings = Timings()
    p_len = prefix.num_tokens if prefix is not None else 0
    segments = plan_layout(p_len, docs.layout_lengths, num_links, int(question_ids.numel()), joined)

    runner = logits_to_keep == 1 and runs_on_runner(link_embeds)
    seq, doc_k, doc_v = _cached_kv(lm, docs, segments, prefix, new_tokens if runner else None, timings)
    t0 = time.perf_counter()
    slots = segment_link_embeds(link_embeds.to(lm.device, lm.dtype), segments) if num_links else []
    doc_pos = document_positions(segments, docs)
    if runner:
        cache, last, storage_pos = _runner_new_tokens(lm, doc_k, doc_v, segments, slots, question_ids, anchored,
                                                      doc_pos, new_tokens, seq)
        logits = None
    else:
        out, storage_pos = _forward_new_tokens(lm, build_cache(doc_k, doc_v), segments, slots, question_ids,
                                               anchored, logits_to_keep, doc_pos)
        cache, last = out.cache, out.logits[0, -1].float()
        logits = out.logits[0] if logits_to_keep > 1 else None
    timings.link_forward_s = time.perf_counter() - t0
    return LinkedContext(cache=cache, segments=segments, storage_positions=storage_pos,
                         next_position=segments[-1].end, last_logits=last, timings=timings, logits=logits)


def _new_token_inputs(lm: LoadedModel, segments: list[Segment], slot_links: list[torch.Tensor],
                      question_ids: torch.Tensor, anchored: bool, doc_pos: torch.Tensor):
    """Embeddings ``[new, hidden]``, positions ``[new]``, the additive KVLink mask ``[1, 1, new, total]`` and
    storage positions ``[total]`` of the link and question tokens after the cached ones."""
    p_len = segments[0].length if segments[0].kind == "prefix" else 0
    cached_pos = torch.cat([torch.arange(p_len), doc_pos])
    new_pos = torch.cat([_positions(segments, ("link",)), _positions(segments, ("question",))])
    storage_pos = torch.cat([cached_pos, new_pos])
    mask = additive(allowed(segments, anchored, new_pos, storage_pos), lm.dtype).to(lm.device)
    q_embeds = lm.embed_tokens(question_ids.to(lm.device))
    embeds = torch.cat(slot_links + [q_embeds], dim=0)  # [N*K + q, hidden]
    return embeds, new_pos, mask, storage_pos


def _runner_new_tokens(lm: LoadedModel, doc_k: list[torch.Tensor] | None, doc_v: list[torch.Tensor] | None,
                       segments: list[Segment], slot_links: list[torch.Tensor], question_ids: torch.Tensor,
                       anchored: bool, doc_pos: torch.Tensor, new_tokens: int, seq: SequenceKV | None = None):
    """:func:`_forward_new_tokens` through the model runner: the cached KV (per layer ``[kv_heads, tokens,
    head_dim]``) copied once into a sequence (or ``seq``, already holding it:
    :func:`~.filled_kv.filled_sequence`), the new tokens computed after it. Returns the cache (a view of the
    sequence), the ``[vocab]`` logits after the question and the storage positions."""
    embeds, new_pos, mask, storage_pos = _new_token_inputs(lm, segments, slot_links, question_ids, anchored, doc_pos)
    if seq is None:
        n_cached, n_new = int(doc_k[0].shape[1]), int(embeds.shape[0])
        seq = pooled_sequence(lm, n_cached + n_new + max(new_tokens, 1))
        for i, (k, v) in enumerate(zip(doc_k, doc_v)):
            seq.write(i, k, v)
        seq.commit(n_cached)
    last = prefill(lm, seq, embeds, new_pos.to(lm.device), mask[0, 0])
    return cache_view(seq), last, storage_pos


def _forward_new_tokens(lm: LoadedModel, cache, segments: list[Segment], slot_links: list[torch.Tensor],
                        question_ids: torch.Tensor, anchored: bool, logits_to_keep: int, doc_pos: torch.Tensor):
    """One forward over every slot's link tokens and the question, on top of the re-rotated cache,
    under the KVLink mask (:func:`kvlink_rag.linking.mask.allowed`).

    Args:
        slot_links: per link segment ``[K, hidden]`` link embeddings in the compute dtype (empty: K=0).
        doc_pos: ``[cached document tokens]`` int64 layout positions of the cached document slots.
    Returns:
        the model output (its ``cache`` extended) and ``[total_tokens]`` int64 storage positions.
    """
    embeds, new_pos, mask, storage_pos = _new_token_inputs(lm, segments, slot_links, question_ids, anchored, doc_pos)
    out = lm.model(
        inputs_embeds=embeds[None], position_ids=new_pos.to(lm.device)[None], attention_mask=mask,
        cache=cache, use_cache=True, logits_to_keep=logits_to_keep,
    )
    return out, storage_pos
